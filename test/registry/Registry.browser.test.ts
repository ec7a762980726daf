/**
 * The stage registry from the dashboard, in a real Chromium: a user's own worker process
 * (test/fixtures/probeWorker.ts, importing the built package by name) runs `probe.work`, which the service
 * never compiled. An operator pauses and resumes it, enqueues to it from the "new job" form built from its
 * registered JSON Schema (a mismatching payload is refused naming the field), runs a delayed job now, retries its
 * dead letter and edits its limits; once the worker stops cleanly the stage is still shown, with no live process;
 * an org's key sees public stages only, in the stages page and in the filters.
 * The fixture loads dist/ (as `import "pgfiber"` does): after changing src/, `npm run build` before this file.
 */
import { Effect, ManagedRuntime, Redacted } from "effect"
import { type ChildProcess, spawn } from "node:child_process"
import type { Browser, BrowserContext, Page } from "playwright-core"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as ApiKeys from "../../packages/service/src/auth/ApiKeys.js"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import { launch } from "../dashboard/browser.js"
import { baseUrl, layerService, query } from "../http/support.js"
import { databaseUrl, layerDb } from "../support/pg.js"
import { fixture } from "../support/workerProcess.js"

const service = layerService(layerDb())
let runtime: ManagedRuntime.ManagedRuntime<any, any>
let browser: Browser
let base = ""
let schema = ""
let worker: ChildProcess | undefined
let workerOutput = ""
const keys = { admin: "", acme: "" }
const problems: Array<string> = []
const contexts: Array<BrowserContext> = []

const run = <A, E>(effect: Effect.Effect<A, E, any>) => runtime.runPromise(effect)

const newPage = async (): Promise<Page> => {
  const context = await browser.newContext()
  contexts.push(context)
  const page = await context.newPage()
  page.on("console", (m) => {
    // a refused form (400) is reported on the console: expected where the test submits one
    if (m.type() === "error" && !m.text().includes("status of 400")) problems.push(`console: ${m.text()}`)
  })
  page.on("pageerror", (e) => problems.push(`pageerror: ${e.message}`))
  return page
}

const signIn = async (page: Page, key: string) => {
  await page.goto(`${base}/dashboard/login`)
  await page.fill("input[name=key]", key)
  await page.click("button[type=submit]")
  await page.waitForSelector("#stage-rows")
}

const probeRow = (page: Page, field: string) => page.locator(`#registry tr[data-stage="probe.work"] [data-field="${field}"]`)

beforeAll(async () => {
  runtime = ManagedRuntime.make(service)
  base = await run(baseUrl)
  schema = (await run(Db.Db)).schema
  for (const [name, options] of [["admin", { admin: true }], ["acme", { orgId: "acme" }]] as const) {
    const { token } = await run(Effect.flatMap(ApiKeys.ApiKeys, (k) => k.create(options)))
    keys[name] = Redacted.value(token)
  }
  worker = spawn(process.execPath, ["--import", "tsx", fixture("probeWorker.ts")], {
    env: { ...process.env, DATABASE_URL: databaseUrl(), PGFIBER_SCHEMA: schema, WORKER_ID: "probe-browser", LOG_LEVEL: "warn" },
    stdio: ["ignore", "pipe", "pipe"]
  })
  worker.stdout!.on("data", (d) => (workerOutput += d))
  worker.stderr!.on("data", (d) => (workerOutput += d))
  browser = await launch()
}, 180_000)

afterAll(async () => {
  for (const c of contexts) await c.close().catch(() => undefined)
  await browser?.close()
  if (worker && worker.exitCode === null) {
    const exited = new Promise((resolve) => worker!.once("exit", resolve))
    worker.kill("SIGTERM")
    await exited
  }
  await runtime?.dispose()
}, 120_000)

