/**
 * The dashboard in a real Chromium (Playwright): sign-in with keys, the overview's counts changing live as
 * jobs are enqueued and complete (no reload), a job page, retrying a dead letter, bulk actions behind a
 * confirmation, an org key that never sees another org's jobs, a `<script>` payload shown as text, a webhook
 * added and removed from its page, and not
 * one console error or CSP violation on the way. `DASHBOARD_SCREENSHOTS=1` also writes the README's
 * screenshots to docs/.
 */
import { Duration, Effect, Layer, ManagedRuntime, Redacted, Schema } from "effect"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import type { Browser, BrowserContext, Page } from "playwright-core"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as ApiKeys from "../../packages/service/src/auth/ApiKeys.js"
import * as Dashboard from "../../packages/service/src/dashboard/Dashboard.js"
import * as Server from "../../packages/service/src/http/Server.js"
import { Permanent } from "../../packages/pgfiber/src/JobError.js"
import * as Storage from "../../packages/media/src/layers/Storage.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as PgSchedules from "../../packages/pgfiber/src/queue/PgSchedules.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import * as Schedules from "../../packages/pgfiber/src/queue/Schedules.js"
import * as Events from "../../packages/pgfiber/src/runtime/Events.js"
import * as MinuteStats from "../../packages/pgfiber/src/runtime/MinuteStats.js"
import * as Stage from "../../packages/pgfiber/src/runtime/Stage.js"
import * as Submit from "../../packages/pgfiber/src/runtime/Submit.js"
import * as Worker from "../../packages/pgfiber/src/runtime/Worker.js"
import { baseUrl } from "../http/support.js"
import { layerDb } from "../support/pg.js"
import { launch } from "./browser.js"

/** Jobs of `gated` run until the test opens the gate, so "running" can be seen. */
let openGate: () => void = () => undefined
let gate = new Promise<void>((resolve) => (openGate = resolve))

const gated = Stage.make({
  name: "gated",
  visibility: "public",
  payload: Schema.Struct({ n: Schema.Number }),
  concurrency: 2,
  handler: () => Effect.promise(() => gate)
})

const echo = Stage.make({
  name: "echo",
  visibility: "public",
  payload: Schema.Struct({ n: Schema.Number, fail: Schema.optional(Schema.Boolean) }),
  concurrency: 4,
  handler: ({ fail, n }) => (fail ? new Permanent({ message: `echo ${n} asked to fail` }) : Effect.sleep(Duration.millis(5 + (n % 20))))
})

/** One job an hour: after the first, the rest wait for a token, and the overview says "rate limited". */
const metered = Stage.make({
  name: "metered",
  visibility: "public",
  payload: Schema.Struct({ n: Schema.Number }),
  limits: { rate: { limit: 1, per: "1 hour", burst: 1 } },
  handler: () => Effect.void
})

/** Known, run by nobody: its jobs stay queued for the pages to show. */
const notes = Stage.make({ name: "notes", visibility: "public", payload: Schema.Unknown, handler: () => Effect.void })

/** Known, run by nobody, touched by no other test: the stage purge's target. */
const parked = Stage.make({ name: "parked", visibility: "public", payload: Schema.Unknown, handler: () => Effect.void })

const stages = [echo, gated, notes, metered, parked]

const storageDir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "pgfiber-dashboard-"))

const layer = Server.layer({
  host: "127.0.0.1",
  port: 0,
  admin: { host: "127.0.0.1", port: 0 },
  maxBodyBytes: 64 * 1024,
  maxUploadBytes: 256 * 1024,
  devTick: false,
  workerId: "dashboard-test",
  // made below and provided, as a user mounting it would, so the test can ask it how many viewers remain
  dashboard: false
}).pipe(
  Layer.provideMerge(Dashboard.layer({
    basePath: "/dashboard",
    sessionTtl: Duration.hours(1),
    live: { minInterval: Duration.millis(200), idleInterval: Duration.seconds(2), minutes: 60 }
  })),
  Layer.provideMerge(Storage.layerFs(storageDir).pipe(Layer.orDie)),
  Layer.provideMerge(Layer.scopedDiscard(MinuteStats.make({ flushInterval: Duration.millis(500), keep: Duration.hours(24) }))),
  Layer.provideMerge(Worker.layer([echo, gated, metered], {
    workerId: "dashboard-test",
    shutdownGrace: Duration.seconds(1),
    sweepInterval: Duration.seconds(30),
    pollInterval: Duration.seconds(1),
    concurrency: {}
  })),
  Layer.provideMerge(Layer.succeed(Submit.KnownStages, stages)),
  Layer.provideMerge(ApiKeys.layer),
  Layer.provideMerge(PgQueue.layer({ knownStages: stages.map((s) => s.name) })),
  Layer.provideMerge(Layer.merge(layerDb(), Events.layer()))
)

