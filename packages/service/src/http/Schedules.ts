/**
 * The schedules group: a tenant manages its own org's recurring jobs. Every call runs inside `Db.withOrg` for
 * the key's org, so row-level security (migrations/0009) keeps orgs apart: another org's schedule, and the
 * system schedules (no org: the documents sweep, housekeeping), are simply not there (404). A schedule made
 * here always belongs to the key's org, and its stage and payload pass the same checks as `POST /jobs` (a
 * public stage only).
 */
import { HttpApiBuilder } from "@effect/platform"
import { Effect } from "effect"
import * as Db from "pgfiber/internal/layers/Db.js"
import * as PgSchedules from "pgfiber/internal/queue/PgSchedules.js"
import * as Queue from "pgfiber/internal/queue/Queue.js"
import * as Schedules from "pgfiber/internal/queue/Schedules.js"
import * as Scheduler from "pgfiber/internal/runtime/Scheduler.js"
import * as Submit from "pgfiber/internal/runtime/Submit.js"
import { Api, BadRequest, CurrentOrg, NotFound } from "./Api.js"
import { dbFailure } from "./Jobs.js"

export const scheduleView = ({ ...s }: Schedules.Schedule) => s

export const layer = HttpApiBuilder.group(Api, "schedules", (handlers) =>
  Effect.gen(function*() {
    const db = yield* Db.Db
    const stages = yield* Submit.KnownStages
    const schedules = yield* Schedules.make(yield* PgSchedules.makeStore).pipe(Effect.provideService(Queue.Queue, yield* Queue.Queue))

    /** The request's org: its key, and a transaction under the tenant role around the work. */
    const asOrg = <A, E>(work: (orgId: string) => Effect.Effect<A, E>) =>
      Effect.flatMap(CurrentOrg, (principal) => db.withOrg(principal.orgId, work(principal.orgId)))
    const notFound = (name: string) => new NotFound({ message: `schedule ${name} not found` })
    const badRequest = (e: { readonly message: string; readonly field: string }) => Effect.fail(new BadRequest({ message: e.message, field: e.field }))

    return handlers
      .handle("listSchedules", () =>
        asOrg((orgId) => schedules.list({ orgId })).pipe(
          Effect.map((all) => ({ schedules: all.map(scheduleView) })),
          Effect.catchTag("DbError", dbFailure)
        ))
      .handle("getSchedule", ({ path }) =>
        asOrg((orgId) => schedules.get({ name: path.name, orgId })).pipe(
          Effect.flatMap((s) => (s === null ? Effect.fail(notFound(path.name)) : Effect.succeed(scheduleView(s)))),
          Effect.catchTag("DbError", dbFailure)
        ))
      .handle("putSchedule", ({ path, payload: body }) =>
        asOrg((orgId) =>
          Effect.flatMap(
            Scheduler.prepare(stages, { ...body, name: path.name, orgId }, "tenant"),
            (spec) => schedules.put(spec)
          )
        ).pipe(
          Effect.map(scheduleView),
          Effect.tap((s) => Effect.logInfo("schedule saved").pipe(Effect.annotateLogs({ schedule: s.name, org: s.orgId }))),
          Effect.catchTags({ InvalidJob: badRequest, InvalidSchedule: badRequest, DbError: dbFailure })
        ))
      .handle("removeSchedule", ({ path }) =>
        asOrg((orgId) => schedules.remove({ name: path.name, orgId })).pipe(
          Effect.as({ name: path.name, removed: true as const }),
          Effect.catchTags({ ScheduleNotFound: () => Effect.fail(notFound(path.name)), DbError: dbFailure })
        ))
      .handle("enableSchedule", ({ path }) =>
        asOrg((orgId) => schedules.setEnabled({ name: path.name, orgId }, true)).pipe(
          Effect.map(scheduleView),
          Effect.catchTags({ ScheduleNotFound: () => Effect.fail(notFound(path.name)), DbError: dbFailure })
        ))
      .handle("disableSchedule", ({ path }) =>
        asOrg((orgId) => schedules.setEnabled({ name: path.name, orgId }, false)).pipe(
          Effect.map(scheduleView),
          Effect.catchTags({ ScheduleNotFound: () => Effect.fail(notFound(path.name)), DbError: dbFailure })
        ))
      .handle("runScheduleNow", ({ path }) =>
        asOrg((orgId) => schedules.runNow({ name: path.name, orgId })).pipe(
          Effect.catchTags({
            ScheduleNotFound: () => Effect.fail(notFound(path.name)),
            InvalidJob: badRequest,
            DbError: dbFailure,
            QueueError: dbFailure
          })
        ))
  }))
