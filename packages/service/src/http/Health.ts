/**
 * `/healthz` (the process answers), `/readyz` (it can do its work: database reachable, listener connected or
 * degraded to polling, every stage pool of this process running; 503 otherwise, with the reasons) and
 * `/metrics` (Prometheus text). Per-stage lag is reported, not judged: a backlog is a reason to add workers,
 * not to take this one out of rotation.
 */
import { HttpApiBuilder } from "@effect/platform"
import { Duration, Effect, Metric, Option } from "effect"
import * as Db from "pgfiber/internal/layers/Db.js"
import * as Queue from "pgfiber/internal/queue/Queue.js"
import * as Reads from "pgfiber/internal/queue/Reads.js"
import * as Metrics from "pgfiber/internal/runtime/Metrics.js"
import * as Waker from "pgfiber/internal/runtime/Waker.js"
import * as Worker from "pgfiber/internal/runtime/Worker.js"
import * as Submit from "pgfiber/internal/runtime/Submit.js"
import { Api, NotReadyYet, type Readiness } from "./Api.js"
import * as PrometheusText from "./PrometheusText.js"

/** A readiness probe must answer quickly even when the database hangs. */
const probeTimeout = Duration.seconds(2)

const counters = [
  Metrics.enqueued,
  Metrics.claimed,
  Metrics.completed,
  Metrics.retried,
  Metrics.rescheduled,
  Metrics.deadLettered,
  Metrics.released,
  Metrics.fenced
]