let runtime: ManagedRuntime.ManagedRuntime<Layer.Layer.Success<typeof layer>, Layer.Layer.Error<typeof layer>>
let browser: Browser
let base = ""
const keys: Record<"admin" | "acme" | "globex", string> = { admin: "", acme: "", globex: "" }
/** Every console error and uncaught page error, from every page of every test. */
const problems: Array<string> = []
/** Every browser context opened, so a test that fails half-way leaves none open for the last check. */
const contexts: Array<BrowserContext> = []

const run = <A, E>(effect: Effect.Effect<A, E, Layer.Layer.Success<typeof layer>>) => runtime.runPromise(effect)

const enqueue = (jobs: ReadonlyArray<Queue.NewJob>) => run(Effect.flatMap(Queue.Queue, (q) => q.enqueue(jobs)))

/**
 * A failed sign-in answers 401, which Chromium reports on the console: expected where a test says so. So is the 401
 * a live stream's reconnect gets once its session has ended (its key revoked), if it reconnects before the page
 * moves on, and the 400 of a refused webhook form.
 */
const newPage = async (
  options: { readonly expectRefusedSignIn?: boolean; readonly expectEndedSession?: boolean; readonly expectRefusedWebhook?: boolean } = {}
): Promise<{ context: BrowserContext; page: Page }> => {
  const context = await browser.newContext()
  contexts.push(context)
  const page = await context.newPage()
  page.on("console", (m) => {
    if (m.type() !== "error") return
    const unauthorized = m.text().includes("status of 401")
    const refused = unauthorized && m.location().url.endsWith("/dashboard/login")
    const ended = unauthorized && m.location().url.endsWith("/dashboard/live")
    const refusedWebhook = m.text().includes("status of 400") && m.location().url.endsWith("/dashboard/webhooks")
    if (!(options.expectRefusedSignIn && refused) && !(options.expectEndedSession && ended) && !(options.expectRefusedWebhook && refusedWebhook)) {
      problems.push(`console: ${m.text()} (${m.location().url})`)
    }
  })
  page.on("pageerror", (e) => problems.push(`pageerror: ${e.message}`))
  page.on("dialog", (d) => {
    problems.push(`dialog: ${d.message()}`)
    void d.dismiss()
  })
  return { context, page }
}

const signIn = async (page: Page, key: string) => {
  await page.goto(`${base}/dashboard/`)
  await page.waitForURL(/\/dashboard\/login$/)
  await page.fill("input[name=key]", key)
  await page.click("button[type=submit]")
  await page.waitForSelector("#stage-rows")
}

/** A gated job (held until `openGate()`), its page open as the admin once it reads as running. */
const openRunningGatedJob = async (n: number) => {
  gate = new Promise<void>((resolve) => (openGate = resolve))
  const [job] = await enqueue([{ stage: "gated", payload: { n }, orgId: "acme" }])
  const { context, page } = await newPage()
  await signIn(page, keys.admin)
  await page.goto(`${base}/dashboard/jobs/${job!.id}`)
  await expect.poll(() => page.locator("[data-job-field=status]").textContent(), { timeout: 60_000 }).toBe("running")
  return { context, job: job!, page }
}

const cell = (page: Page, stage: string, field: string) => page.locator(`tr[data-stage="${stage}"] [data-field="${field}"]`)

beforeAll(async () => {
  runtime = ManagedRuntime.make(layer)
  base = await run(baseUrl)
  for (const [name, options] of [["admin", { admin: true }], ["acme", { orgId: "acme" }], ["globex", { orgId: "globex" }]] as const) {
    const { token } = await run(Effect.flatMap(ApiKeys.ApiKeys, (k) => k.create(options)))
    keys[name] = Redacted.value(token)
  }
  browser = await launch()
}, 180_000)

afterAll(async () => {
  openGate()
  await browser?.close()
  await runtime?.dispose()
  Fs.rmSync(storageDir, { recursive: true, force: true })
}, 120_000)

