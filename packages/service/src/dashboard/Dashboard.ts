/**
 * The web dashboard: server-rendered pages under a base path (`/dashboard` in `pgfiber start`), signed in
 * with an API key. An operator's key (admin scope) sees every org; an org's key sees its org only, because
 * every page reads under that org's row-level security (`Db.withOrg`), as the HTTP API does, and the live
 * view filters the shared snapshot to it. Actions (cancel, retry, resolve, purge) call the same Queue
 * functions as the API and the CLI, and the webhooks page the same `Subscriptions` service; destructive and
 * bulk ones (cancel, purging dead letters or a stage's queue, bulk retry and resolve, removing a webhook)
 * answer a first POST with a confirmation page and act only on its `confirm=yes`.
 *
 * Every response carries a strict Content-Security-Policy (scripts and styles from this origin only, no
 * inline code), and every value is escaped (Html.ts). Sessions are signed cookies (Session.ts); POSTs need
 * the session's CSRF token. Live updates are server-sent events from the one shared source (Live.ts).
 *
 * Mount it into your own server: `Dashboard.make({ basePath })` gives an `HttpApp` that answers every
 * request under that path (and the caller routes only those to it), or use `Dashboard.layer` and its tag.
 */
import { HttpIncomingMessage, HttpServerRequest, HttpServerResponse } from "@effect/platform"
import type { HttpApp } from "@effect/platform"
import { Config, Context, Duration, Effect, Either, Layer, Option, Redacted, Schedule, Stream } from "effect"
import * as ApiKeys from "../auth/ApiKeys.js"
import * as AuthLimiter from "../auth/AuthLimiter.js"
import * as Delivery from "../stages/webhooks/Delivery.js"
import * as Subscriptions from "../stages/webhooks/Subscriptions.js"
import * as Db from "pgfiber/internal/layers/Db.js"
import * as EventLog from "pgfiber/internal/queue/EventLog.js"
import * as Bulk from "pgfiber/internal/queue/Bulk.js"
import * as PgSchedules from "pgfiber/internal/queue/PgSchedules.js"
import * as Queue from "pgfiber/internal/queue/Queue.js"
import * as Reads from "pgfiber/internal/queue/Reads.js"
import * as Schedules from "pgfiber/internal/queue/Schedules.js"
import * as StageRegistry from "pgfiber/internal/runtime/StageRegistry.js"
import * as Submit from "pgfiber/internal/runtime/Submit.js"
import * as Worker from "pgfiber/internal/runtime/Worker.js"
import * as Assets from "./Assets.js"
import { html, type Html } from "./Html.js"
import * as Live from "./Live.js"
import * as Millis from "pgfiber/internal/layers/Millis.js"
import * as Pages from "./Pages.js"
import * as Session from "./Session.js"
import * as StagePages from "./StagePages.js"
import * as View from "./View.js"
import * as WebhookPages from "./WebhookPages.js"

export interface DashboardOptions {
  /** Where the dashboard answers, e.g. "/dashboard" (no trailing slash). */
  readonly basePath: string
  /** Signs session cookies; servers that share it accept each other's sessions. Default: random per process. */
  readonly sessionSecret?: Redacted.Redacted<string> | undefined
  /** How long a sign-in lasts. */
  readonly sessionTtl: Duration.Duration
  /** The shared live source's pace (Live.ts); default from `DASHBOARD_LIVE_*`' defaults. */
  readonly live?: Live.LiveOptions | undefined
}

export const config = Config.all({
  enabled: Config.boolean("DASHBOARD_ENABLED").pipe(Config.withDefault(true)),
  sessionSecret: Config.option(Config.redacted("DASHBOARD_SESSION_SECRET")),
  sessionTtl: Millis.config("DASHBOARD_SESSION_TTL_MS", { min: 60_000, max: 2_592_000_000, fallback: 12 * 3_600_000 })
})

export const basePath = "/dashboard"

/** The static files it serves (its script and stylesheet, uPlot's from the installed package). */
export const assets = Assets.assets

/** Content-Security-Policy: this origin's scripts, styles and connections only; nothing inline; no framing. */
export const contentSecurityPolicy =
  "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
  "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

const securityHeaders = {
  "content-security-policy": contentSecurityPolicy,
  "x-content-type-options": "nosniff",
  "x-frame-options": "DENY",
  "referrer-policy": "no-referrer",
  "cross-origin-opener-policy": "same-origin"
}

const page = (body: Html, status = 200, extra: Record<string, string> = {}) =>
  HttpServerResponse.text(body.text, {
    status,
    contentType: "text/html; charset=utf-8",
    headers: { ...securityHeaders, "cache-control": "no-store", ...extra }
  })

const redirect = (location: string, extra: Record<string, string> = {}) =>
  HttpServerResponse.empty({ status: 303, headers: { ...securityHeaders, location, "cache-control": "no-store", ...extra } })

const maxFormBytes = 64 * 1024
/** Bulk actions touch at most this many dead letters per confirmation. */
export const bulkLimit = 1000

export class Dashboard extends Context.Tag("pgfiber/Dashboard")<Dashboard, {
  readonly basePath: string
  /** Answers requests under `basePath`; anything else is a 404 page. */
  readonly app: HttpApp.Default
  /** Live views open now (server-sent event streams); each closed stream leaves at once. */
  readonly viewers: Effect.Effect<number>
}>() {}

type Signed = Session.Session & { readonly csrf: string }

