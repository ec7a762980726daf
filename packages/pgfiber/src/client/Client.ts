/**
 * The queue for a Node service that does not use Effect: `connect`, then promises for enqueue, get, cancel and
 * wait, an async iterator over the event log, and `close`. It is the core's own Queue, EventLog and EventFeed on a
 * Db of its own, run in a runtime the client holds, so a producer written with async/await writes the same rows,
 * under the same validation and row-level security, as a worker's follow-ups and the HTTP API do.
 *
 * A promise rejects with the core's own error (an `Error` with a `_tag`: `InvalidJob`, `QueueError`, `NotMigrated`,
 * `EventLogError`, …) or the client's (`WaitTimeout`, `JobNotFound`, `ClientClosed`).
 */
import { Cause, Data, Deferred, Duration, Effect, Exit, FiberId, Layer, Logger, LogLevel, ManagedRuntime, Queue as Q, Redacted, Stream } from "effect"
import * as Db from "../layers/Db.js"
import * as EventLog from "../queue/EventLog.js"
import * as Migrations from "../queue/Migrations.js"
import * as PgQueue from "../queue/PgQueue.js"
import * as Queue from "../queue/Queue.js"
import * as Tenancy from "../queue/Tenancy.js"
import * as EventFeed from "../runtime/EventFeed.js"
import * as Stage from "../runtime/Stage.js"

export interface ConnectOptions {
  /** The PostgreSQL URL; default DATABASE_URL. */
  readonly url?: string | undefined
  /** The schema pgfiber's tables live in; default PGFIBER_SCHEMA, else `pgfiber`. */
  readonly schema?: string | undefined
  /** Most connections the client opens for statements (following events takes one more while followed); default 4. */
  readonly poolMax?: number | undefined
  /**
   * `true` (default): applies pending migrations on connect, as a worker does. `false`: the client only checks
   * that the schema is current (it fails with `NotMigrated` otherwise), for a role that may not run DDL.
   */
  readonly migrate?: boolean | undefined
  /**
   * A tenant's client: every call runs under this org's row-level security (its jobs get this org, it reads only
   * this org's jobs and events). Default: the owner, every org.
   */
  readonly orgId?: string | undefined
}

export type EnqueueOptions = Stage.EnqueueOptions

/** Where `events` starts: from now (default), everything kept, or after an event id (to resume). */
export type EventsFrom = "now" | "beginning" | { readonly after: string }

/** Which events `events` yields (every field optional; `org` is the client's own for a tenant's client). */
export type EventFilter = Omit<EventLog.Filter, "org"> & { readonly orgId?: string | undefined }

export type Job = Queue.Job
export type FinishedJob = Queue.FinishedJob
export type LoggedEvent = EventLog.LoggedEvent
export type EnqueueResult = Queue.EnqueueResult
export type CancelOutcome = Queue.CancelOutcome

/** `wait` gave up: the job had not finished within its timeout (it may still run). */
export class WaitTimeout extends Data.TaggedError("WaitTimeout")<{ readonly message: string; readonly jobId: string }> {}

/** The client was closed before the call finished, or the call came after `close`. */
export class ClientClosed extends Data.TaggedError("ClientClosed")<{ readonly message: string }> {}

export { JobNotFound } from "../queue/Job.js"