describe("the dashboard in a real browser", () => {
  it("refuses a wrong key, signs in with a key into an HttpOnly SameSite=Strict session, under a strict CSP", async () => {
    const { context, page } = await newPage({ expectRefusedSignIn: true })
    await page.goto(`${base}/dashboard/login`)
    await page.fill("input[name=key]", "pgf_000000000000_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
    await page.click("button[type=submit]")
    await expect.poll(() => page.locator("[role=alert]").textContent()).toContain("not valid")
    expect(await context.cookies()).toEqual([])

    const response = await page.goto(`${base}/dashboard/login`)
    const csp = response!.headers()["content-security-policy"]!
    expect(csp).toContain("script-src 'self'")
    expect(csp).not.toContain("unsafe-inline")
    await signIn(page, keys.admin)
    const [cookie] = await context.cookies()
    expect(cookie).toMatchObject({ name: "pgfiber_dashboard", httpOnly: true, sameSite: "Strict", path: "/dashboard" })
    expect(await page.locator("header .who").textContent()).toContain("operator")
    // the API still wants its bearer key: the dashboard's cookie opens nothing there
    const api = await page.request.get(`${base}/api/jobs`)
    expect(api.status()).toBe(401)
    await context.close()
  })

  it("shows a stage's counts change live as jobs are enqueued, run and complete, without a reload", async () => {
    const { context, page } = await newPage()
    await signIn(page, keys.admin)
    await expect.poll(() => page.locator("#live-status").textContent(), { timeout: 60_000 }).toBe("live")
    let navigations = 0
    page.on("framenavigated", () => navigations++)
    expect(await cell(page, "gated", "running").textContent()).toBe("0")

    await enqueue([1, 2, 3].map((n) => ({ stage: "gated", payload: { n }, orgId: "acme" })))
    // the jobs show up queued or running (how many the pool holds at once is its business), then running
    const count = async (field: string) => Number(await cell(page, "gated", field).textContent())
    await expect.poll(async () => (await count("ready")) + (await count("running")), { timeout: 60_000 }).toBe(3)
    await expect.poll(() => count("running"), { timeout: 60_000 }).toBeGreaterThan(0)
    expect(await page.locator("#worker-rows").textContent()).toContain("dashboard-test")

    openGate()
    await expect.poll(async () => [await cell(page, "gated", "running").textContent(), await cell(page, "gated", "ready").textContent()], { timeout: 60_000 })
      .toEqual(["0", "0"])
    expect(navigations).toBe(0)
    gate = new Promise<void>((resolve) => (openGate = resolve))
    await context.close()
  })

  it("draws the last hour from the per-minute counts", async () => {
    await enqueue(Array.from({ length: 30 }, (_, n) => ({ stage: "echo", payload: { n }, orgId: n % 2 === 0 ? "acme" : "globex" })))
    const { context, page } = await newPage()
    await signIn(page, keys.admin)
    // the counts reach the per-minute table within a flush (500 ms here), and the pages within a snapshot
    await expect.poll(async () => {
      await page.reload()
      return page.locator("#chart-throughput canvas").count()
    }, { timeout: 60_000 }).toBeGreaterThan(0)
    const completedOf = async (org: string) => {
      await page.goto(`${base}/dashboard/orgs`)
      const rows = await page.locator("#orgs tbody tr").evaluateAll((trs) =>
        trs.map((tr) => Array.from((tr as { children: ArrayLike<{ textContent: string | null }> }).children, (c) => c.textContent ?? "")))
      return Number(rows.find((r) => r[0] === org)?.[4] ?? 0)
    }
    await expect.poll(() => completedOf("acme"), { timeout: 60_000 }).toBeGreaterThanOrEqual(15)
    await expect.poll(() => completedOf("globex"), { timeout: 60_000 }).toBeGreaterThanOrEqual(15)
    await context.close()
  })

  it("opens a job: its payload (a <script> shown as text), attempts, timeline and related jobs", async () => {
    const payload = { text: "<script>alert('owned')</script><img src=x onerror=alert(2)>", call: "c-1" }
    const [first] = await enqueue([
      { stage: "notes", payload, orgId: "acme", subjectId: "call-42" },
      { stage: "notes", payload: { text: "second" }, orgId: "acme", subjectId: "call-42" }
    ])
    const { context, page } = await newPage()
    await signIn(page, keys.admin)
    await page.goto(`${base}/dashboard/jobs?subject=call-42`)
    await page.click(`tr[data-job="${first!.id}"] a`)
    await page.waitForSelector("#payload")
    expect(await page.locator("#payload").textContent()).toContain("<script>alert('owned')</script>")
    // nothing of the payload became markup
    expect(await page.locator("main img").count()).toBe(0)
    expect(await page.locator("main script:not([type='application/json'])").count()).toBe(0)
    expect(await page.locator("[data-job-field=status]").textContent()).toBe("queued")
    expect(await page.locator("text=Related jobs").count()).toBe(1)
    expect(await page.locator("table.jobs tbody tr").count()).toBe(1)
    if (process.env.DASHBOARD_SCREENSHOTS === "1") {
      await page.setViewportSize({ width: 1200, height: 900 })
      await page.screenshot({ path: Path.resolve(import.meta.dirname, "../../docs/dashboard-job.png"), fullPage: true })
      await page.goto(`${base}/dashboard/`)
      await page.waitForSelector("#chart-throughput canvas")
      await page.screenshot({ path: Path.resolve(import.meta.dirname, "../../docs/dashboard-overview.png"), fullPage: true })
    }
    await context.close()
  })

  it("retries a dead letter with one click, and resolves in bulk after a confirmation", async () => {
    const [dying] = await enqueue([{ stage: "echo", payload: { n: 7, fail: true }, orgId: "globex" }])
    const dead = await run(Effect.gen(function*() {
      const q = yield* Queue.Queue
      for (;;) {
        const list = yield* q.deadLetters.list({})
        const found = list.find((d) => d.jobId === dying!.id)
        if (found) return found
        yield* Effect.sleep("100 millis")
      }
    }).pipe(Effect.timeout("30 seconds")))
    const { context, page } = await newPage()
    await signIn(page, keys.admin)
    await page.goto(`${base}/dashboard/dead`)
    await page.click(`tr[data-dead-letter="${dead.id}"] button[data-action=retry]`)
    await expect.poll(() => page.locator("[role=status]").textContent()).toContain(`dead letter ${dead.id} retried as job`)
    const retried = await run(Effect.flatMap(Queue.Queue, (q) => q.deadLetters.get(dead.id)))
    expect(retried?.resolutionStatus).toBe("retried")

    // the retried job fails again (it asks to): resolve every open one of echo in bulk, after confirming
    await run(Effect.gen(function*() {
      const q = yield* Queue.Queue
      while ((yield* q.deadLetters.list({ stage: "echo" })).length === 0) yield* Effect.sleep("100 millis")
    }).pipe(Effect.timeout("30 seconds")))
    await page.goto(`${base}/dashboard/dead?stage=echo`)
    await page.selectOption("select[name=action]", "resolve")
    await page.fill("form[action$='/dead/bulk'] input[name=notes]", "known bad input")
    await page.click("form[action$='/dead/bulk'] button")
    await page.waitForSelector("#confirm")
    expect(await page.locator("main p").first().textContent()).toMatch(/Resolve 1 open dead letter\(s\) of stage echo/)
    await page.click("#confirm")
    await expect.poll(() => page.locator("[role=status]").textContent()).toContain("1 dead letter(s) resolved")
    expect(await run(Effect.flatMap(Queue.Queue, (q) => q.deadLetters.list({ stage: "echo" })))).toEqual([])
    await context.close()
  })

  it("an org key sees its own org's jobs only, on every page and in the live view", async () => {
    const [secret] = await enqueue([{ stage: "notes", payload: { text: "acme only" }, orgId: "acme", subjectId: "shared-subject" }])
    const [own] = await enqueue([{ stage: "notes", payload: { text: "globex" }, orgId: "globex", subjectId: "shared-subject" }])
    const { context, page } = await newPage()
    await signIn(page, keys.globex)
    expect(await page.locator("header .who").textContent()).toContain("org globex")
    // this process's pools count every org's jobs: not shown to an org
    expect(await page.locator("text=Pools in this process").count()).toBe(0)
    await page.goto(`${base}/dashboard/jobs`)
    const listed = await page.locator("tr[data-job]").evaluateAll((rows) => rows.map((r) => r.getAttribute("data-job")))
    expect(listed).toContain(own!.id)
    expect(listed).not.toContain(secret!.id)
    // asking for another org is ignored for an org key
    await page.goto(`${base}/dashboard/jobs?org=acme&subject=shared-subject`)
    expect(await page.locator("tr[data-job]").evaluateAll((rows) => rows.map((r) => r.getAttribute("data-job")))).toEqual([own!.id])
    // (not navigated to: a 404 document is a console error, and this page records every one)
    expect((await page.request.get(`${base}/dashboard/jobs/${secret!.id}`)).status()).toBe(404)
    await page.goto(`${base}/dashboard/jobs/${own!.id}`)
    expect(await page.locator("table.jobs").textContent()).not.toContain(secret!.id)
    await page.goto(`${base}/dashboard/orgs`)
    expect(await page.locator("#orgs").textContent()).not.toContain("acme")
    // the live stream of another org's job says only that it is not there
    const events = await page.evaluate(async (url) =>
      new Promise<string>((resolve) => {
        const source = new EventSource(url)
        source.addEventListener("job", (e) => {
          source.close()
          resolve((e as MessageEvent).data)
        })
      }), `${base}/dashboard/live/jobs/${secret!.id}`)
    expect(JSON.parse(events)).toEqual({ gone: true })
    await context.close()
  })

  it("pauses and resumes a stage; a finished job's page shows it completed, from the kept history", async () => {
    openGate()
    const { context, page } = await newPage()
    await signIn(page, keys.admin)
    await page.click(`tr[data-stage="gated"] button[data-action=pause]`)
    await expect.poll(() => page.locator("[role=status]").textContent()).toContain("stage gated paused")
    await expect.poll(() => cell(page, "gated", "state").textContent(), { timeout: 60_000 }).toBe("paused")
    const [held] = await enqueue([{ stage: "gated", payload: { n: 9 }, orgId: "acme" }])
    await expect.poll(() => cell(page, "gated", "ready").textContent(), { timeout: 60_000 }).toBe("1")
    expect(await cell(page, "gated", "running").textContent()).toBe("0")

    await page.click(`tr[data-stage="gated"] button[data-action=resume]`)
    await expect.poll(() => page.locator("[role=status]").textContent()).toContain("stage gated resumed")
    await expect.poll(() => cell(page, "gated", "ready").textContent(), { timeout: 60_000 }).toBe("0")
    expect(await cell(page, "gated", "state").textContent()).toBe("")
    await expect.poll(async () => {
      await page.goto(`${base}/dashboard/jobs/${held!.id}`)
      return page.locator("[data-job-field=status]").textContent()
    }, { timeout: 60_000 }).toBe("completed")
    expect(await page.locator("text=first run started").count()).toBe(1)
    // an org key may not pause a stage (stage controls are shared by every org)
    const org = await newPage()
    await signIn(org.page, keys.acme)
    expect(await org.page.locator("button[data-action=pause]").count()).toBe(0)
    await org.context.close()
    await context.close()
  })

  it("shows a stage held back by its rate limit as rate limited", async () => {
    const { context, page } = await newPage()
    await signIn(page, keys.admin)
    await enqueue([1, 2, 3].map((n) => ({ stage: "metered", payload: { n }, orgId: "acme" })))
    // the first job spends the hour's token; the other two wait for the next one
    await expect.poll(() => cell(page, "metered", "state").textContent(), { timeout: 60_000 }).toBe("rate limited")
    expect(await cell(page, "metered", "ready").textContent()).toBe("2")
    await context.close()
  })

  it("a running job's page follows it live to its end, without the user reloading", async () => {
    const { context, page } = await openRunningGatedJob(11)
    expect(await page.locator("[data-job-field=lockedBy]").textContent()).toContain("dashboard-test")
    openGate()
    // the job leaves the live table; the page reloads itself once and shows it from the kept history
    await expect.poll(() => page.locator("[data-job-field=status]").textContent(), { timeout: 60_000 }).toBe("completed")
    await context.close()
  })

  it("without a session nothing is shown or streamed; revoking the key ends its sessions", async () => {
    const { context, page } = await newPage({ expectEndedSession: true })
    expect((await page.request.get(`${base}/dashboard/live`)).status()).toBe(401)
    const jobs = await page.request.get(`${base}/dashboard/jobs`, { maxRedirects: 0 })
    expect([jobs.status(), jobs.headers()["location"]]).toEqual([303, "/dashboard/login"])

    const { key, token } = await run(Effect.flatMap(ApiKeys.ApiKeys, (k) => k.create({ orgId: "acme", name: "short-lived" })))
    await signIn(page, Redacted.value(token))
    await run(Effect.flatMap(ApiKeys.ApiKeys, (k) => k.revoke(key.prefix)))
    await page.goto(`${base}/dashboard/jobs`)
    await page.waitForURL(/\/dashboard\/login$/)
    await context.close()
  })

  it("lists schedules and disables, enables and runs one now through the schedules service", async () => {
    await run(Effect.gen(function*() {
      const store = yield* PgSchedules.makeStore
      const schedules = yield* Schedules.make(store)
      yield* schedules.put({ name: "nightly-notes", stage: "notes", cron: "0 3 * * *", orgId: "acme", payload: { text: "nightly" } })
    }))
    const { context, page } = await newPage()
    await signIn(page, keys.acme)
    await page.goto(`${base}/dashboard/schedules`)
    await page.click(`tr[data-schedule="nightly-notes"] button[data-action=disable]`)
    await expect.poll(() => page.locator("[role=status]").textContent()).toContain("schedule nightly-notes disabled")
    await page.click(`tr[data-schedule="nightly-notes"] button[data-action=enable]`)
    await expect.poll(() => page.locator("[role=status]").textContent()).toContain("schedule nightly-notes enabled")
    await page.click(`tr[data-schedule="nightly-notes"] button[data-action=run-now]`)
    await expect.poll(() => page.locator("[role=status]").textContent()).toMatch(/schedule nightly-notes ran now: job \d+/)
    // another org's key does not see it
    const other = await newPage()
    await signIn(other.page, keys.globex)
    await other.page.goto(`${base}/dashboard/schedules`)
    expect(await other.page.locator(`tr[data-schedule="nightly-notes"]`).count()).toBe(0)
    await other.context.close()
    await context.close()
  })

  it("pages through jobs with a cursor, filters by stage, status and org, and finds one by id", async () => {
    const made = await enqueue(Array.from({ length: 55 }, (_, n) => ({ stage: "notes", payload: { page: n }, orgId: "initech" })))
    const { context, page } = await newPage()
    await signIn(page, keys.admin)
    // a date JavaScript reads but PostgreSQL cannot hold is ignored like any bad date, never a 500
    for (const since of ["0000-01-01T00:00:00Z", "+010000-01-01T00:00:00Z"]) {
      const response = await page.goto(`${base}/dashboard/jobs?since=${encodeURIComponent(since)}`)
      expect(response?.status(), since).toBe(200)
    }
    await page.goto(`${base}/dashboard/jobs?stage=notes&status=queued&org=initech`)
    const ids = () => page.locator("tr[data-job]").evaluateAll((rows) => rows.map((r) => r.getAttribute("data-job")))
    const first = await ids()
    expect(first.length).toBe(50)
    await page.click("#next-page")
    const second = await ids()
    expect([...first, ...second].sort()).toEqual(made.map((m) => m.id).sort())
    expect(await page.locator("#next-page").count()).toBe(0)
    await page.goto(`${base}/dashboard/jobs?id=${made[7]!.id}`)
    expect(await ids()).toEqual([made[7]!.id])
    await context.close()
  })

  it("refuses a POST without the session's CSRF token", async () => {
    const { context, page } = await newPage()
    await signIn(page, keys.admin)
    const response = await page.request.post(`${base}/dashboard/dead/purge`, { form: { hours: "0", unresolved: "1", confirm: "yes" } })
    expect(response.status()).toBe(403)
    await context.close()
  })

  it("cancels a queued job only after a confirmation; going back leaves it queued", async () => {
    const [job] = await enqueue([{ stage: "notes", payload: { text: "to be cancelled" }, orgId: "acme" }])
    const status = () => run(Effect.flatMap(Queue.Queue, (q) => q.get(job!.id))).then((j) => j?.status ?? "gone")
    const { context, page } = await newPage()
    await signIn(page, keys.acme)
    await page.goto(`${base}/dashboard/jobs/${job!.id}`)
    expect(await page.locator("[data-job-field=status]").textContent()).toBe("queued")

    // the first click asks; nothing is cancelled yet, and "go back" keeps it that way
    await page.click("button[data-action=cancel]")
    await page.waitForSelector("#confirm")
    expect(await page.locator("#question").textContent()).toContain(`Cancel job ${job!.id} (notes, org acme), now queued?`)
    expect(await status()).toBe("queued")
    await page.click("#back")
    await page.waitForURL(new RegExp(`/dashboard/jobs/${job!.id}$`))
    expect(await page.locator("[data-job-field=status]").textContent()).toBe("queued")
    expect(await status()).toBe("queued")

    // asked again and confirmed: cancelled, and the page says so (from the kept history)
    await page.click("button[data-action=cancel]")
    await page.waitForSelector("#confirm")
    await page.click("#confirm")
    await expect.poll(() => page.locator("[role=status]").textContent(), { timeout: 60_000 }).toContain("job cancelled")
    expect(await page.locator("[data-job-field=status]").textContent()).toBe("cancelled")
    expect(await page.locator("button[data-action=cancel]").count()).toBe(0)
    expect(await status()).toBe("cancelled")
    await context.close()
  })

  it("cancels a running job after a confirmation, and its page follows it to cancelled", async () => {
    const { context, job, page } = await openRunningGatedJob(21)
    await page.click("button[data-action=cancel]")
    await page.waitForSelector("#confirm")
    expect(await page.locator("#question").textContent()).toContain(`Cancel job ${job.id} (gated, org acme), now running?`)
    await page.click("#confirm")
    await expect.poll(() => page.locator("[role=status]").textContent(), { timeout: 60_000 }).toMatch(/job cancell(ing|ed)/)
    // its worker stops it; the page (live, or reloaded) shows it cancelled
    await expect.poll(async () => {
      const shown = await page.locator("[data-job-field=status]").textContent()
      if (shown !== "cancelled") await page.reload()
      return page.locator("[data-job-field=status]").textContent()
    }, { timeout: 60_000 }).toBe("cancelled")
    openGate()
    await context.close()
  })

  it("purges a stage's queued jobs (every org's) from the overview after a confirmation; operators only", async () => {
    const made = await enqueue([1, 2, 3, 4].map((n) => ({ stage: "parked", payload: { n }, orgId: n % 2 === 0 ? "acme" : "globex" })))
    // still queued (a purged job stays readable in the history, cancelled)
    const exists = () => run(Effect.flatMap(Queue.Queue, (q) => Effect.forEach(made, (m) => q.get(m.id)))).then((js) => js.filter((j) => j?.status === "queued").length)

    // an org's key: no purge button, and a POST with its own CSRF token is refused, whatever it claims
    const org = await newPage()
    await signIn(org.page, keys.acme)
    expect(await org.page.locator("button[data-action=purge]").count()).toBe(0)
    const csrf = await org.page.locator("header input[name=_csrf]").getAttribute("value")
    const refused = await org.page.request.post(`${base}/dashboard/stages/parked/purge`, { form: { _csrf: csrf!, confirm: "yes" } })
    expect(refused.status()).toBe(403)
    expect(await exists()).toBe(4)
    await org.context.close()

    const { context, page } = await newPage()
    await signIn(page, keys.admin)
    await expect.poll(() => cell(page, "parked", "ready").textContent(), { timeout: 60_000 }).toBe("4")
    await page.click(`tr[data-stage="parked"] button[data-action=purge]`)
    await page.waitForSelector("#confirm")
    expect(await page.locator("#question").textContent()).toContain("Delete the 4 queued job(s) of stage parked, of every org?")
    expect(await exists()).toBe(4)
    await page.click("#confirm")
    await expect.poll(() => page.locator("[role=status]").textContent(), { timeout: 60_000 }).toContain("stage parked: 4 queued job(s) purged")
    await expect.poll(() => cell(page, "parked", "ready").textContent(), { timeout: 60_000 }).toBe("0")
    expect(await exists()).toBe(0)
    await context.close()
  })

  it("bulk-cancels 1,000 jobs chosen by a payload search: select all matching, a count to confirm, then done; another org's are untouched", async () => {
    const campaign = { campaign: "spring-sale" }
    await enqueue(Array.from({ length: 1000 }, (_, n) => ({ stage: "notes", payload: { ...campaign, n }, orgId: "acme" })))
    await enqueue(Array.from({ length: 20 }, (_, n) => ({ stage: "notes", payload: { campaign: "other", n }, orgId: "acme" })))
    await enqueue(Array.from({ length: 30 }, (_, n) => ({ stage: "notes", payload: { ...campaign, n }, orgId: "globex" })))
    const left = (org: string, c: string) =>
      run(Effect.flatMap(Queue.Queue, (q) => q.bulk.preview({ stage: "notes", org, payload: { campaign: c } }, { kind: "cancel" })))
    const { context, page } = await newPage()
    await signIn(page, keys.acme)
    await page.goto(`${base}/dashboard/jobs?stage=notes`)
    await page.fill("input[name=payload]", "campaign=spring-sale")
    await page.click("form.filters[method=get] button[type=submit]")
    await page.waitForURL(/payload=campaign/)
    // the page shows 50 of them; the action is on every one that matches
    expect(await page.locator("table.jobs tbody tr[data-job]").count()).toBe(50)
    await page.click("#bulk-select-all")
    await page.waitForSelector("#confirm")
    expect(await page.locator("#question").textContent()).toContain("Cancel 1000 live job(s) matching stage notes, payload campaign=spring-sale?")
    expect(await left("acme", "spring-sale")).toBe(1000)
    await page.click("#confirm")
    await expect.poll(() => page.locator("[role=status]").textContent(), { timeout: 60_000 }).toContain("1000 job(s) cancelled")
    expect(await left("acme", "spring-sale")).toBe(0)
    expect(await left("acme", "other")).toBe(20)
    expect(await left("globex", "spring-sale")).toBe(30)
    // the list it returns to shows them cancelled, from the kept history
    expect(await page.locator("table.jobs tbody tr[data-job] .badge").first().textContent()).toBe("cancelled")
    await context.close()

    // an operator's filter reaches every org unless it names one: here globex's 30, given priority 5
    const admin = await newPage()
    await signIn(admin.page, keys.admin)
    await admin.page.goto(`${base}/dashboard/jobs?stage=notes&org=globex&payload=${encodeURIComponent(JSON.stringify(campaign))}`)
    await admin.page.selectOption("#bulk-action", "priority")
    await admin.page.fill("form#bulk input[name=priority]", "5")
    await admin.page.click("#bulk-select-all")
    await admin.page.waitForSelector("#confirm")
    expect(await admin.page.locator("#question").textContent()).toContain("Set priority 5 on 30 live job(s) matching stage notes, org globex")
    await admin.page.click("#confirm")
    await expect.poll(() => admin.page.locator("[role=status]").textContent(), { timeout: 60_000 }).toContain("30 job(s) given priority 5")
    const reprioritised = await run(Effect.flatMap(Queue.Queue, (q) => q.list({ stage: "notes", payload: campaign, limit: 1000 })))
    expect(reprioritised.filter((j) => j.orgId === "globex").map((j) => j.priority)).toEqual(Array(30).fill(5))
    const [recorded] = await run(Effect.flatMap(Queue.Queue, (q) => q.bulk.actions({ limit: 1 })))
    expect(recorded).toMatchObject({ action: "priority", priority: 5, matched: 30, affected: 30, actor: expect.stringMatching(/^dashboard \(key \d+\)$/) })
    await admin.context.close()
  })

  it("adds a webhook from the Webhooks page: a private target refused on the page, the secret shown once, removed after a confirmation", async () => {
    const { context, page } = await newPage({ expectRefusedWebhook: true })
    await signIn(page, keys.acme)
    await page.click("header a[href='/dashboard/webhooks']")
    await page.waitForSelector("#add-webhook")
    // as deployed: a private target is refused, with the reason on the page and the URL kept in the form
    await page.fill("#add-webhook input[name=url]", "http://10.0.0.1/hook")
    await page.click("#add-webhook button[type=submit]")
    await expect.poll(() => page.locator("[role=alert]").textContent()).toContain("loopback, private or link-local")
    expect(await page.locator("#add-webhook input[name=url]").inputValue()).toBe("http://10.0.0.1/hook")
    // a public address (an IP, so no name to resolve), the completed and dead kinds only
    await page.fill("#add-webhook input[name=url]", "https://203.0.113.7/hook")
    await page.uncheck("#add-webhook input[name=kinds][value=cancelled]")
    await page.click("#add-webhook button[type=submit]")
    const secret = await page.locator("#webhook-secret").textContent()
    expect(secret).toMatch(/^whsec_/)
    await page.click("#back")
    const row = page.locator("#webhooks tbody tr[data-webhook]")
    await expect.poll(() => row.count()).toBe(1)
    expect(await row.locator("[data-field=kinds]").textContent()).toBe("completed, dead")
    expect(await page.content()).not.toContain(secret!)
    await row.locator("button[data-action=remove]").click()
    await page.waitForSelector("#confirm")
    expect(await page.locator("#question").textContent()).toContain("https://203.0.113.7/hook")
    await page.click("#confirm")
    await expect.poll(() => page.locator("[role=status]").textContent()).toMatch(/webhook \d+ removed/)
    expect(await page.locator("#webhooks tbody tr[data-webhook]").count()).toBe(0)
    await context.close()
  })

  it("had no console error, page error or dialog on any page; every closed page's live stream has ended", async () => {
    expect(problems).toEqual([])
    await Promise.all(contexts.map((c) => c.close()))
    await expect.poll(() => run(Effect.flatMap(Dashboard.Dashboard, (d) => d.viewers)), { timeout: 60_000 }).toBe(0)
  })
})
