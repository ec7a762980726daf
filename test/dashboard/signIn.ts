/**
 * A dashboard session over plain HTTP, for the pages' tests: signs in with a key, keeps the cookie, reads the CSRF
 * token from the first page, and gets or posts forms as a browser would (redirects not followed).
 */
import { Effect } from "effect"
import { expect } from "vitest"

export interface Page {
  readonly status: number
  readonly text: string
  readonly headers: Headers
}

/** A signed-in browser, as far as the server can tell: its cookie, and the CSRF token its pages carry. */
export const signIn = (base: string, key: string, firstPage = "/webhooks") =>
  Effect.promise(async () => {
    const response = await fetch(`${base}/dashboard/login`, {
      method: "POST",
      redirect: "manual",
      headers: { "content-type": "application/x-www-form-urlencoded" },
      body: new URLSearchParams({ key }).toString()
    })
    expect(response.status).toBe(303)
    const cookie = (response.headers.get("set-cookie") ?? "").split(";")[0]!
    const get = (path: string) =>
      fetch(`${base}/dashboard${path}`, { headers: { cookie }, redirect: "manual" }).then(async (r): Promise<Page> => ({
        status: r.status, text: await r.text(), headers: r.headers
      }))
    const first = await get(firstPage)
    const csrf = /name="_csrf" value="([^"]+)"/.exec(first.text)?.[1] ?? ""
    expect(csrf).not.toBe("")
    /** Posts a form; `_csrf` is the session's unless the fields name one (or `null` leaves it out). */
    const post = (path: string, fields: ReadonlyArray<readonly [string, string]>, token: string | null = csrf) =>
      fetch(`${base}/dashboard${path}`, {
        method: "POST",
        redirect: "manual",
        headers: { cookie, "content-type": "application/x-www-form-urlencoded" },
        body: new URLSearchParams([...(token === null ? [] : [["_csrf", token] as [string, string]]), ...fields.map(([k, v]): [string, string] => [k, v])]).toString()
      }).then(async (r): Promise<Page> => ({ status: r.status, text: await r.text(), headers: r.headers }))
    return { get: (path: string) => Effect.promise(() => get(path)), post: (...args: Parameters<typeof post>) => Effect.promise(() => post(...args)) }
  })

