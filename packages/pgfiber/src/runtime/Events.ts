/**
 * Job lifecycle events: the bus lives in `src/queue/Events.ts`, below the queue that publishes `Enqueued`
 * (imports point down: the queue never imports the runtime). The runtime, the faces and users keep this
 * path; it is the same module. `follow` (EventFeed.ts) is the other way in: every process's events, from the
 * durable log, for readers in any process (docs/events.md).
 */
import { Layer } from "effect"
import * as EventLog from "../queue/EventLog.js"
import * as EventFeed from "./EventFeed.js"

export * from "../queue/Events.js"

/**
 * Every process's job events, from the durable log (`EventFeed`): `Events.follow({ stages: ["x"] })` sees what
 * any worker anywhere did to those jobs, in order per job, resumable by event id. `subscribe` above is this
 * process's bus only.
 */
export { follow, type FollowOptions } from "./EventFeed.js"
export type { Filter as FollowFilter, Kind as LoggedKind, LoggedEvent } from "../queue/EventLog.js"

/** What `follow` needs: the event log's reader and the feed (over the Db and the queue; the Waker's LISTEN when provided). */
export const layerFeed = EventFeed.layer.pipe(Layer.provideMerge(EventLog.layer))
