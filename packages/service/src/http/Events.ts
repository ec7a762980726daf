/**
 * `GET /events`: the key's org's job events as Server-Sent Events, from the event log (runtime/EventFeed.ts), so
 * a client sees every process's jobs, and one that reconnects with `Last-Event-ID` (or `?lastEventId=`) gets
 * everything it missed that is still kept, also from another server or after a restart: the id is the event's
 * place in the shared log, not this process's. The org is the key's, always: the filter is never the client's
 * to widen, and an id of another org's event resumes from now, as an unknown one does.
 */
import { HttpApiBuilder, HttpServerRequest, HttpServerResponse } from "@effect/platform"
import { Chunk, Effect, Schedule, Stream } from "effect"
import * as EventLog from "pgfiber/internal/queue/EventLog.js"
import * as EventFeed from "pgfiber/internal/runtime/EventFeed.js"
import { Api, BadRequest, CurrentOrg } from "./Api.js"
import { sseWriter } from "./SseWriter.js"

const utf8 = (text: string) => new TextEncoder().encode(text)
const connected = utf8(": connected\n\n")
const ping = utf8(": ping\n\n")
const readFailed = utf8("event: error\ndata: {\"message\":\"the event log could not be read; reconnect\"}\n\n")

const list = (text: string | undefined) =>
  text === undefined ? undefined : text.split(",").map((s) => s.trim()).filter((s) => s.length > 0)

/**
 * One SSE message: the event's id, its kind as the event name, the event as JSON on one line. What the stream
 * writes, as UTF-8; the stream's own writer (SseWriter.ts) makes the same bytes at less cost.
 */
export const sseMessage = (e: EventLog.LoggedEvent) =>
  `id: ${e.id}\nevent: ${e.kind}\ndata: ${JSON.stringify(e)}\n\n`

export const layer = HttpApiBuilder.group(Api, "events", (handlers) =>
  Effect.gen(function*() {
    const feed = yield* EventFeed.EventFeed
    return handlers.handleRaw("events", ({ urlParams }) =>
      Effect.gen(function*() {
        const principal = yield* CurrentOrg
        const request = yield* HttpServerRequest.HttpServerRequest
        const kinds = list(urlParams.kind)
        const unknown = kinds?.filter((k) => !(EventLog.kinds as ReadonlyArray<string>).includes(k)) ?? []
        if (unknown.length > 0) {
          return yield* new BadRequest({ message: `unknown event kind(s): ${unknown.join(", ")}; known: ${EventLog.kinds.join(", ")}`, field: "kind" })
        }
        if (urlParams.job !== undefined && !/^[0-9]{1,18}$/.test(urlParams.job)) {
          return yield* new BadRequest({ message: "job must be a job id (digits)", field: "job" })
        }
        const last = (request.headers["last-event-id"] ?? urlParams.lastEventId)?.trim()
        if (last !== undefined && last !== "" && !/^[0-9]{1,18}$/.test(last)) {
          return yield* new BadRequest({ message: "Last-Event-ID must be an event id (digits)", field: "Last-Event-ID" })
        }
        const filter: EventLog.Filter = {
          org: principal.orgId,
          stages: list(urlParams.stage),
          kinds: kinds as ReadonlyArray<EventLog.Kind> | undefined,
          jobId: urlParams.job,
          subjectId: urlParams.subject
        }
        const from: EventFeed.FollowOptions["from"] = last !== undefined && last !== ""
          ? { after: last }
          : urlParams.from ?? "now"
        const write = sseWriter()
        const events = feed.follow(filter, { from }).pipe(
          // one write per batch the feed hands over, not one per event: each write is a chunk on the wire and a
          // call into the socket, which cost the serving process more than the events themselves
          Stream.mapChunks((chunk) => Chunk.of(write(Chunk.toReadonlyArray(chunk)))),
          Stream.catchAll((e) =>
            Stream.fromEffect(Effect.logWarning("event stream ended", e.message)).pipe(
              // the client reconnects with its Last-Event-ID
              Stream.as(readFailed)
            ))
        )
        return HttpServerResponse.stream(
          Stream.merge(
            Stream.make(connected).pipe(Stream.concat(events)),
            // a comment now and then keeps proxies from closing an idle stream, and finds closed ones
            Stream.fromSchedule(Schedule.spaced("15 seconds")).pipe(Stream.as(ping)),
            { haltStrategy: "left" }
          ),
          {
            contentType: "text/event-stream",
            headers: { "cache-control": "no-store", "x-accel-buffering": "no", "x-content-type-options": "nosniff" }
          }
        )
      }))
  }))