export interface Client {
  /** Enqueues one job to a stage declared with `Stage.make`: the payload is typed and encoded by its Schema. */
  enqueue<A, I, R>(stage: Stage.Stage<A, I, R, any>, payload: A, options?: EnqueueOptions): Promise<EnqueueResult>
  /**
   * Enqueues one job to a stage by name, as `Queue.enqueue` takes it: the name, size and options are checked here;
   * the payload is the worker's to decode (one its stage's Schema refuses is dead-lettered with the reason).
   */
  enqueue(stage: string, payload?: unknown, options?: EnqueueOptions): Promise<EnqueueResult>
  /** The job, live or from the kept history; null when it is neither (or another org's). */
  get(id: string): Promise<Job | null>
  /** Queued: removed (kept in the history as cancelled). Running: its worker stops it at its next heartbeat. */
  cancel(id: string): Promise<CancelOutcome>
  /**
   * Resolves once the job has finished (completed, dead-lettered or cancelled), with the job as the history keeps
   * it (its `output` for a completed one); rejects with `JobNotFound` when there is no such job (or it finished and
   * its stage keeps nothing), `WaitTimeout` after `timeout` (a number of ms or a duration such as "30 seconds").
   */
  wait(id: string, options?: { readonly timeout?: Duration.DurationInput | undefined }): Promise<FinishedJob>
  /**
   * The event log's events that pass `filter`, every process's, in order per job, until the loop breaks or the
   * client closes. Each event's `id` resumes a later call (`from: { after: id }`).
   */
  events(filter?: EventFilter, options?: { readonly from?: EventsFrom | undefined }): AsyncIterable<LoggedEvent>
  /** Ends open `events` loops, rejects calls still waiting with `ClientClosed`, and closes the connections. */
  close(): Promise<void>
}

/** How often `wait` reads the job while no event says it finished (a stage that logs no events). */
const waitPollEvery = Duration.seconds(1)

const terminalKinds: ReadonlyArray<EventLog.Kind> = ["completed", "dead", "cancelled"]

const servicesLayer = (options: ConnectOptions, url: string) => {
  const db = Db.layerWith({
    url: Redacted.make(url),
    schema: options.schema ?? process.env.PGFIBER_SCHEMA ?? "pgfiber",
    poolMax: options.poolMax ?? 4,
    applicationName: "pgfiber-client"
  })
  const ready = Layer.effectDiscard<unknown, Migrations.MigrationError | Migrations.NotMigrated | Db.DbError, Db.Db>(
    options.migrate === false ? Migrations.requireCurrent() : Migrations.migrate()
  )
  return EventFeed.layer.pipe(
    Layer.provideMerge(Layer.mergeAll(PgQueue.layer(), EventLog.layer)),
    Layer.provideMerge(ready.pipe(Layer.provideMerge(db))),
    // the user's service has its own logging: only the client's warnings and errors reach the console
    Layer.provide(Logger.minimumLogLevel(LogLevel.Warning))
  )
}

type Services = Layer.Layer.Success<ReturnType<typeof servicesLayer>>

/** A finished job (one the history keeps), typed as such. */
const finished = (job: Job | null): FinishedJob | null =>
  job !== null && job.finishedAt !== null && job.status !== "waiting" && job.status !== "queued" && job.status !== "running"
    ? job as FinishedJob
    : null

/** Runs to the Exit, then resolves with the value or rejects with the error itself (not a wrapper). */
const toPromise = <A, E>(exit: Exit.Exit<A, E>): Promise<A> =>
  Exit.isSuccess(exit) ? Promise.resolve(exit.value) : Promise.reject(Cause.squash(exit.cause))