export const make = (options: DashboardOptions) =>
  Effect.gen(function*() {
    const base = options.basePath.replace(/\/+$/, "")
    const db = yield* Db.Db
    const queue = yield* Queue.Queue
    const reads = yield* Reads.Reads
    const keys = yield* ApiKeys.ApiKeys
    const live = yield* Live.Live
    const known = yield* Effect.serviceOption(Submit.KnownStages)
    const worker = yield* Effect.serviceOption(Worker.WorkerInfo)
    const schedules = yield* Schedules.make(yield* PgSchedules.makeStore).pipe(Effect.provideService(Queue.Queue, queue))
    const webhooks = yield* Subscriptions.make
    const secret = Option.match(Option.fromNullable(options.sessionSecret), {
      onNone: Session.newSecret,
      onSome: (s) => Buffer.from(Redacted.value(s), "utf8")
    })
    // the server's limiter when there is one, so the API and the sign-in share one budget per client
    const limiter = Option.getOrElse(yield* Effect.serviceOption(AuthLimiter.AuthLimiter), () => AuthLimiter.make(AuthLimiter.defaults))
    const ttlMs = Duration.toMillis(options.sessionTtl)
    const compiledStages = Option.getOrElse(known, () => [] as ReadonlyArray<Submit.KnownStages["Type"][number]>)
    /**
     * The stages the viewer may name (filters, overview rows, stage actions): every one compiled in or registered by
     * any worker for an operator, the public ones only for an org's key. Without the registry, the compiled ones.
     */
    const stagesFor = (s: Session.Session) =>
      StageRegistry.operable(compiledStages, s.admin ? "operator" : "tenant").pipe(
        Effect.provideService(Queue.Queue, queue),
        Effect.map((all) => ({ names: all.map((x) => x.name), noProcess: new Set(all.filter((x) => x.live === false).map((x) => x.name)) })),
        Effect.catchAll(() =>
          Effect.succeed({
            names: compiledStages.filter((x) => s.admin || x.visibility === "public").map((x) => x.name),
            noProcess: new Set<string>()
          })
        )
      )
    const stageNamesFor = (s: Session.Session) => Effect.map(stagesFor(s), (x) => x.names)
    /** The internal stages (compiled or registered) an org's bulk action leaves alone. */
    const internalStages = StageRegistry.internalNames(compiledStages).pipe(Effect.provideService(Queue.Queue, queue))
    const minutes = 60

    /** Runs `effect` as the viewer may: under their org's row-level security, or as the owner for operators. */
    const asViewer = <A, E, R>(session: Session.Session, effect: Effect.Effect<A, E, R>) =>
      session.admin ? Db.asOwner(effect) : db.withOrg(session.orgId ?? "", effect)
    /** Whose rows the viewer's reads may see (Reads.ts). */
    const viewerOf = (session: Session.Session): Reads.Viewer => (session.admin ? Reads.operator : Reads.org(session.orgId ?? ""))

    const secure = (request: HttpServerRequest.HttpServerRequest) =>
      (request.headers["x-forwarded-proto"] ?? "").split(",")[0]!.trim().toLowerCase() === "https" ||
      request.url.startsWith("https:")

    const label = (s: Session.Session) => (s.admin ? `operator${s.orgId ? ` (${s.orgId})` : ""}` : `org ${s.orgId}`)

    const sessionOf = (request: HttpServerRequest.HttpServerRequest) =>
      Effect.gen(function*() {
        const cookie = Session.readCookie(request.headers["cookie"], Session.cookieName)
        const session = cookie === undefined ? undefined : Session.open(secret, cookie, Date.now())
        if (session === undefined) return undefined
        // a revoked key ends its sessions
        if (!(yield* keys.isLive(session.keyId))) return undefined
        return { ...session, csrf: Session.csrfToken(secret, session) } satisfies Signed
      })

    const frame = (s: Signed, title: string, nav: Pages.Frame["nav"], extra: Partial<Pages.Frame> = {}): Pages.Frame => ({
      base, title, nav, who: { label: label(s), csrf: s.csrf }, ...extra
    })

    const text = (params: URLSearchParams, name: string, max = 200) => {
      const v = (params.get(name) ?? "").trim()
      return v.length > max || Queue.textProblem(v) !== undefined ? "" : v
    }

    const scopeOf = (s: Signed, params: URLSearchParams): View.Scope => ({ viewer: s, org: s.admin ? text(params, "org") || null : null })

    const orgNames = (snapshot: Live.Snapshot) =>
      [...new Set(snapshot.row.depth.map((d) => d.org).concat(snapshot.row.series.map((s) => s.org)).filter((o): o is string => o !== null))].sort()

    // ---- pages

    const overviewPage = (s: Signed, params: URLSearchParams) =>
      Effect.gen(function*() {
        const scope = scopeOf(s, params)
        const snapshot = yield* live.latest
        const known = yield* stagesFor(s)
        const data = View.overview(snapshot, scope, known.names, minutes, known.noProcess)
        // this process's pools count every org's jobs: for operators only
        const pools = Option.isSome(worker) && s.admin ? yield* worker.value.pools : undefined
        const liveUrl = `${base}/live${scope.org ? `?org=${encodeURIComponent(scope.org)}` : ""}`
        return page(Pages.layout(frame(s, "Overview", "overview", { liveUrl, notice: text(params, "notice") || undefined }),
          Pages.overview(base, s.csrf, scope, data, pools, s.admin ? orgNames(snapshot) : [])))
      })

    const dateParam = (v: string) => {
      if (v === "") return null
      // a date that does not exist (Feb 30) is ignored, never rolled over into the next month
      const d = Queue.parseInstant(/[zZ]|[+-]\d\d:?\d\d$/.test(v) ? v : /T|\s/.test(v) ? `${v}Z` : v)
      // what PostgreSQL's timestamptz also holds (years 1 to 9999); anything else is ignored like a bad date
      return d === undefined || d.getUTCFullYear() < 1 || d.getUTCFullYear() > 9999 ? null : d
    }

    const jobsPage = (s: Signed, params: URLSearchParams) =>
      Effect.gen(function*() {
        const query: Pages.JobsQuery = {
          stage: text(params, "stage"), status: text(params, "status"), org: s.admin ? text(params, "org") : "",
          subject: text(params, "subject"), since: text(params, "since"), until: text(params, "until"), id: text(params, "id"),
          payload: text(params, "payload", 2000), error: text(params, "error")
        }
        const search = Bulk.filterFromText({ payload: query.payload, error: query.error })
        const before = text(params, "before")
        const limit = 50
        const filter: Queue.BrowseFilter = {
          stage: query.stage || null,
          status: Pages.statuses.find((status) => status === query.status) ?? null,
          org: query.org || null,
          subject: query.subject || null,
          since: dateParam(query.since),
          until: dateParam(query.until),
          id: Queue.isJobId(query.id) ? query.id : query.id === "" ? null : "0",
          before: Queue.isJobId(before) ? before : null,
          payload: Either.isRight(search) && search.right.payload !== undefined ? JSON.stringify(search.right.payload) : null,
          error: Either.isRight(search) ? search.right.error ?? null : null
        }
        // a search that cannot be read matches nothing, and says why
        const rows = Either.isLeft(search) ? [] : yield* reads.browse(viewerOf(s), filter, limit + 1)
        const next = rows.length > limit ? rows[limit - 1]!.id : null
        // a tenant's filter lists public stages only, whatever its own jobs' stages
        const stages = [...new Set([...(yield* stageNamesFor(s)), ...(s.admin ? rows.map((r) => r.stage) : [])])].sort()
        const notice = Either.isLeft(search) ? search.left.message : text(params, "notice", 500) || undefined
        return page(Pages.layout(frame(s, "Jobs", "jobs", { notice }), Pages.jobs(base, s.csrf, scopeOf(s, params), query, stages, rows.slice(0, limit), next)))
      })

    const loadJob = (s: Signed, id: string) =>
      asViewer(s, Effect.gen(function*() {
        // a live job, or a finished one from the kept history; a dead one's dead letter carries its actions
        const job = yield* queue.get(id)
        const dead = yield* reads.deadLetterOfJob(viewerOf(s), id)
        const dl = dead === null ? null : yield* queue.deadLetters.get(dead)
        if (job !== null) {
          const delayed = job.status === "queued" && job.availableAt.getTime() > Date.now()
          return {
            id: job.id, stage: job.stage, orgId: job.orgId, subjectId: job.subjectId, payload: job.payload,
            status: delayed ? "delayed" : job.status, priority: job.priority, attempts: job.attempts, maxAttempts: job.maxAttempts,
            polls: job.polls, availableAt: job.finishedAt === null ? job.availableAt : null, lockedBy: job.lockedBy, lockedUntil: job.lockedUntil,
            dedupeKey: job.dedupeKey, lastError: job.lastError, errors: job.errors, createdAt: job.createdAt,
            updatedAt: job.updatedAt, startedAt: job.startedAt, finishedAt: job.finishedAt, lastRunMs: job.lastRunMs,
            output: job.output, progress: job.progress, progressMessage: job.progressMessage,
            deadLetter: job.status === "dead" ? dl : null, waitingOn: job.waitingOn, batchId: job.batchId
          } satisfies Pages.JobPage
        }
        if (dl === null) return null
        return {
          id: dl.jobId, stage: dl.stage, orgId: dl.orgId, subjectId: dl.subjectId, payload: dl.payload, status: "dead",
          priority: dl.priority, attempts: dl.attempts, maxAttempts: dl.maxAttempts, polls: 0, availableAt: null, lockedBy: null,
          lockedUntil: null, dedupeKey: dl.dedupeKey, lastError: dl.reason, errors: dl.errorHistory, createdAt: dl.jobCreatedAt,
          updatedAt: dl.deadAt, startedAt: null, finishedAt: dl.deadAt, lastRunMs: null, output: null, progress: null,
          progressMessage: null, deadLetter: dl
        } satisfies Pages.JobPage
      }))

    const jobPage = (s: Signed, id: string, params: URLSearchParams) =>
      Effect.gen(function*() {
        const found = Queue.isJobId(id) ? yield* loadJob(s, id) : null
        if (found === null) {
          return page(Pages.layout(frame(s, "Not found", "jobs"),
            Pages.notFound(`Job ${id} was not found: it does not exist, or it finished longer ago than its stage keeps history.`)), 404)
        }
        const related = found.subjectId === null ? [] : yield* reads.browse(viewerOf(s), { ...Queue.browseAll, subject: found.subjectId }, 20)
        const liveUrl = found.finishedAt !== null ? undefined : `${base}/live/jobs/${found.id}`
        return page(Pages.layout(frame(s, `Job ${found.id}`, "jobs", { liveUrl, notice: text(params, "notice") || undefined }),
          Pages.job(base, s.csrf, found, related, yield* asViewer(s, queue.dependencies(found.id)))))
      })

    const deadPage = (s: Signed, params: URLSearchParams) =>
      Effect.gen(function*() {
        const filter = { stage: text(params, "stage"), org: s.admin ? text(params, "org") : "", all: params.get("all") === "1" }
        const after = text(params, "after")
        const limit = 50
        // an operator's org filter is applied here; an org key's by row-level security
        const list = yield* asViewer(s, queue.deadLetters.list({
          stage: filter.stage || undefined, unresolvedOnly: !filter.all, limit: filter.org ? 1000 : limit + 1, afterId: Queue.isJobId(after) ? after : undefined
        }))
        const shown = (filter.org ? list.filter((d) => d.orgId === filter.org) : list)
        const next = shown.length > limit ? shown[limit - 1]!.id : null
        const stages = [...new Set([...(yield* stageNamesFor(s)), ...(s.admin ? shown.map((d) => d.stage) : [])])].sort()
        return page(Pages.layout(
          frame(s, "Dead letters", "dead", { notice: text(params, "notice", 500) || undefined, error: text(params, "error", 500) || undefined }),
          Pages.deadLetters(base, s.csrf, scopeOf(s, params), filter, stages, shown.slice(0, limit), next)
        ))
      })

    const schedulesPage = (s: Signed, params: URLSearchParams) =>
      Effect.gen(function*() {
        const list = yield* asViewer(s, s.admin ? schedules.list() : schedules.list({ orgId: s.orgId }))
        return page(Pages.layout(frame(s, "Schedules", "schedules", { notice: text(params, "notice", 500) || undefined }), Pages.schedules(base, s.csrf, list)))
      })

    // ---- webhooks: the org's subscriptions, as the API's /webhooks manages them; an operator's, every org's

    /** How many of each webhook's newest deliveries its row counts. */
    const recentDeliveries = 20
    /** Rows whose deliveries are looked up (one read each); the rest link to theirs. */
    const deliveryLookups = 50
    /** The org whose webhooks the viewer manages: an org key's own; an operator's pick (null: every org). */
    const webhookOrgOf = (s: Session.Session, picked: string | null) => (s.admin ? picked : s.orgId ?? "")

    const webhooksPage = (s: Signed, params: URLSearchParams, refused?: { readonly form: WebhookPages.AddForm; readonly error: string }) =>
      Effect.gen(function*() {
        const picked = s.admin ? text(params, "org") || null : null
        const list = yield* asViewer(s, webhooks.list(webhookOrgOf(s, picked)))
        const rows = yield* Effect.forEach(list, (webhook, i) =>
          i >= deliveryLookups
            ? Effect.succeed({ webhook, recent: undefined })
            : Effect.map(
              reads.browse(viewerOf(s), { ...Queue.browseAll, stage: Delivery.stageName, payload: JSON.stringify({ webhookId: webhook.id }) }, recentDeliveries),
              (recent): WebhookPages.WebhookRow => ({ webhook, recent })
            ), { concurrency: 4 })
        const form = refused?.form ?? WebhookPages.emptyForm(s.admin ? picked ?? s.orgId ?? "" : "")
        return page(Pages.layout(
          frame(s, "Webhooks", "webhooks", { notice: text(params, "notice", 500) || undefined, error: refused?.error ?? (text(params, "error", 500) || undefined) }),
          WebhookPages.webhooks(base, s.csrf, { admin: s.admin, org: picked, deliveryStage: Delivery.stageName, recentLimit: recentDeliveries }, rows, form)
        ), refused === undefined ? 200 : 400)
      })

    /** The add form's fields, checked for what no service would store; a problem is the page's 400. */
    const webhookForm = (s: Signed, params: URLSearchParams) => {
      const form: WebhookPages.AddForm = {
        org: s.admin ? (params.get("org") ?? "").trim() || (s.orgId ?? "") : s.orgId ?? "",
        url: (params.get("url") ?? "").trim(),
        kinds: params.getAll("kinds").map((k) => k.trim()).filter((k) => k !== ""),
        stages: (params.get("stages") ?? "").trim()
      }
      const problem = form.url === ""
        ? "url: give the URL to POST the events to"
        : form.org === ""
        ? "org: an operator names the org whose events the webhook receives"
        : form.org.length > 200
        ? "org: at most 200 characters"
        : form.stages.length > 20_000
        ? "stages: at most 100 stage names"
        : [["org", form.org], ["url", form.url], ["stages", form.stages], ...form.kinds.map((k) => ["kinds", k])]
          .map(([field, v]) => (Queue.textProblem(v!) === undefined ? undefined : `${field}: ${Queue.textProblem(v!)}`))
          .find((p) => p !== undefined)
      return { form, problem }
    }

    // ---- events: the event log's newest, as GET /events would have sent them (not live)

    const recentEvents = 100

    const eventsPage = (s: Signed, params: URLSearchParams) =>
      Effect.gen(function*() {
        const scope = scopeOf(s, params)
        const filter = { stage: text(params, "stage"), kind: text(params, "kind") }
        const stages = yield* stageNamesFor(s)
        if (filter.kind !== "" && !(EventLog.kinds as ReadonlyArray<string>).includes(filter.kind)) {
          return page(Pages.layout(frame(s, "Events", "events", { error: `unknown event kind ${filter.kind}; known: ${EventLog.kinds.join(", ")}` }),
            Pages.events(base, scope, { ...filter, kind: "" }, stages, [], recentEvents)), 400)
        }
        const newestFirst = yield* reads.recentEvents(viewerOf(s), {
          org: scope.org ?? undefined,
          stages: filter.stage === "" ? undefined : [filter.stage],
          kinds: filter.kind === "" ? undefined : [filter.kind as EventLog.Kind]
        }, recentEvents)
        return page(Pages.layout(frame(s, "Events", "events"), Pages.events(base, scope, filter, stages, [...newestFirst].reverse(), recentEvents)))
      })

    // ---- stages: every stage the viewer may name, its processes and limits, and a "new job" form

    const operableFor = (s: Session.Session) =>
      StageRegistry.operable(compiledStages, s.admin ? "operator" : "tenant").pipe(Effect.provideService(Queue.Queue, queue))

    const limitViews = Effect.flatMap(StageRegistry.limitStages(compiledStages), Worker.limitViews).pipe(
      Effect.provideService(Queue.Queue, queue),
      Effect.catchTag("ConfigError", (e) => Effect.die(e))
    )

    const stagesPage = (s: Signed, params: URLSearchParams) =>
      Effect.gen(function*() {
        const known = yield* operableFor(s)
        const views = yield* limitViews
        const rows = known.map((stage) => ({ stage, limits: views.find((v) => v.stage === stage.name) }))
        return page(Pages.layout(
          frame(s, "Stages", "stages", { notice: text(params, "notice", 500) || undefined, error: text(params, "error", 500) || undefined }),
          StagePages.stages(base, s.csrf, s.admin, rows)
        ))
      })

    const payloadSchemaOf = (stage: StageRegistry.Operable) =>
      stage.compiled !== undefined ? StageRegistry.payloadJsonSchema(stage.compiled) : stage.registered?.payloadSchema ?? null

    const newJobPage = (s: Signed, name: string, values?: URLSearchParams, error?: string) =>
      Effect.gen(function*() {
        const stage = (yield* operableFor(s)).find((x) => x.name === name)
        if (stage === undefined) return page(Pages.layout(frame(s, "Not found", "stages"), Pages.notFound(`No stage ${name}.`)), 404)
        return page(
          Pages.layout(frame(s, `New ${name} job`, "stages", { error }), StagePages.newJob(base, s.csrf, s.admin, stage, payloadSchemaOf(stage), values)),
          error === undefined ? 200 : 400
        )
      })

    const orgsPage = (s: Signed, params: URLSearchParams) =>
      Effect.map(live.latest, (snapshot) =>
        page(Pages.layout(frame(s, "Orgs", "orgs"), Pages.orgs(base, View.orgs(snapshot, scopeOf(s, params))))))

    // ---- live

    const sse = (events: Stream.Stream<string>) =>
      HttpServerResponse.stream(
        Stream.merge(
          Stream.make(": connected\n\n").pipe(Stream.concat(events)),
          // a comment now and then keeps proxies from closing an idle stream, and finds closed ones
          Stream.fromSchedule(Schedule.spaced("15 seconds")).pipe(Stream.map(() => ": ping\n\n"))
        ).pipe(Stream.encodeText),
        { contentType: "text/event-stream", headers: { ...securityHeaders, "cache-control": "no-store", "x-accel-buffering": "no" } }
      )

    const distinct = <A>(stream: Stream.Stream<A | undefined>) =>
      stream.pipe(
        Stream.filter((a): a is A => a !== undefined),
        Stream.map((a) => JSON.stringify(a)),
        Stream.changes
      )

    const liveOverview = (s: Signed, params: URLSearchParams) => {
      const scope = scopeOf(s, params)
      return sse(Stream.unwrap(Effect.map(stagesFor(s), (known) =>
        distinct(Stream.map(live.changes(), (snapshot) => View.overview(snapshot, scope, known.names, minutes, known.noProcess))).pipe(
          Stream.map((json) => `event: overview\ndata: ${json}\n\n`)
        ))))
    }

    const liveJob = (s: Signed, id: string) => {
      const scope: View.Scope = { viewer: s, org: null }
      return sse(distinct(Stream.map(live.changes(id), (snapshot) => View.job(snapshot, scope, id))).pipe(
        Stream.map((json) => `event: job\ndata: ${json}\n\n`)
      ))
    }

    // ---- actions

    const form = Effect.flatMap(HttpServerRequest.HttpServerRequest, (request) => request.urlParamsBody).pipe(
      HttpIncomingMessage.withMaxBodySize(Option.some(maxFormBytes)),
      Effect.map((params) => {
        const out = new URLSearchParams()
        for (const [k, v] of params) out.append(k, v)
        return out
      }),
      Effect.orElseSucceed(() => new URLSearchParams())
    )

    const withNotice = (path: string, key: "notice" | "error", message: string) =>
      `${base}${path}${path.includes("?") ? "&" : "?"}${key}=${encodeURIComponent(message)}`

    /** `?k=v&…` of the non-empty fields: the list a bulk action came from. */
    const searchOf = (fields: Record<string, string>) => {
      const q = new URLSearchParams(Object.entries(fields).filter(([, v]) => v !== ""))
      return q.size === 0 ? "" : `?${q.toString()}`
    }

    const signIn = (request: HttpServerRequest.HttpServerRequest) =>
      Effect.gen(function*() {
        const client = limiter.clientOf(Option.getOrUndefined(request.remoteAddress), request.headers["x-forwarded-for"])
        const params = yield* form
        const token = (params.get("key") ?? "").trim()
        const outcome = yield* limiter.authenticate(
          client,
          token === "" ? undefined : token,
          token === "" ? Effect.succeedNone : keys.verifyViewer(Redacted.make(token))
        )
        if (outcome._tag === "Throttled") {
          const seconds = AuthLimiter.retryAfterSeconds(outcome.retryAfterMs)
          return page(Pages.login(base, `Too many failed sign-ins; try again in ${seconds} s.`), 429, { "retry-after": String(seconds) })
        }
        if (outcome._tag === "Refused") return page(Pages.login(base, "That key is not valid (unknown, revoked or mistyped)."), 401)
        const viewer = outcome.value
        const { value } = Session.seal(secret, viewer, ttlMs, Date.now())
        yield* Effect.logInfo("dashboard sign-in").pipe(Effect.annotateLogs({ keyId: viewer.keyId, admin: viewer.admin }))
        return redirect(`${base}/`, { "set-cookie": Session.setCookie(value, { path: base, secure: secure(request), maxAgeS: Math.floor(ttlMs / 1000) }) })
      })

    const action = (s: Signed, path: ReadonlyArray<string>, request: HttpServerRequest.HttpServerRequest) =>
      Effect.gen(function*() {
        const params = yield* form
        if (!Session.csrfValid(secret, s, params.get("_csrf") ?? undefined)) {
          return page(Pages.layout(frame(s, "Refused", "none"), html`<h1>Refused</h1><p>The form was stale or not ours (CSRF token missing or wrong). Go back, reload and try again.</p>`), 403)
        }
        const confirmed = params.get("confirm") === "yes"
        const [first, id, verb] = path
        if (first === "logout") {
          return redirect(`${base}/login`, { "set-cookie": Session.clearCookie({ path: base, secure: secure(request) }) })
        }
        if (first === "jobs" && id !== undefined && verb === "cancel") {
          if (!confirmed) {
            // what the viewer may see of it (their org's, under row-level security); gone or not theirs: not found
            const job = Queue.isJobId(id) ? yield* asViewer(s, queue.get(id)) : null
            if (job === null || job.finishedAt !== null || job.status === "cancelled") {
              return redirect(job === null ? withNotice("/jobs", "notice", `job ${id} was not found`) : withNotice(`/jobs/${id}`, "notice", `job ${id} is ${job.status}: nothing to cancel`))
            }
            return page(Pages.layout(frame(s, "Confirm", "jobs"), Pages.confirm(base, s.csrf, `/jobs/${id}/cancel`,
              `Cancel job ${id} (${job.stage}${job.orgId ? `, org ${job.orgId}` : ""}), now ${job.status}? ` +
                (job.status === "running" ? "Its worker stops it at the next heartbeat; it is not retried." : "It is taken off the queue and never runs."),
              {}, `/jobs/${id}`)))
          }
          const outcome = Queue.isJobId(id) ? yield* asViewer(s, queue.cancel(id)) : "not-found" as const
          yield* Effect.logInfo("job cancelled from the dashboard").pipe(Effect.annotateLogs({ jobId: id, outcome }))
          return redirect(outcome === "not-found" ? withNotice("/jobs", "notice", `job ${id} was not found`) : withNotice(`/jobs/${id}`, "notice", `job ${outcome}`))
        }
        if (first === "jobs" && id === "bulk" && verb === undefined) {
          // "select all matching": every live job the list's filter matches, counted first, then changed in batches
          const fields = {
            stage: text(params, "stage"), status: text(params, "status"), org: s.admin ? text(params, "org") : "",
            subject: text(params, "subject"), payload: text(params, "payload", 2000), error: text(params, "error")
          }
          const back = `/jobs${searchOf(fields)}`
          const parsed = Bulk.filterFromText(fields)
          if (Either.isLeft(parsed)) return redirect(withNotice(back, "notice", parsed.left.message))
          if (!Bulk.narrows(parsed.right)) return redirect(withNotice(back, "notice", "choose at least one filter (stage, status, subject, payload, error) before a bulk action"))
          const kind = params.get("action") ?? ""
          const priorityText = text(params, "priority")
          const priority = /^\d+$/.test(priorityText) ? Number(priorityText) : Queue.namedPriorities[priorityText as Queue.PriorityName] ?? -1
          const bulkAction: Bulk.BulkAction | undefined = kind === "priority"
            ? { kind, priority }
            : kind === "cancel" || kind === "retry" || kind === "run-now" ? { kind } : undefined
          if (bulkAction === undefined) return redirect(withNotice(back, "notice", "no such bulk action"))
          const checked = Bulk.validateAction(bulkAction)
          if (Either.isLeft(checked)) return redirect(withNotice(back, "notice", checked.left.message))
          const filter: Bulk.JobFilter = s.admin ? parsed.right : { ...parsed.right, org: s.orgId ?? "", hiddenStages: yield* internalStages }
          // each batch its own transaction: under the org's row-level security for an org key, as the owner for operators
          const scoped = <A, E, R>(effect: Effect.Effect<A, E, R>) => (s.admin ? Db.asOwner(effect) : Db.forOrg(s.orgId ?? "")(effect))
          const what = { cancel: "Cancel", retry: "Retry now", "run-now": "Run now", priority: `Set priority ${priority} on` }[bulkAction.kind]
          if (!confirmed) {
            const n = yield* scoped(queue.bulk.preview(filter, bulkAction))
            const described = Object.entries(fields).filter(([, v]) => v !== "").map(([k, v]) => `${k} ${v}`).join(", ")
            return page(Pages.layout(frame(s, "Confirm", "jobs"), Pages.confirm(base, s.csrf, "/jobs/bulk",
              `${what} ${n} live job(s) matching ${described}${s.admin && fields.org === "" ? ", of every org" : ""}? ` +
                (bulkAction.kind === "cancel" ? "Queued ones are taken off the queue; running ones stop at their next heartbeat." : ""),
              { ...fields, action: bulkAction.kind, priority: priorityText }, back)))
          }
          const result = yield* scoped(queue.bulk.apply(filter, bulkAction, { actor: `dashboard (key ${s.keyId})` }))
          yield* live.fresh
          yield* Effect.logInfo("bulk action from the dashboard").pipe(Effect.annotateLogs({ action: bulkAction.kind, keyId: s.keyId, ...result }))
          const done = { cancel: "cancelled", retry: "retried now", "run-now": "made due now", priority: `given priority ${priority}` }[bulkAction.kind]
          return redirect(withNotice(back, "notice", `${result.affected} job(s) ${done}${result.cancelling > 0 ? ` (${result.cancelling} running: stopping at their next heartbeat)` : ""}`))
        }
        if (first === "jobs" && id !== undefined && verb === "run-now") {
          // a delayed job made due now: the viewer's own (row-level security), any for operators
          const outcome = Queue.isJobId(id) ? yield* asViewer(s, queue.runNow(id)) : "not-found" as const
          yield* Effect.logInfo("job made due from the dashboard").pipe(Effect.annotateLogs({ jobId: id, outcome, keyId: s.keyId }))
          return redirect(outcome === "not-found"
            ? withNotice("/jobs", "notice", `job ${id} was not found`)
            : withNotice(`/jobs/${id}`, "notice", outcome === "due" ? `job ${id} is due now` : `job ${id} is not delayed: nothing to do`))
        }
        if (first === "stages" && id !== undefined && (verb === "pause" || verb === "resume")) {
          // stage controls are shared by every org: operators only
          if (!s.admin) return page(Pages.layout(frame(s, "Refused", "none"), html`<h1>Refused</h1><p>Only an operator's key may pause or resume a stage.</p>`), 403)
          if (!(yield* stageNamesFor(s)).includes(id)) return redirect(withNotice("/", "notice", `no stage ${id}`))
          yield* Db.asOwner(queue.stageControls.setPaused(id, verb === "pause", `dashboard (key ${s.keyId})`))
          // the page it redirects to, and every open overview, show the new state at once
          yield* live.fresh
          yield* Effect.logInfo(`stage ${verb === "pause" ? "paused" : "resumed"} from the dashboard`).pipe(Effect.annotateLogs({ stage: id, keyId: s.keyId }))
          return redirect(withNotice("/", "notice", `stage ${id} ${verb === "pause" ? "paused" : "resumed"}`))
        }
        if (first === "stages" && id !== undefined && verb === "purge") {
          // a stage's queue holds every org's jobs: operators only, after a confirmation that says how many go
          if (!s.admin) return page(Pages.layout(frame(s, "Refused", "none"), html`<h1>Refused</h1><p>Only an operator's key may purge a stage.</p>`), 403)
          if (!(yield* stageNamesFor(s)).includes(id)) return redirect(withNotice("/", "notice", `no stage ${id}`))
          if (!confirmed) {
            const queued = yield* reads.countQueued(id)
            return page(Pages.layout(frame(s, "Confirm", "overview"), Pages.confirm(base, s.csrf, `/stages/${encodeURIComponent(id)}/purge`,
              `Delete the ${queued} queued job(s) of stage ${id}, of every org? Running jobs finish; delayed ones go too. This cannot be undone.`,
              {}, "/")))
          }
          const purged = yield* Db.asOwner(queue.stageControls.purge(id, `dashboard (key ${s.keyId})`))
          yield* live.fresh
          yield* Effect.logInfo("stage purged from the dashboard").pipe(Effect.annotateLogs({ stage: id, purged, keyId: s.keyId }))
          return redirect(withNotice("/", "notice", `stage ${id}: ${purged} queued job(s) purged`))
        }
        if (first === "stages" && id !== undefined && verb === "enqueue") {
          // an operator may submit any stage, for any org or none; an org's key, its public stages for its org
          const stage = (yield* operableFor(s)).find((x) => x.name === id)
          if (stage === undefined) return redirect(withNotice("/stages", "error", `no stage ${id}`))
          const payload = StagePages.payloadFromForm(payloadSchemaOf(stage), params)
          const delaySeconds = Number(params.get("delaySeconds") ?? "")
          const org = s.admin ? text(params, "org") : s.orgId ?? ""
          const request: Submit.SubmitRequest = {
            stage: id,
            payload,
            orgId: org === "" ? undefined : org,
            delay: Number.isInteger(delaySeconds) && delaySeconds > 0 && delaySeconds <= 366 * 86_400 ? Duration.seconds(delaySeconds) : undefined,
            caller: s.admin ? "operator" : "tenant"
          }
          const submitted = yield* Effect.either(asViewer(s, Submit.submit(compiledStages, request).pipe(Effect.provideService(Queue.Queue, queue))))
          if (Either.isLeft(submitted)) {
            if (submitted.left._tag === "InvalidJob") return yield* newJobPage(s, id, params, submitted.left.message)
            return yield* Effect.fail(submitted.left)
          }
          yield* Effect.logInfo("job submitted from the dashboard").pipe(Effect.annotateLogs({ stage: id, jobId: submitted.right.id, keyId: s.keyId }))
          return redirect(withNotice(`/jobs/${submitted.right.id}`, "notice", submitted.right.deduped ? `a live job with that dedupe key exists: ${submitted.right.id}` : `job ${submitted.right.id} enqueued`))
        }
        if (first === "stages" && id !== undefined && verb === "limits") {
          // limits are shared by every org: operators only
          if (!s.admin) return page(Pages.layout(frame(s, "Refused", "none"), html`<h1>Refused</h1><p>Only an operator's key may change a stage's limits.</p>`), 403)
          if (!(yield* stageNamesFor(s)).includes(id)) return redirect(withNotice("/stages", "error", `no stage ${id}`))
          const count = (name: string) => {
            const v = (params.get(name) ?? "").trim()
            return v === "" ? 0 : /^\d{1,8}$/.test(v) ? Number(v) : undefined
          }
          const maxRunning = count("maxRunning")
          const maxRunningPerOrg = count("maxRunningPerOrg")
          const rateText = (params.get("rate") ?? "").trim()
          const rate = rateText === "" || rateText === "none" ? Either.right(null) : Queue.Limits.parseRate(rateText)
          if (maxRunning === undefined || maxRunningPerOrg === undefined) {
            return redirect(withNotice("/stages", "error", `${id}: caps are whole numbers (empty: no cap)`))
          }
          if (Either.isLeft(rate)) return redirect(withNotice("/stages", "error", `${id}: rate: ${rate.left}`))
          yield* Db.asOwner(queue.limits.set(id, {
            maxRunning,
            maxRunningPerOrg,
            ...(rate.right === null ? { rateLimit: 0 } : { rateLimit: rate.right.limit, ratePerMs: rate.right.perMs })
          }))
          yield* Effect.logInfo("stage limits changed from the dashboard").pipe(Effect.annotateLogs({ stage: id, keyId: s.keyId }))
          return redirect(withNotice("/stages", "notice", `limits of ${id} saved; every process applies them within a second`))
        }
        if (first === "schedules" && path.length === 4 && ["enable", "disable", "run-now"].includes(path[3]!)) {
          // an org key reaches its own org's schedules only (row-level security); operators any, system ones too
          const key = { name: path[2]!, orgId: s.admin ? (path[1] === "-" ? null : path[1]!) : s.orgId }
          const action = path[3]!
          const result = yield* Effect.either(asViewer(s, action === "run-now"
            ? Effect.map(schedules.runNow(key), (r) => `schedule ${key.name} ran now: job ${r.id}`)
            : Effect.as(schedules.setEnabled(key, action === "enable"), `schedule ${key.name} ${action}d`)))
          if (result._tag === "Left") {
            const e = result.left
            if (e._tag === "ScheduleNotFound") return redirect(withNotice("/schedules", "notice", `schedule ${key.name} was not found`))
            if (e._tag === "InvalidJob") return redirect(withNotice("/schedules", "notice", e.message))
            return yield* Effect.fail(e)
          }
          yield* Effect.logInfo(`${result.right} (dashboard)`)
          return redirect(withNotice("/schedules", "notice", result.right))
        }
        if (first === "webhooks" && id === undefined) {
          const { form, problem } = webhookForm(s, params)
          if (problem !== undefined) return yield* webhooksPage(s, new URLSearchParams(), { form, error: problem })
          const made = yield* Effect.either(asViewer(s, webhooks.create({
            orgId: form.org,
            url: form.url,
            kinds: form.kinds,
            stages: form.stages.split(/[\s,]+/).filter((x) => x !== "")
          })))
          if (Either.isLeft(made)) {
            if (made.left._tag === "InvalidWebhook") return yield* webhooksPage(s, new URLSearchParams(), { form, error: made.left.message })
            return yield* Effect.fail(made.left)
          }
          const { secret, webhook } = made.right
          yield* Effect.logInfo("webhook created from the dashboard").pipe(Effect.annotateLogs({ webhook: webhook.id, org: webhook.orgId, keyId: s.keyId }))
          return page(Pages.layout(frame(s, "Webhook added", "webhooks"), WebhookPages.created(base, webhook, Redacted.value(secret))), 201)
        }
        if (first === "webhooks" && id !== undefined && verb === "remove" && path.length === 3) {
          // an org key reaches its own org's webhooks only (its org named and row-level security); operators any
          const org = s.admin ? null : s.orgId ?? ""
          const notFound = page(Pages.layout(frame(s, "Not found", "webhooks"), Pages.notFound(`Webhook ${id} was not found.`)), 404)
          if (!confirmed) {
            const webhook = (yield* asViewer(s, webhooks.list(org))).find((w) => w.id === id)
            if (webhook === undefined) return notFound
            return page(Pages.layout(frame(s, "Confirm", "webhooks"), Pages.confirm(base, s.csrf, `/webhooks/${webhook.id}/remove`,
              `Remove webhook ${webhook.id} (${webhook.url}, org ${webhook.orgId})? Its deliveries already queued complete without calling it.`,
              {}, "/webhooks")))
          }
          if (!(yield* asViewer(s, webhooks.remove(id, org)))) return notFound
          yield* Effect.logInfo("webhook removed from the dashboard").pipe(Effect.annotateLogs({ webhook: id, keyId: s.keyId }))
          return redirect(withNotice("/webhooks", "notice", `webhook ${id} removed`))
        }
        if (first === "dead" && id === "bulk") {
          const stage = text(params, "stage") || null
          const org = s.admin ? text(params, "org") || null : null
          const kind = params.get("action") === "resolve" ? "resolve" : "retry"
          const notes = text(params, "notes", 2000)
          const ids = yield* reads.openDeadLetterIds(viewerOf(s), { stage, org }, bulkLimit)
          if (!confirmed) {
            return page(Pages.layout(frame(s, "Confirm", "dead"), Pages.confirm(base, s.csrf, "/dead/bulk",
              `${kind === "retry" ? "Retry" : "Resolve"} ${ids.length}${ids.length === bulkLimit ? " (the first)" : ""} open dead letter(s)` +
                `${stage ? ` of stage ${stage}` : ""}${org ? ` in org ${org}` : ""}?`,
              { stage: stage ?? "", org: org ?? "", action: kind, notes })))
          }
          let done = 0
          let failed = 0
          for (const dl of ids) {
            const result = yield* Effect.either(asViewer(s, kind === "retry" ? Effect.asVoid(queue.deadLetters.retry(dl)) : queue.deadLetters.resolve(dl, notes || undefined)))
            if (result._tag === "Right") done++
            else failed++
          }
          yield* Effect.logInfo(`dead letters ${kind === "retry" ? "retried" : "resolved"} in bulk from the dashboard`).pipe(Effect.annotateLogs({ done, failed, stage, org }))
          return redirect(withNotice("/dead", "notice", `${done} dead letter(s) ${kind === "retry" ? "retried" : "resolved"}${failed > 0 ? `, ${failed} failed` : ""}`))
        }
        if (first === "dead" && id === "purge") {
          const hours = Number(params.get("hours") ?? "24")
          // up to ten years: beyond that PostgreSQL's interval overflows, and nothing is that old
          const olderThanMs = Number.isFinite(hours) && hours >= 0 ? Math.min(hours, 87_600) * 3_600_000 : 24 * 3_600_000
          const includeUnresolved = params.get("unresolved") === "1"
          if (!confirmed) {
            const purgeable = yield* reads.countPurgeable(viewerOf(s), { olderThanMs, includeUnresolved })
            return page(Pages.layout(frame(s, "Confirm", "dead"), Pages.confirm(base, s.csrf, "/dead/purge",
              `Delete ${purgeable} dead letter(s) older than ${olderThanMs / 3_600_000} hour(s)${includeUnresolved ? ", open ones included" : " (resolved and retried only)"}${s.admin ? "" : ` of org ${s.orgId}`}? This cannot be undone.`,
              { hours: String(olderThanMs / 3_600_000), unresolved: includeUnresolved ? "1" : "" })))
          }
          const n = yield* asViewer(s, queue.deadLetters.purge({ olderThan: Duration.millis(olderThanMs), includeUnresolved }))
          yield* Effect.logInfo("dead letters purged from the dashboard").pipe(Effect.annotateLogs({ purged: n }))
          return redirect(withNotice("/dead", "notice", `${n} dead letter(s) purged`))
        }
        if (first === "dead" && id !== undefined && (verb === "retry" || verb === "resolve")) {
          const result = yield* Effect.either(asViewer(s, verb === "retry"
            ? Effect.map(queue.deadLetters.retry(id), (jobId) => `dead letter ${id} retried as job ${jobId}`)
            : Effect.as(queue.deadLetters.resolve(id, text(params, "notes", 2000) || undefined), `dead letter ${id} resolved`)))
          if (result._tag === "Left") {
            const e = result.left
            // the database failed (the queue's statement, or the org's transaction itself): the error page, not a notice
            if (e._tag === "QueueError" || e._tag === "DbError") return yield* Effect.fail(e)
            return redirect(withNotice("/dead", "error", e._tag === "JobNotFound" ? `dead letter ${id} was not found` : e.message))
          }
          yield* Effect.logInfo(`${result.right} (dashboard)`)
          return redirect(withNotice("/dead", "notice", result.right))
        }
        return page(Pages.layout(frame(s, "Not found", "none"), Pages.notFound("No such action.")), 404)
      })

    // ---- routing

    const route = Effect.gen(function*() {
      const request = yield* HttpServerRequest.HttpServerRequest
      const url = new URL(request.url, "http://localhost")
      if (url.pathname !== base && !url.pathname.startsWith(`${base}/`)) return page(Pages.notFound("No such page."), 404)
      const rest = url.pathname.slice(base.length).split("/").filter((p) => p !== "").map((p) => {
        try {
          return decodeURIComponent(p)
        } catch {
          return ""
        }
      })
      const params = url.searchParams
      const method = request.method
      if (rest[0] === "assets" && rest.length === 2 && (method === "GET" || method === "HEAD")) {
        const asset = Assets.assets[rest[1]!]
        if (asset === undefined) return HttpServerResponse.text("not found", { status: 404, headers: securityHeaders })
        const { body, contentType } = asset()
        return typeof body === "string"
          ? HttpServerResponse.text(body, { contentType, headers: { ...securityHeaders, "cache-control": "public, max-age=3600" } })
          : HttpServerResponse.uint8Array(body, { contentType, headers: { ...securityHeaders, "cache-control": "public, max-age=3600" } })
      }
      if (rest[0] === "login") {
        if (method === "POST") return yield* signIn(request)
        return page(Pages.login(base))
      }
      const s = yield* sessionOf(request)
      if (s === undefined) {
        if (rest[0] === "live") return HttpServerResponse.text("sign in first", { status: 401, headers: securityHeaders })
        return method === "GET" ? redirect(`${base}/login`) : page(Pages.login(base, "Your session has ended; sign in again."), 401)
      }
      if (method === "POST") return yield* action(s, rest, request)
      if (method !== "GET" && method !== "HEAD") return page(Pages.notFound("No such page."), 405)
      switch (rest[0]) {
        case undefined:
          return yield* overviewPage(s, params)
        case "jobs":
          return rest[1] === undefined ? yield* jobsPage(s, params) : yield* jobPage(s, rest[1], params)
        case "dead":
          return yield* deadPage(s, params)
        case "schedules":
          return yield* schedulesPage(s, params)
        case "events":
          if (rest[1] === undefined) return yield* eventsPage(s, params)
          return page(Pages.layout(frame(s, "Not found", "none"), Pages.notFound("No such page.")), 404)
        case "webhooks":
          if (rest[1] === undefined) return yield* webhooksPage(s, params)
          return page(Pages.layout(frame(s, "Not found", "none"), Pages.notFound("No such page.")), 404)
        case "orgs":
          return yield* orgsPage(s, params)
        case "stages":
          if (rest[1] === undefined) return yield* stagesPage(s, params)
          if (rest[2] === "new" && rest.length === 3) return yield* newJobPage(s, rest[1])
          return page(Pages.layout(frame(s, "Not found", "none"), Pages.notFound("No such page.")), 404)
        case "live":
          return rest[1] === "jobs" && rest[2] !== undefined && Queue.isJobId(rest[2]) ? liveJob(s, rest[2]) : liveOverview(s, params)
        default:
          return page(Pages.layout(frame(s, "Not found", "none"), Pages.notFound("No such page.")), 404)
      }
    })

    const app: HttpApp.Default = route.pipe(
      Effect.catchAll((e) =>
        Effect.gen(function*() {
          const unavailable = (e as { unavailable?: boolean }).unavailable === true
          yield* Effect.logError("dashboard request failed", e)
          return page(Pages.layout({ base, title: "Error", nav: "none" },
            html`<h1>${unavailable ? "The database is unavailable" : "Something went wrong"}</h1><p>${unavailable ? "Try again in a moment." : "The cause is in the server's log."}</p>`), unavailable ? 503 : 500)
        })
      )
    )

    return Dashboard.of({ basePath: base, app, viewers: live.viewers })
  })

