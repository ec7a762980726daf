/**
 * Webhooks on a real server, worker and PostgreSQL, delivering to a receiver in this test (a local HTTP server):
 * it verifies every delivery's signature with the `standardwebhooks` library, answers 500 to the first few and
 * 200 after; every event the webhook asked for is delivered at least once (the failed ones again, as retried
 * jobs), and none of another org's. A target on a loopback, private or link-local address is refused with a 400
 * unless the operator allows them; another org cannot see or remove a webhook.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { createServer } from "node:http"
import type { AddressInfo } from "node:net"
import { Webhook } from "standardwebhooks"
import * as Delivery from "../../packages/service/src/stages/webhooks/Delivery.js"
import { rawSql } from "../support/pg.js"
import { waitFor } from "../support/waitFor.js"
import { call, freshService } from "./support.js"
import { withProcessEnv } from "../support/env.js"

interface Received {
  readonly id: string
  readonly verified: boolean
  readonly status: number
  readonly body: { readonly type: string; readonly data: { readonly id: string; readonly jobId: string; readonly orgId: string; readonly kind: string } }
}

/** A receiver that answers 500 to its first `failFirst` requests, then 200; it checks each signature with `secret()`. */
const receiver = (failFirst: number, secret: () => string) =>
  Effect.acquireRelease(
    Effect.promise(() =>
      new Promise<{ url: string; received: Array<Received>; close: () => void }>((resolve) => {
        const received: Array<Received> = []
        const server = createServer((req, res) => {
          let body = ""
          req.on("data", (d) => (body += d))
          req.on("end", () => {
            let verified = false
            try {
              new Webhook(secret()).verify(body, req.headers as Record<string, string>)
              verified = true
            } catch {
              verified = false
            }
            const status = received.length < failFirst ? 500 : 200
            received.push({ id: String(req.headers["webhook-id"]), verified, status, body: JSON.parse(body) })
            res.writeHead(status, { "content-type": "text/plain" }).end(status === 200 ? "thanks" : "try again later")
          })
        })
        server.listen(0, "127.0.0.1", () =>
          resolve({ url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/hook`, received, close: () => server.close() }))
      })
    ),
    (r) => Effect.sync(() => r.close())
  )

describe("webhooks", () => {
  it.scopedLive("signed deliveries, retried through 500s until 200; only the org's own events; private targets refused", () =>
    Effect.gen(function*() {
      const fixture = yield* freshService("hooks")
      const schema = fixture.schema
      const a = yield* fixture.key({ orgId: "org-a" })
      const b = yield* fixture.key({ orgId: "org-b" })
      const service = fixture.start({ workerStages: [Delivery.delivery] })

      // as deployed: private targets refused, 400 with a JSON body, nothing stored
      yield* Effect.scoped(Effect.gen(function*() {
        yield* withProcessEnv("PGFIBER_WEBHOOK_ALLOW_PRIVATE", "false")
        const base = yield* service
        for (const url of ["http://127.0.0.1:9/hook", "http://localhost/hook", "http://10.1.2.3/", "http://169.254.169.254/latest", "http://[::1]/", "http://[::ffff:127.0.0.1]/", "http://192.168.0.10/", "ftp://example.com/", "not a url", "http://user:pw@example.com/"]) {
          const refused = yield* call(base, "POST", "/webhooks", { key: a, body: { url } })
          expect([url, refused.status, refused.json?._tag, refused.json?.field]).toEqual([url, 400, "BadRequest", "url"])
        }
        const badKind = yield* call(base, "POST", "/webhooks", { key: a, body: { url: "http://10.1.2.3/", kinds: ["exploded"] } })
        expect(badKind.status).toBe(400)
        expect((yield* call(base, "GET", "/webhooks", { key: a })).json).toEqual({ webhooks: [] })
      }))

      // an operator allows private targets (this receiver is on loopback)
      yield* withProcessEnv("PGFIBER_WEBHOOK_ALLOW_PRIVATE", "true")
      let secret = ""
      const hook = yield* receiver(3, () => secret)
      const base = yield* service
      const created = yield* call(base, "POST", "/webhooks", { key: a, body: { url: hook.url, kinds: ["completed", "dead"], stages: ["echo"] } })
      expect(created.status).toBe(201)
      expect(created.json).toMatchObject({ orgId: "org-a", url: hook.url, kinds: ["completed", "dead"], stages: ["echo"] })
      secret = created.json.secret
      expect(secret).toMatch(/^whsec_/)
      // listed without its secret; another org neither sees nor removes it
      const listed = yield* call(base, "GET", "/webhooks", { key: a })
      expect(listed.json.webhooks.map((w: any) => [w.id, w.secret])).toEqual([[created.json.id, undefined]])
      expect((yield* call(base, "GET", "/webhooks", { key: b })).json).toEqual({ webhooks: [] })
      const foreign = yield* call(base, "DELETE", `/webhooks/${created.json.id}`, { key: b })
      expect([foreign.status, foreign.json._tag]).toEqual([404, "NotFound"])

      const mine: Array<string> = []
      for (let n = 0; n < 6; n++) {
        const job = yield* call(base, "POST", "/jobs", { key: a, body: { stage: "echo", payload: { n, fail: n === 5 } } })
        mine.push(job.json.id)
        expect((yield* call(base, "POST", "/jobs", { key: b, body: { stage: "echo", payload: { n } } })).status).toBe(201)
      }
      const delivered = (jobId: string) => hook.received.some((r) => r.status === 200 && r.body.data.jobId === jobId)
      yield* waitFor("every event of org A's jobs delivered with a 200", Effect.sync(() => mine.every(delivered)))

      expect(hook.received.every((r) => r.verified)).toBe(true)
      expect(hook.received.every((r) => r.body.data.orgId === "org-a")).toBe(true)
      expect(hook.received.filter((r) => r.status === 500).length).toBe(3)
      // each wanted event delivered, the refused ones again with the same webhook-id (one message, retried)
      const ok = hook.received.filter((r) => r.status === 200)
      expect(new Set(ok.map((r) => r.body.data.jobId))).toEqual(new Set(mine))
      expect(ok.map((r) => `${r.body.data.jobId}:${r.body.type}`).sort()).toEqual(
        mine.map((id, n) => `${id}:${n === 5 ? "job.dead" : "job.completed"}`).sort()
      )
      for (const failed of hook.received.filter((r) => r.status === 500)) {
        expect(ok.some((r) => r.id === failed.id)).toBe(true)
      }
      // the deliveries are jobs: the retried ones spent attempts, all completed with a short excerpt kept
      const sql = rawSql(schema)
      yield* Effect.addFinalizer(() => Effect.promise(() => sql.end({ timeout: 5 })))
      const deliveries = yield* waitFor("the delivery jobs to be archived", Effect.promise(async () => {
        const rows = await sql<Array<{ status: string; attempts: number; output: { status: number; excerpt: string } }>>`
          select status, attempts, output from jobs_archive where stage = 'pgfiber.webhook'`
        return rows.length === ok.length ? rows : undefined
      }))
      expect(deliveries.every((d) => d.status === "completed" && d.output.status === 200 && d.output.excerpt === "thanks")).toBe(true)
      expect(deliveries.filter((d) => d.attempts > 0).length).toBeGreaterThan(0)

      // removed: no more deliveries are made for it
      expect((yield* call(base, "DELETE", `/webhooks/${created.json.id}`, { key: a })).json).toEqual({ id: created.json.id, removed: true })
      expect((yield* call(base, "GET", "/webhooks", { key: a })).json).toEqual({ webhooks: [] })
    }), { timeout: 180_000 })
})