export const layer = HttpApiBuilder.group(Api, "health", (handlers) =>
  Effect.gen(function*() {
    const db = yield* Db.Db
    const reads = yield* Reads.Reads
    const stages = yield* Submit.KnownStages
    const worker = yield* Effect.serviceOption(Worker.WorkerInfo)
    const waker = yield* Effect.serviceOption(Waker.Waker)
    const startedAt = Date.now()

    // every known stage's series exist from the first scrape, at 0, so rate() has a starting point
    yield* Effect.forEach(stages, (stage) =>
      Effect.forEach(counters, (counter) => Metric.incrementBy(Metrics.forStage(counter, stage.name), 0), { discard: true }), {
      discard: true
    })

    const probeDatabase = Db.ping.pipe(
      Effect.provideService(Db.Db, db),
      Effect.timeoutFail({ duration: probeTimeout, onTimeout: () => "no answer within 2 s" }),
      Effect.map(() => ({ ok: true, detail: "reachable" })),
      Effect.catchAll((e) => Effect.succeed({ ok: false, detail: `unreachable: ${typeof e === "string" ? e : e.message}` }))
    )

    const stageStats = reads.stats.pipe(
      Effect.timeout(probeTimeout),
      Effect.option
    )

    const readiness = Effect.gen(function*() {
      const [database, stats] = yield* Effect.all([probeDatabase, stageStats], { concurrency: 2 })
      const problems: Array<string> = []
      if (!database.ok) problems.push(`database ${database.detail}`)

      const wakerHealth = Option.isSome(waker) ? Option.some(yield* waker.value.health) : Option.none()
      const listener = Option.match(wakerHealth, {
        onNone: () => ({ ok: true, detail: "no worker in this process" }),
        onSome: (h) =>
          h.listener === "connecting"
            ? { ok: false, detail: "LISTEN connection not established yet" }
            : h.listener === "down"
            ? {
              ok: true,
              detail: `degraded: LISTEN down since ${h.listenerDownSince?.toISOString()} (${h.listenerDownReason ?? "unknown"}); polling`
            }
            : { ok: true, detail: "listening" }
      })
      if (!listener.ok) problems.push(`listener: ${listener.detail}`)

      const pools = Option.isSome(worker) ? yield* worker.value.pools : []
      const expected = Option.isSome(worker) ? worker.value.stages.map((s) => s.name) : []
      const poolProblems = expected.flatMap((name) => {
        const pool = pools.find((p) => p.stage === name)
        if (pool === undefined) return [`pool ${name} is not running`]
        if (pool.state !== "running") return [`pool ${name} is ${pool.state}`]
        if (pool.paused) return [`pool ${name} is paused: claims are failing`]
        return []
      })
      problems.push(...poolProblems)
      const poolCheck = Option.isNone(worker)
        ? { ok: true, detail: "no worker in this process" }
        : { ok: poolProblems.length === 0, detail: poolProblems.length === 0 ? `${expected.length} running` : poolProblems.join("; ") }

      const byStage = new Map(Option.getOrElse(stats, () => []).map((s) => [s.stage, s]))
      const names = [...new Set([...stages.map((s) => s.name), ...byStage.keys()])].sort()
      const report: Readiness = {
        status: problems.length === 0 ? "ready" : "not ready",
        problems,
        checks: { database, listener, pools: poolCheck },
        listener: Option.match(wakerHealth, {
          onNone: () => null,
          onSome: (h) => ({ state: h.listener, downSince: h.listenerDownSince, reconnects: h.listenerReconnects })
        }),
        reaper: Option.match(wakerHealth, {
          onNone: () => null,
          onSome: (h) => ({ lastReapAt: h.lastReapAt, lastSweepAt: h.lastSweepAt })
        }),
        stages: names.map((name) => {
          const pool = pools.find((p) => p.stage === name)
          const s = byStage.get(name)
          return {
            stage: name,
            pool: pool === undefined ? null : {
              state: pool.state,
              concurrency: pool.concurrency,
              inFlight: pool.inFlight,
              claimedAhead: pool.claimedAhead,
              claimsFailing: pool.paused,
              lastClaimAt: pool.lastClaimAt,
              rateLimited: pool.rateLimited,
              capped: pool.capped
            },
            ready: s?.ready ?? 0,
            scheduled: s?.scheduled ?? 0,
            running: s?.running ?? 0,
            deadLetters: s?.deadLetters ?? 0,
            oldestReadyAgeSeconds: (s?.oldestReadyAgeMs ?? 0) / 1000,
            paused: (s?.paused ?? false) || (pool?.stagePaused ?? false),
            // jobs ready, the stage's token bucket empty: waiting for the next token (not a problem: by design)
            rateLimited: (s?.rateLimited ?? false) || (pool?.rateLimited ?? false)
          }
        })
      }
      return report
    })

    const scrapeFamilies = Effect.gen(function*() {
      const stats = yield* stageStats
      const pools = Option.isSome(worker) ? yield* worker.value.pools : []
      const families: Array<PrometheusText.Family> = [
        {
          name: "pgfiber_database_up",
          help: "1 when the queue statistics could be read at this scrape",
          type: "gauge",
          samples: [{ labels: {}, value: Option.isSome(stats) ? 1 : 0 }]
        }
      ]
      if (Option.isSome(stats)) {
        const rows = Queue.statsForStages(stats.value, stages.map((s) => s.name))
        families.push(
          {
            name: "pgfiber_queue_depth",
            help: "Jobs in the queue by stage and state (all processes, all orgs)",
            type: "gauge",
            samples: rows.flatMap((s) =>
              (["ready", "scheduled", "running", "cancelling"] as const).map((state) => ({
                labels: { stage: s.stage, state },
                value: s[state]
              }))
            )
          },
          {
            name: "pgfiber_queue_oldest_ready_age_seconds",
            help: "How long the oldest ready job of the stage has waited (lag)",
            type: "gauge",
            samples: rows.map((s) => ({ labels: { stage: s.stage }, value: s.oldestReadyAgeMs / 1000 }))
          },
          {
            name: "pgfiber_dead_letters",
            help: "Unresolved dead letters by stage",
            type: "gauge",
            samples: rows.map((s) => ({ labels: { stage: s.stage }, value: s.deadLetters }))
          },
          {
            name: "pgfiber_stage_paused",
            help: "1 when an operator paused the stage (nothing of it is claimed until resumed)",
            type: "gauge",
            samples: rows.map((s) => ({ labels: { stage: s.stage }, value: s.paused ? 1 : 0 }))
          },
          {
            name: "pgfiber_stage_rate_limited",
            help: "1 when the stage has ready jobs and its token bucket is empty (waiting for the next token)",
            type: "gauge",
            samples: rows.map((s) => ({ labels: { stage: s.stage }, value: s.rateLimited ? 1 : 0 }))
          }
        )
      }
      if (Option.isSome(waker)) {
        const h = yield* waker.value.health
        families.push(
          {
            name: "pgfiber_listener_up",
            help: "1 while this process's LISTEN connection is listening; 0 while it is down (pools poll) or connecting",
            type: "gauge",
            samples: [{ labels: {}, value: h.listener === "listening" ? 1 : 0 }]
          },
          {
            name: "pgfiber_listener_down_seconds",
            help: "How long the LISTEN connection has been down (0 while listening)",
            type: "gauge",
            samples: [{ labels: {}, value: h.listenerDownSince === null ? 0 : Math.max(0, Date.now() - h.listenerDownSince.getTime()) / 1000 }]
          }
        )
      }
      if (pools.length > 0) {
        families.push(
          {
            name: "pgfiber_pool_in_flight",
            help: "Jobs this process is running, by stage",
            type: "gauge",
            samples: pools.map((p) => ({ labels: { stage: p.stage }, value: p.inFlight }))
          },
          {
            name: "pgfiber_pool_capped",
            help: "1 when this process's pool waits for a slot under the stage's global cap",
            type: "gauge",
            samples: pools.map((p) => ({ labels: { stage: p.stage }, value: p.capped ? 1 : 0 }))
          },
          {
            name: "pgfiber_pool_concurrency",
            help: "This process's concurrency per stage",
            type: "gauge",
            samples: pools.map((p) => ({ labels: { stage: p.stage }, value: p.concurrency }))
          }
        )
      }
      const memory = process.memoryUsage()
      families.push(
        {
          name: "process_resident_memory_bytes",
          help: "Resident memory size in bytes",
          type: "gauge",
          samples: [{ labels: {}, value: memory.rss }]
        },
        {
          name: "process_start_time_seconds",
          help: "Start time of the process since unix epoch in seconds",
          type: "gauge",
          samples: [{ labels: {}, value: Math.round((Date.now() - process.uptime() * 1000) / 1000) }]
        }
      )
      return families
    })

    return handlers
      .handle("healthz", () => Effect.succeed({ status: "ok" as const, uptimeSeconds: Math.round((Date.now() - startedAt) / 1000) }))
      .handle("readyz", () =>
        Effect.flatMap(readiness, (report) =>
          report.status === "ready" ? Effect.succeed(report) : Effect.fail(new NotReadyYet(report))))
      .handle("metrics", () =>
        Effect.gen(function*() {
          const families = yield* scrapeFamilies
          return PrometheusText.render(yield* Metric.snapshot, families)
        }))
  }))
