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

const list = (text: string | undefined) =>
  text === undefined ? undefined : text.split(",").map((s) => s.trim()).filter((s) => s.length > 0)

/** One SSE message: the event's id, its kind as the event name, the event as JSON on one line. */
export const sseMessage = (e: EventLog.LoggedEvent) =>
  `id: ${e.id}\nevent: ${e.kind}\ndata: ${JSON.stringify(e)}\n\n`

/**
 * A stream's encoder: each event exactly as `sseMessage` writes it (the same fields, order and text), with what
 * the events of one log row share serialized once for the row, not per event: their instant, stage and org, and
 * a claim's worker (the same objects: EventLog.unnestRow). The instant was most of an event's cost: `JSON.stringify`
 * of a Date is its ISO text, ~3 µs; with it, the serving process spent ~12 µs per event (a bulk drain's 3 events
 * a job, docs/benchmarks.md "Following the event log over SSE").
 */
export const sseEncoder = (): (e: EventLog.LoggedEvent) => string => {
  const once = <A>() => {
    let last: A | undefined, primed = false, text = ""
    return (value: A) => {
      if (!primed || value !== last) {
        last = value
        primed = true
        text = JSON.stringify(value)
      }
      return text
    }
  }
  const at = once<Date>(), stage = once<string>(), org = once<string | null>(), data = once<EventLog.LoggedEvent["data"]>()
  const kinds = new Map(EventLog.kinds.map((k) => [k as string, JSON.stringify(k)]))
  // ids are digits and an attempt a whole number, as the log makes them: written as they are (JSON.stringify
  // of each cost ~0.3 µs on this machine); anything else goes through JSON.stringify, so the text stays exact
  const digits = (s: string) => (/^\d{1,20}$/.test(s) ? `"${s}"` : JSON.stringify(s))
  return (e) =>
    `id: ${e.id}\nevent: ${e.kind}\ndata: {"id":${digits(e.id)},"kind":${kinds.get(e.kind) ?? JSON.stringify(e.kind)},"jobId":${digits(e.jobId)},` +
    `"stage":${stage(e.stage)},"orgId":${org(e.orgId)},"subjectId":${e.subjectId === null ? "null" : JSON.stringify(e.subjectId)},` +
    `"attempt":${Number.isSafeInteger(e.attempt) ? e.attempt : JSON.stringify(e.attempt)},"data":${data(e.data)},"at":${at(e.at)}}\n\n`
}

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
        const encode = sseEncoder()
        const events = feed.follow(filter, { from }).pipe(
          // one write per batch the feed hands over, not one per event: each write is a chunk on the wire and a
          // call into the socket, which cost the serving process more than the events themselves
          // (an array's join copies once; Chunk.join concatenates string by string)
          Stream.mapChunks((chunk) => Chunk.of(Chunk.toReadonlyArray(chunk).map(encode).join(""))),
          Stream.catchAll((e) =>
            Stream.fromEffect(Effect.logWarning("event stream ended", e.message)).pipe(
              // the client reconnects with its Last-Event-ID
              Stream.as("event: error\ndata: {\"message\":\"the event log could not be read; reconnect\"}\n\n")
            ))
        )
        return HttpServerResponse.stream(
          Stream.merge(
            Stream.make(": connected\n\n").pipe(Stream.concat(events)),
            // a comment now and then keeps proxies from closing an idle stream, and finds closed ones
            Stream.fromSchedule(Schedule.spaced("15 seconds")).pipe(Stream.map(() => ": ping\n\n")),
            { haltStrategy: "left" }
          ).pipe(Stream.encodeText),
          {
            contentType: "text/event-stream",
            headers: { "cache-control": "no-store", "x-accel-buffering": "no", "x-content-type-options": "nosniff" }
          }
        )
      }))
  }))