/** Connects (and migrates, unless told not to); rejects when the database cannot be reached or is not current. */
export const connect = async (options: ConnectOptions = {}): Promise<Client> => {
  const url = options.url ?? process.env.DATABASE_URL
  if (url === undefined || url === "") throw new Error("pgfiber/client: no `url` given and DATABASE_URL is unset")
  const runtime = ManagedRuntime.make(servicesLayer(options, url))
  const built = await runtime.runPromiseExit(Effect.void)
  if (Exit.isFailure(built)) {
    await runtime.dispose()
    throw Cause.squash(built.cause)
  }
  const services = await runtime.runtime()
  const closing = Deferred.unsafeMake<void>(FiberId.none)
  let closed = false
  const orgId = options.orgId
  const scoped = orgId === undefined ? Tenancy.asOwner : Tenancy.forOrg(orgId)
  const onClose = Effect.zipRight(Deferred.await(closing), Effect.fail(new ClientClosed({ message: "the pgfiber client was closed" })))

  const closedError = () => new ClientClosed({ message: "the pgfiber client is closed" })
  /** A call cut short by the close (the services it was using went away mid-call): ClientClosed, as the call sees it. */
  const cutByClose = (cause: Cause.Cause<unknown>) => closed && Cause.isInterruptedOnly(cause)

  const run = <A, E>(effect: Effect.Effect<A, E, Services>): Promise<A> =>
    closed
      ? Promise.reject(closedError())
      : runtime.runPromiseExit(Effect.raceFirst(scoped(effect), onClose)).then((exit) =>
        Exit.isFailure(exit) && cutByClose(exit.cause) ? Promise.reject(closedError()) : toPromise(exit)
      )

  const withQueue = <A, E>(f: (queue: Queue.Queue["Type"]) => Effect.Effect<A, E>) => Effect.flatMap(Queue.Queue, f)

  const enqueue = (stage: string | Stage.Stage<any, any, any, any>, payload?: unknown, enqueueOptions: EnqueueOptions = {}) => {
    const jobOptions = orgId === undefined || enqueueOptions.orgId !== undefined ? enqueueOptions : { ...enqueueOptions, orgId }
    const job = typeof stage === "string"
      ? Effect.succeed<Queue.NewJob>({ ...jobOptions, stage, payload })
      : Stage.job(stage, payload, jobOptions)
    return run(Effect.flatMap(job, (j) => withQueue((q) => Effect.map(q.enqueue([j]), (r) => r[0]!))))
  }

  const waitFinished = (id: string) =>
    Effect.scoped(Effect.gen(function*() {
      const queue = yield* Queue.Queue
      const feed = yield* EventFeed.EventFeed
      // follow before the first read: a job finishing in between is not missed
      const heard = yield* Q.sliding<void>(1)
      const following = yield* Deferred.make<void>()
      yield* feed.follow({ jobId: id, kinds: terminalKinds, ...(orgId === undefined ? {} : { org: orgId }) }, {
        onFollowing: Deferred.succeed(following, undefined)
      }).pipe(Stream.runForEach(() => Q.offer(heard, undefined)), Effect.ignore, Effect.forkScoped)
      yield* Deferred.await(following)
      for (;;) {
        const job = yield* queue.get(id)
        if (job === null) return yield* new Queue.JobNotFound({ message: `job ${id} not found (or finished, and its stage keeps no history)` })
        const done = finished(job)
        if (done !== null) return done
        yield* Effect.raceFirst(Q.take(heard), Effect.sleep(waitPollEvery))
      }
    }))

  const wait = (id: string, waitOptions: { readonly timeout?: Duration.DurationInput | undefined } = {}) =>
    run(
      waitOptions.timeout === undefined
        ? waitFinished(id)
        : Effect.timeoutFail(waitFinished(id), {
          duration: waitOptions.timeout,
          onTimeout: () => new WaitTimeout({ jobId: id, message: `job ${id} did not finish within ${Duration.format(Duration.decode(waitOptions.timeout!))}` })
        })
    )

  const events = (filter: EventFilter = {}, eventsOptions: { readonly from?: EventsFrom | undefined } = {}): AsyncIterable<LoggedEvent> => {
    const { orgId: wanted, ...rest } = filter
    const logFilter: EventLog.Filter = { ...rest, org: orgId ?? wanted }
    const stream = Stream.unwrap(Effect.map(EventFeed.EventFeed, (feed) => feed.follow(logFilter, { from: eventsOptions.from ?? "now" }))).pipe(
      // a tenant's feed reads as the owner with the org filter (EventLog's own rule), so no scoping here
      Stream.interruptWhenDeferred(closing),
      // closed while the follower was still starting (its LISTEN going away under it): the loop ends all the same
      Stream.catchAllCause((cause) => cutByClose(cause) ? Stream.empty : Stream.failCause(cause))
    )
    const orClosed: Stream.Stream<LoggedEvent, EventLog.EventLogError | ClientClosed, Services> = closed
      ? Stream.fail(closedError())
      : stream
    return Stream.toAsyncIterableRuntime(orClosed, services)
  }

  const close = async () => {
    if (closed) return
    closed = true
    Deferred.unsafeDone(closing, Exit.void)
    await runtime.dispose()
  }

  return {
    enqueue: enqueue as Client["enqueue"],
    get: (id) => run(withQueue((q) => q.get(id))),
    cancel: (id) => run(withQueue((q) => q.cancel(id))),
    wait,
    events,
    close
  }
}
