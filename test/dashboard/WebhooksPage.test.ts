/**
 * The dashboard's webhooks page over HTTP, on a real server, worker and PostgreSQL: an org key lists, adds and
 * removes its own org's webhooks through the same service as the API (what one face makes the other lists); the
 * secret is shown once, on the page that answers the add, and never listed; a private target, an unknown kind or
 * an empty URL is a 400 page that says why, and stores nothing; every form needs the session's CSRF token; another
 * org neither sees nor removes the webhook; an operator sees every org's and must name the org of one it adds; a
 * webhook's row counts its deliveries (jobs of `pgfiber.webhook`) once the worker has made them.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { createServer } from "node:http"
import type { AddressInfo } from "node:net"
import * as Delivery from "../../packages/service/src/stages/webhooks/Delivery.js"
import { call, freshService } from "../http/support.js"
import { waitFor } from "../support/waitFor.js"
import { signIn } from "./signIn.js"
import { withProcessEnv } from "../support/env.js"

/** A receiver that answers 200 to every delivery. */
const receiver = Effect.acquireRelease(
  Effect.promise(() =>
    new Promise<{ url: string; close: () => void }>((resolve) => {
      const server = createServer((req, res) => {
        req.resume()
        req.on("end", () => res.writeHead(200, { "content-type": "text/plain" }).end("thanks"))
      })
      server.listen(0, "127.0.0.1", () =>
        resolve({ url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/hook`, close: () => server.close() }))
    })
  ),
  (r) => Effect.sync(() => r.close())
)

const rowIds = (text: string) => [...text.matchAll(/data-webhook="(\d+)"/g)].map((m) => m[1])

describe("dashboard: webhooks page", () => {
  it.scopedLive("an org manages its own webhooks; the secret once; private targets, bad input and missing CSRF refused with a 4xx", () =>
    Effect.gen(function*() {
      const service = yield* freshService("dashhooks")
      const keyA = yield* service.key({ orgId: "org-a" })
      const keyB = yield* service.key({ orgId: "org-b" })
      const keyOps = yield* service.key({ admin: true, name: "ops" })
      // read at each add and each delivery: no restart between the two settings
      yield* withProcessEnv("PGFIBER_WEBHOOK_ALLOW_PRIVATE", "false")
      const base = yield* service.start({ workerStages: [Delivery.delivery] })
      const a = yield* signIn(base, keyA)
      const b = yield* signIn(base, keyB)
      const ops = yield* signIn(base, keyOps)

      const empty = yield* a.get("/webhooks")
      expect(empty.status).toBe(200)
      expect(empty.text).toContain(`<a href="/dashboard/webhooks" aria-current="page">Webhooks</a>`)
      expect(empty.text).toContain("no webhooks")
      expect(empty.text).toContain(`id="add-webhook"`)

      // refused, with the reason on the page and the form kept; nothing stored
      const privateTarget = yield* a.post("/webhooks", [["url", "http://127.0.0.1:9/hook"], ["kinds", "completed"]])
      expect(privateTarget.status).toBe(400)
      expect(privateTarget.text).toContain("url&#39;s host 127.0.0.1 is a loopback, private or link-local address, which webhooks may not call")
      expect(privateTarget.text).toContain(`value="http://127.0.0.1:9/hook"`)
      for (const [fields, message] of [
        [[["url", "http://10.1.2.3/"]], "is a loopback, private or link-local address"],
        [[["url", "ftp://example.com/"]], "url must be http or https"],
        [[["url", "not a url"]], "url is not a valid absolute URL"],
        [[["url", ""]], "url: give the URL"],
        [[["url", "https://203.0.113.7/hook"], ["kinds", "exploded"]], "unknown event kind(s): exploded"],
        [[["url", "https://203.0.113.7/hook"], ["stages", "a\u0000b"]], "stages: contains a NUL character"],
        [[["url", `https://example.com/${"x".repeat(2100)}`]], "longer than 2000 characters"]
      ] as const) {
        const refused = yield* a.post("/webhooks", fields)
        expect([fields, refused.status, refused.text.includes(message)]).toEqual([fields, 400, true])
      }
      // no CSRF token, or a wrong one: 403, nothing done
      for (const token of [null, "forged"]) {
        expect((yield* a.post("/webhooks", [["url", "https://example.com/"]], token)).status).toBe(403)
      }
      expect((yield* call(base, "GET", "/webhooks", { key: keyA })).json).toEqual({ webhooks: [] })

      // an operator allows private targets (the receiver is on loopback); the secret is on the answer, once
      yield* withProcessEnv("PGFIBER_WEBHOOK_ALLOW_PRIVATE", "true")
      const hook = yield* receiver
      const added = yield* a.post("/webhooks", [["url", hook.url], ["kinds", "completed"], ["kinds", "dead"], ["stages", "echo"]])
      expect(added.status).toBe(201)
      expect(added.headers.get("cache-control")).toBe("no-store")
      const secret = /<pre id="webhook-secret">(whsec_[^<]+)<\/pre>/.exec(added.text)?.[1] ?? ""
      expect(secret).toMatch(/^whsec_/)
      const listedByApi = (yield* call(base, "GET", "/webhooks", { key: keyA })).json.webhooks
      expect(listedByApi).toMatchObject([{ orgId: "org-a", url: hook.url, kinds: ["completed", "dead"], stages: ["echo"] }])
      const id: string = listedByApi[0].id
      expect(added.text).toContain(`Webhook ${id} added`)

      // listed without its secret, with a way to its deliveries
      const listed = yield* a.get("/webhooks")
      expect(rowIds(listed.text)).toEqual([id])
      expect(listed.text).not.toContain(secret)
      expect(listed.text).not.toContain("whsec_")
      expect(listed.text).toContain(`data-field="kinds">completed, dead<`)
      // one the API made shows on the page too
      const byApi = yield* call(base, "POST", "/webhooks", { key: keyB, body: { url: hook.url } })
      expect(byApi.status).toBe(201)

      // another org sees only its own, and cannot remove org A's (not even by posting the confirmation)
      expect(rowIds((yield* b.get("/webhooks")).text)).toEqual([byApi.json.id])
      for (const fields of [[], [["confirm", "yes"]]] as const) {
        const foreign = yield* b.post(`/webhooks/${id}/remove`, fields)
        expect([foreign.status, foreign.text.includes(`Webhook ${id} was not found.`)]).toEqual([404, true])
      }
      expect((yield* b.post("/webhooks/abc/remove", [["confirm", "yes"]])).status).toBe(404)
      expect((yield* call(base, "GET", "/webhooks", { key: keyA })).json.webhooks.map((w: { id: string }) => w.id)).toEqual([id])

      // an operator sees every org's (or one org's), and must name the org of one it adds
      const all = yield* ops.get("/webhooks")
      expect(rowIds(all.text).sort()).toEqual([id, byApi.json.id].sort())
      expect(all.text).toContain("<td>org-a</td>")
      expect(rowIds((yield* ops.get("/webhooks?org=org-b")).text)).toEqual([byApi.json.id])
      const noOrg = yield* ops.post("/webhooks", [["url", hook.url]])
      expect([noOrg.status, noOrg.text.includes("org: an operator names the org")]).toEqual([400, true])

      // the deliveries: org A's echo job completes, the worker delivers the event, the row counts it
      expect((yield* call(base, "POST", "/jobs", { key: keyA, body: { stage: "echo", payload: { n: 1 } } })).status).toBe(201)
      const delivered = yield* waitFor("org A's webhook to count one delivered event", Effect.map(a.get("/webhooks"), (p) =>
        p.text.includes(`<span data-field="delivered">1</span> delivered`) ? p : undefined))
      expect(delivered.text).toContain(`href="/dashboard/jobs?stage=pgfiber.webhook&amp;payload=%7B%22webhookId%22%3A%22${id}%22%7D"`)
      // that link's list is the delivery, for the org's key
      const deliveries = yield* a.get(`/jobs?stage=pgfiber.webhook&payload=${encodeURIComponent(JSON.stringify({ webhookId: id }))}`)
      expect(deliveries.status).toBe(200)
      expect([...deliveries.text.matchAll(/data-job="(\d+)"/g)].length).toBe(1)

      // removed by its org after a confirmation; without the CSRF token, not
      expect((yield* a.post(`/webhooks/${id}/remove`, [["confirm", "yes"]], null)).status).toBe(403)
      const confirm = yield* a.post(`/webhooks/${id}/remove`, [])
      expect(confirm.status).toBe(200)
      expect(confirm.text).toContain(`Remove webhook ${id} (${hook.url}, org org-a)?`)
      expect((yield* call(base, "GET", "/webhooks", { key: keyA })).json.webhooks.length).toBe(1)
      const removed = yield* a.post(`/webhooks/${id}/remove`, [["confirm", "yes"]])
      expect(removed.status).toBe(303)
      expect(removed.headers.get("location")).toContain("/dashboard/webhooks?notice=")
      expect((yield* call(base, "GET", "/webhooks", { key: keyA })).json).toEqual({ webhooks: [] })
      expect((yield* a.get("/webhooks")).text).toContain("no webhooks")
      expect((yield* a.post(`/webhooks/${id}/remove`, [["confirm", "yes"]])).status).toBe(404)
    }), { timeout: 180_000 })
})
