/**
 * `pgfiber events [--follow] [--stage S] [--org O] [--job ID] [--kind K,…] [--after ID | --from beginning] [--json]`:
 * the event log as an operator sees it (every org unless `--org`). Without `--follow` it prints what is kept
 * (from the beginning, or after an event id) and exits; with it, it keeps printing as any process's jobs move,
 * woken by the same NOTIFY the workers hear (one LISTEN connection), starting from now unless told otherwise.
 * `--json` prints one event per line (NDJSON), so `pgfiber events --follow --json | jq` works.
 */
import { Command, Options } from "@effect/cli"
import { Effect, Layer, Option, Stream } from "effect"
import * as EventLog from "pgfiber/internal/queue/EventLog.js"
import * as EventFeed from "pgfiber/internal/runtime/EventFeed.js"
import * as Env from "./Env.js"
import { UsageError } from "./Failure.js"
import { operator } from "./Jobs.js"
import * as Output from "./Output.js"

const optionalText = (name: string, description: string) =>
  Options.text(name).pipe(Options.optional, Options.withDescription(description))

/** One event as a line: id, time, kind, stage, job, attempt, org, and its data. */
export const eventLine = (e: EventLog.LoggedEvent) =>
  [e.id, e.at.toISOString(), e.kind.padEnd(11), e.stage, `job ${e.jobId}`, `attempt ${e.attempt}`, e.orgId ?? "-",
    e.data === null ? "" : JSON.stringify(e.data)].join("  ")

export const events = Command.make(
  "events",
  {
    follow: Options.boolean("follow").pipe(Options.withAlias("f"), Options.withDescription("Keep printing new events until interrupted")),
    stage: optionalText("stage", "Only these stages (comma-separated)"),
    org: optionalText("org", "Only this org's events"),
    job: optionalText("job", "Only this job's events"),
    subject: optionalText("subject", "Only the events of jobs on this subject"),
    kind: optionalText("kind", `Only these kinds (comma-separated): ${EventLog.kinds.join(", ")}`),
    after: optionalText("after", "Start after this event id (what SSE clients send as Last-Event-ID)"),
    from: Options.choice("from", ["now", "beginning"]).pipe(
      Options.optional,
      Options.withDescription("Where to start without --after: beginning (everything kept; the default without --follow) or now (the default with it)")
    ),
    json: Options.boolean("json").pipe(Options.withDescription("Print each event as one line of JSON"))
  },
  (o) =>
    operator(() =>
      Effect.gen(function*() {
        const kinds = Option.map(o.kind, Env.parseList)
        const unknown = Option.getOrElse(kinds, () => []).filter((k) => !(EventLog.kinds as ReadonlyArray<string>).includes(k))
        if (unknown.length > 0) {
          return yield* new UsageError({ message: `unknown event kind(s): ${unknown.join(", ")}; known: ${EventLog.kinds.join(", ")}` })
        }
        const after = Option.getOrUndefined(o.after)
        if (after !== undefined && !/^[0-9]{1,18}$/.test(after)) return yield* new UsageError({ message: "--after takes an event id (digits)" })
        const job = Option.getOrUndefined(o.job)
        if (job !== undefined && !/^[0-9]{1,18}$/.test(job)) return yield* new UsageError({ message: "--job takes a job id (digits)" })
        const filter: EventLog.Filter = {
          org: Option.getOrUndefined(o.org),
          stages: Option.getOrUndefined(Option.map(o.stage, Env.parseList)),
          kinds: Option.getOrUndefined(kinds) as ReadonlyArray<EventLog.Kind> | undefined,
          jobId: job,
          subjectId: Option.getOrUndefined(o.subject)
        }
        const print = (e: EventLog.LoggedEvent) => Output.line(o.json ? JSON.stringify(e) : eventLine(e))
        const from = Option.getOrElse(o.from, () => (o.follow ? "now" : "beginning"))
        const start = after !== undefined ? { after } : from
        if (o.follow) {
          // on stderr, once the cursor is taken: every event logged after this line is printed
          const onFollowing = Output.note("following the event log (Ctrl-C to stop)")
          return yield* EventFeed.follow(filter, { from: start, onFollowing }).pipe(
            Stream.runForEach(print),
            Effect.provide(EventFeed.layer.pipe(Layer.provideMerge(EventLog.layer)))
          )
        }
        // what is kept, page by page, then exit
        const log = yield* EventLog.make
        let cursor = start === "now" ? yield* log.now : start === "beginning" ? EventLog.beginning : yield* log.after(start.after, filter)
        for (;;) {
          const page = yield* log.read(cursor, filter, 1000)
          yield* Effect.forEach(page.events, print, { discard: true })
          cursor = page.next
          if (!page.full) return
        }
      })
    )
).pipe(Command.withDescription("Print job events from the event log (every process's jobs); --follow to keep printing"))