/** The dashboard with its shared live source, for the life of the layer. */
export const layer = (options: DashboardOptions) =>
  Layer.scoped(Dashboard, make(options)).pipe(Layer.provide(Live.layer(options.live ?? Live.defaults)), Layer.provide(Reads.layer))

/** Options from the environment (`DASHBOARD_*`), served at /dashboard; None when `DASHBOARD_ENABLED=false`. */
export const layerFromConfig = Layer.unwrapEffect(
  Effect.gen(function*() {
    const cfg = yield* config
    const liveOptions = yield* Live.config
    return cfg.enabled
      ? layer({ basePath, sessionSecret: Option.getOrUndefined(cfg.sessionSecret), sessionTtl: cfg.sessionTtl, live: liveOptions })
      : Layer.empty
  })
)

/**
 * Routes the dashboard's requests (its base path and below) to it and every other one to `app`: how a server
 * puts it in front of its own HttpApp.
 */
export const mount = (dashboard: Context.Tag.Service<Dashboard>) =>
<E, R>(app: HttpApp.Default<E, R>): HttpApp.Default<E, R> =>
  Effect.flatMap(HttpServerRequest.HttpServerRequest, (request) => {
    const path = (request.url.split("?")[0] ?? "").replace(/\/{2,}/g, "/")
    const base = dashboard.basePath
    return path === base || path.startsWith(`${base}/`) ? dashboard.app : app
  })
