/**
 * Job lifecycle events: the bus lives in `src/queue/Events.ts`, below the queue that publishes `Enqueued`
 * (imports point down: the queue never imports the runtime). The runtime, the faces and users keep this
 * path; it is the same module.
 */
export * from "../queue/Events.js"
