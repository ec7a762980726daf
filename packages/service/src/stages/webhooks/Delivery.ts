/**
 * Stage `pgfiber.webhook`: one delivery of one event to one webhook, enqueued by the event log's trigger in the
 * transaction that logged the event (migration 0020), so a delivery is at least once, survives restarts, is
 * retried on this stage's backoff and dead-lettered like any job (and shows on the dashboard as one).
 *
 * A delivery is a POST of `{ type: "job.<kind>", timestamp, data: <the event> }`, signed per the Standard
 * Webhooks spec (`webhook-id` the same for every attempt of one delivery, `webhook-timestamp`,
 * `webhook-signature`, by the `standardwebhooks` library). 2xx completes it (its output keeps the status and
 * the first 200 characters of the answer, nothing more); a redirect is not followed and dead-letters it, as a 410
 * does; a 429 waits for its Retry-After; anything else (5xx, 4xx, no answer in time, a refused target) retries.
 * A webhook removed since is not called; an event pruned since dead-letters the delivery.
 */
import { Config, Duration, Effect, Option, Schema } from "effect"
import { Webhook } from "standardwebhooks"
import { Permanent, RateLimited, Transient } from "pgfiber/internal/JobError.js"
import * as Db from "pgfiber/internal/layers/Db.js"
import * as RetryAfter from "pgfiber/internal/layers/RetryAfter.js"
import * as Stage from "pgfiber/internal/runtime/Stage.js"
import * as Target from "./Target.js"
import * as WebhooksSql from "./WebhooksSql.js"

export const stageName = "pgfiber.webhook"

export const Payload = Schema.Struct({ webhookId: Schema.String, eventId: Schema.String })

export const Output = Schema.Struct({
  status: Schema.Number,
  /** The answer's first 200 characters; the rest is not kept. */
  excerpt: Schema.String,
  skipped: Schema.optional(Schema.String)
})

export const timeoutConfig = Config.integer("PGFIBER_WEBHOOK_TIMEOUT_MS").pipe(
  Config.validate({ message: "must be 100 to 120000 ms", validation: (n) => n >= 100 && n <= 120_000 }),
  Config.withDefault(10_000)
)

/** Reads at most `max` characters of a body, then lets the rest go. */
const excerptOf = async (response: Response, max = 200) => {
  if (response.body === null) return ""
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader()
  let text = ""
  try {
    while (text.length < max) {
      const { done, value } = await reader.read()
      if (done) break
      text += value
    }
  } finally {
    void reader.cancel().catch(() => undefined)
  }
  return text.slice(0, max)
}

export const delivery = Stage.make({
  name: stageName,
  visibility: "internal",
  payload: Payload,
  output: Output,
  concurrency: 8,
  maxAttempts: 10,
  handler: (payload, job) =>
    Effect.gen(function*() {
      const db = yield* Db.Db
      const allowPrivate = yield* Effect.orDie(Target.allowPrivateConfig)
      const timeoutMs = yield* Effect.orDie(timeoutConfig)
      const [parts] = yield* Db.asOwner(db.run((sql) => WebhooksSql.deliveryParts(sql, payload.webhookId, payload.eventId))).pipe(
        Effect.mapError((e) => new Transient({ message: e.message }))
      )
      const webhook = parts?.webhook as { id: string; orgId: string; url: string; secret: string } | null
      const event = parts?.event as { id: string; kind: string; orgId: string | null; at: string } | null
      if (webhook === null || webhook === undefined) return { status: 0, excerpt: "", skipped: "the webhook was removed" }
      // a delivery belongs to the webhook's org, and carries only that org's events
      if (webhook.orgId !== job.orgId || (event !== null && event !== undefined && event.orgId !== webhook.orgId)) {
        return yield* new Permanent({ message: "the delivery does not belong to the webhook's org" })
      }
      if (event === null || event === undefined) return yield* new Permanent({ message: `event ${payload.eventId} is no longer kept` })
      const url = yield* Target.check(webhook.url, allowPrivate).pipe(Effect.mapError((e) => new Transient({ message: e.message })))
      const body = JSON.stringify({ type: `job.${event.kind}`, timestamp: event.at, data: event })
      const messageId = `msg_${webhook.id}_${event.id}`
      const now = new Date()
      const signature = new Webhook(webhook.secret).sign(messageId, now, body)
      const response = yield* Effect.tryPromise({
        try: (signal) =>
          fetch(url, {
            method: "POST",
            body,
            redirect: "manual",
            signal: AbortSignal.any([signal, AbortSignal.timeout(timeoutMs)]),
            headers: {
              "content-type": "application/json",
              "user-agent": "pgfiber-webhooks",
              "webhook-id": messageId,
              "webhook-timestamp": String(Math.floor(now.getTime() / 1000)),
              "webhook-signature": signature
            }
          }),
        catch: (e) => new Transient({ message: `no answer from the webhook: ${e instanceof Error ? e.message : String(e)}` })
      })
      const excerpt = yield* Effect.promise(() => excerptOf(response).catch(() => ""))
      const status = response.status
      if (status >= 200 && status < 300) return { status, excerpt }
      if (status >= 300 && status < 400) return yield* new Permanent({ message: `the webhook answered ${status} (a redirect, not followed)` })
      if (status === 410) return yield* new Permanent({ message: "the webhook answered 410 Gone" })
      if (status === 429) {
        const wait = RetryAfter.parse(response.headers.get("retry-after") ?? undefined, Date.now())
        return yield* new RateLimited({ message: "the webhook answered 429", retryAfter: Option.getOrElse(wait, () => Duration.seconds(30)) })
      }
      return yield* new Transient({ message: `the webhook answered ${status}: ${excerpt.slice(0, 100)}` })
    })
})
