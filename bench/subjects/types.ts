/**
 * A subject of the benchmark: a job queue, seen from the producer side (in the harness process) and run as a
 * worker in its own process. The same workloads drive every subject; only these adapters differ.
 */
export type WorkloadMode = "bulk" | "latency" | "idle" | "steady"

/**
 * The job every subject's worker runs, written as users write it (`hooks.ts`): `async` an async no-op that
 * records the job; `io` the same, then awaits a 20 ms timer (a call to another service); `sync` a plain
 * function, kept as a labelled row so figures measured with it stay comparable.
 */
export type HandlerKind = "async" | "io" | "sync"

/** How long an `io` job waits, ms: at concurrency c the bound is c × 1000 / ioJobMs jobs/s. */
export const ioJobMs = 20

/** What the harness passes to a worker process (as JSON on its command line). */
export interface WorkerConfig {
  readonly subject: string
  readonly variant: string
  readonly url: string
  readonly mode: WorkloadMode
  readonly handler: HandlerKind
  /** bulk: report `drained` when this many handlers have run. */
  readonly expect: number
  readonly concurrency: number
  /** pgfiber only: run the Scheduler with one schedule of this cron expression, its jobs to the bench stage. */
  readonly schedule?: string
  /** pgfiber only: fair claiming across orgs (default on, as a stage is by default). */
  readonly fair?: boolean
  /** pgfiber only: a token bucket on the bench stage, e.g. `1/10m`. */
  readonly rate?: string
}

export interface Producer {
  /** One enqueue call with all of `seqs` (the queue's batch API). */
  readonly enqueueBatch: (seqs: ReadonlyArray<number>) => Promise<void>
  /** One enqueue call with one job; resolves when the queue's own call returns (committed). */
  readonly enqueueOne: (seq: number) => Promise<void>
  /** Jobs not yet completed (queued, running, or completed but not yet recorded). */
  readonly pending: () => Promise<number>
  readonly close: () => Promise<void>
}

/**
 * Which of a subject's statements (as pg_stat_statements stores them: constants replaced by `$n`) claim jobs,
 * settle them (complete, fail, retry) and enqueue them; anything else counts only in the totals.
 */
export interface StatementKinds {
  readonly claim: RegExp
  readonly settle: RegExp
  readonly enqueue: RegExp
}

export interface Subject {
  /** Stable id used in result keys and file names. */
  readonly key: string
  readonly label: string
  /** The worker process's entry file, relative to bench/. */
  readonly workerScript: string
  readonly variant: string
  readonly notes: string
  readonly statements: StatementKinds
  /** Creates the queue's schema in a fresh database. */
  readonly install: (url: string) => Promise<void>
  /**
   * The producer side, with a pool of `connections` (default 4). The steady workload's producer process asks
   * for 20, so that its pool (node-postgres runs one statement per connection at a time) is never what holds its
   * single enqueues back. The database can: PostgreSQL serialises the commits of transactions that NOTIFY (every
   * subject's enqueue does), each through its WAL flush (wait event Lock:object), so with a slow disk single
   * enqueues can top out below 300 a second whatever the pool (graphile-worker's `add_job` at about 190, pgfiber's
   * at about 220, on a 2-core machine at load 11).
   */
  readonly producer: (url: string, connections?: number) => Promise<Producer>
  /** Drains that cannot finish in this time are cut off and their rate reported as measured so far. */
  readonly drainCapMs: number
}

export const queueName = "bench"