describe("the stage registry in the dashboard", () => {
  it("an operator pauses, enqueues to (checked by the registered JSON Schema), retries and limits a stage only a user's worker runs", async () => {
    const page = await newPage()
    await signIn(page, keys.admin)
    await page.goto(`${base}/dashboard/stages`)
    await expect.poll(async () => {
      await page.reload()
      return (await probeRow(page, "live").count()) > 0 ? await probeRow(page, "live").textContent() : workerOutput.slice(-2000)
    }, { timeout: 90_000 }).toBe("1 live")

    // pause and resume from the overview
    await page.goto(`${base}/dashboard/`)
    await page.click(`tr[data-stage="probe.work"] button[data-action=pause]`)
    await expect.poll(() => page.locator(`tr[data-stage="probe.work"] [data-field=state]`).textContent()).toBe("paused")
    await page.click(`tr[data-stage="probe.work"] button[data-action=resume]`)
    await expect.poll(() => page.locator(`tr[data-stage="probe.work"] [data-field=state]`).textContent()).not.toBe("paused")

    // the "new job" form, from the registered JSON Schema: a mismatch is refused naming the field
    await page.goto(`${base}/dashboard/stages/probe.work/new`)
    expect(await page.locator("input[name='f.customer']").getAttribute("type")).toBe("number")
    await page.fill("textarea[name=payload]", `{"customer":"forty-two"}`)
    await page.click("#enqueue")
    await expect.poll(() => page.locator("[role=alert]").textContent()).toContain("payload.customer")
    await page.fill("textarea[name=payload]", "")
    await page.fill("input[name='f.customer']", "42")
    await page.fill("input[name='f.note']", "from the dashboard")
    await page.click("#enqueue")
    await page.waitForURL(/\/dashboard\/jobs\/\d+/)
    const jobId = /\/jobs\/(\d+)/.exec(page.url())![1]!
    expect(await page.locator("[role=status]").textContent()).toContain(`job ${jobId} enqueued`)
    const [row] = await run(query<{ payload: unknown; stage: string }>(schema, `select payload, stage from jobs where id = ${jobId} union all select payload, stage from jobs_archive where id = ${jobId}`))
    expect(row).toEqual({ stage: "probe.work", payload: { customer: 42, note: "from the dashboard" } })

    // a job that fails for good, retried from its page
    await page.goto(`${base}/dashboard/stages/probe.work/new`)
    await page.fill("input[name='f.customer']", "7")
    await page.check("input[name='f.fail']")
    await page.click("#enqueue")
    await page.waitForURL(/\/dashboard\/jobs\/\d+/)
    const failingId = /\/jobs\/(\d+)/.exec(page.url())![1]!
    await expect.poll(async () => {
      await page.goto(`${base}/dashboard/jobs/${failingId}`)
      return page.locator("button[data-action=retry]").count()
    }, { timeout: 60_000 }).toBe(1)
    await page.click("button[data-action=retry]")
    await expect.poll(() => page.locator("[role=status]").textContent()).toMatch(/retried as job \d+/)

    // a delayed job run now
    await page.goto(`${base}/dashboard/stages/probe.work/new`)
    await page.fill("input[name='f.customer']", "9")
    await page.fill("input[name=delaySeconds]", "3600")
    await page.click("#enqueue")
    await page.waitForURL(/\/dashboard\/jobs\/\d+/)
    const delayedId = /\/jobs\/(\d+)/.exec(page.url())![1]!
    expect(await page.locator("[data-job-field=status]").textContent()).toBe("delayed")
    await page.click("button[data-action=run-now]")
    await expect.poll(() => page.locator("[role=status]").textContent()).toContain(`job ${delayedId} is due now`)
    await expect.poll(async () => {
      await page.goto(`${base}/dashboard/jobs/${delayedId}`)
      return page.locator("[data-job-field=status]").textContent()
    }, { timeout: 60_000 }).toBe("completed")

    // its limits: shown as its worker declared them, then edited
    await page.goto(`${base}/dashboard/stages`)
    expect(await probeRow(page, "limits").textContent()).toContain("max running 8")
    await page.fill(`#registry tr[data-stage="probe.work"] input[name=maxRunning]`, "3")
    await page.fill(`#registry tr[data-stage="probe.work"] input[name=rate]`, "20/s")
    await page.click(`#registry tr[data-stage="probe.work"] button[data-action=limits]`)
    await expect.poll(() => page.locator("[role=status]").textContent()).toContain("limits of probe.work saved")
    expect(await probeRow(page, "limits").textContent()).toMatch(/max running 3 .*rate 20\/s.*\(override\)/)
    expect(problems).toEqual([])
  })

  it("after the user's worker stops cleanly, the stage is still there, shown with no live process; its jobs wait", async () => {
    const exited = new Promise<number | null>((resolve) => worker!.once("exit", (code) => resolve(code)))
    worker!.kill("SIGTERM")
    expect(await exited).toBe(0)
    const page = await newPage()
    await signIn(page, keys.admin)
    await page.goto(`${base}/dashboard/stages`)
    expect(await probeRow(page, "live").textContent()).toBe("no live process")
    await page.goto(`${base}/dashboard/stages/probe.work/new`)
    expect(await page.locator(".notice").textContent()).toContain("No live process runs probe.work")
    await page.fill("input[name='f.customer']", "11")
    await page.click("#enqueue")
    await page.waitForURL(/\/dashboard\/jobs\/\d+/)
    await page.goto(`${base}/dashboard/`)
    await expect.poll(() => page.locator(`tr[data-stage="probe.work"] [data-field=state]`).textContent()).toBe("no live process")
    expect(problems).toEqual([])
  })

  it("an org's key sees public stages only: the overview, the stages page and the jobs filter never list internal ones", async () => {
    // acme has a job of an internal stage (its call's analysis): it is counted nowhere on acme's overview
    await run(Effect.flatMap(Queue.Queue, (q) =>
      q.enqueue([{ stage: "analyze", payload: { callId: "00000000-0000-4000-8000-000000000001" }, orgId: "acme", delay: "1 hour" }])))
    const page = await newPage()
    await signIn(page, keys.acme)
    expect(await page.locator(`#stage-rows tr[data-stage="analyze"]`).count()).toBe(0)
    expect(await page.locator(`#stage-rows tr[data-stage="probe.work"]`).count()).toBe(1)
    await page.goto(`${base}/dashboard/stages`)
    const listed = await page.locator("#registry tbody tr").evaluateAll((rows) => rows.map((r) => r.getAttribute("data-stage")))
    expect(listed).toContain("probe.work")
    expect(listed).toContain("echo")
    for (const internal of ["analyze", "extract_audio", "transcribe_poll"]) expect(listed).not.toContain(internal)
    expect(await page.locator("#registry input[name=maxRunning]").count()).toBe(0)
    await page.goto(`${base}/dashboard/jobs`)
    const filter = await page.locator("select[name=stage] option").allTextContents()
    expect(filter).toContain("probe.work")
    expect(filter).not.toContain("analyze")
    // an internal stage's form is not found for it
    const refused = await page.goto(`${base}/dashboard/stages/analyze/new`)
    expect(refused!.status()).toBe(404)
    expect(problems.filter((p) => !p.includes("404"))).toEqual([])
  })
})
