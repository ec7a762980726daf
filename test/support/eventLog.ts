/**
 * Reading the event log in a test: one pass over every full page, or on until nothing is held back. The reader's
 * horizon is the cluster's oldest running transaction, so another test file's may hold events back a while.
 */
import { type Context, Duration, Effect } from "effect"
import type * as EventLog from "../../packages/pgfiber/src/queue/EventLog.js"
import { deadline, waitFor } from "./waitFor.js"

type Log = Context.Tag.Service<EventLog.EventLog>

/** Everything readable now from `cursor`, page by page (`limit` events a page), in one pass; whether events are held back. */
export const readPages = (log: Log, cursor: EventLog.Cursor, filter: EventLog.Filter = {}, limit = 3) =>
  Effect.gen(function*() {
    const events: Array<EventLog.LoggedEvent> = []
    let page = yield* log.read(cursor, filter, limit)
    events.push(...page.events)
    while (page.full) {
      page = yield* log.read(page.next, filter, limit)
      events.push(...page.events)
    }
    return { events, next: page.next, held: page.held }
  })

/** Everything from `cursor`, read on until the reader holds nothing back. */
export const readAll = (log: Log, cursor: EventLog.Cursor, filter: EventLog.Filter = {}, limit = 3) =>
  Effect.gen(function*() {
    const events: Array<EventLog.LoggedEvent> = []
    let next = cursor
    yield* waitFor("the event log's horizon to pass every committed event", Effect.gen(function*() {
      const r = yield* readPages(log, next, filter, limit)
      events.push(...r.events)
      next = r.next
      return !r.held
    }), deadline, Duration.millis(20))
    return { events, next }
  })
