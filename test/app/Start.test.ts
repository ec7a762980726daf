/**
 * The README's quick start, as a test: `npm start` on a machine with no PostgreSQL (no DATABASE_URL) brings up
 * embedded PostgreSQL, applies the migrations, stays up, and on SIGINT (and SIGTERM) shuts down and exits 0,
 * leaving no server behind.
 */
import { describe, expect, it } from "vitest"
import { spawn } from "node:child_process"
import * as Fs from "node:fs"
import * as Net from "node:net"
import * as Os from "node:os"
import * as Path from "node:path"

const root = Path.resolve(import.meta.dirname, "../..")

const freePort = () =>
  new Promise<number>((resolve) => {
    const server = Net.createServer().listen(0, "127.0.0.1", () => {
      const port = (server.address() as Net.AddressInfo).port
      server.close(() => resolve(port))
    })
  })

const startService = (dataDir: string, httpPort: number) => {
  const env: Record<string, string | undefined> = {
    ...process.env,
    PGFIBER_DATA_DIR: dataDir,
    LOG_LEVEL: "info",
    HTTP_HOST: "127.0.0.1",
    HTTP_PORT: String(httpPort),
    // any free port: several test runs share this machine
    ADMIN_PORT: "0"
  }
  delete env.DATABASE_URL
  delete env.SPEECHKIT_API_KEY
  delete env.TRANSCRIBE_URL
  const child = spawn(process.execPath, ["--import", "tsx", "src/main.ts", "start"], { cwd: root, env, stdio: ["ignore", "pipe", "pipe"] })
  let output = ""
  child.stdout.on("data", (d) => (output += d))
  child.stderr.on("data", (d) => (output += d))
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)))
  return { child, exited, output: () => output }
}

const waitFor = async (what: string, check: () => boolean, ms = 60_000) => {
  const deadline = Date.now() + ms
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 50))
  }
}

/** The embedded server writes postmaster.pid while it runs and removes it when it stops. */
const serverRunning = (dataDir: string) => Fs.existsSync(Path.join(dataDir, "postgres", "postmaster.pid"))

describe("npm start on a machine with no PostgreSQL", () => {
  for (const signal of ["SIGINT", "SIGTERM"] as const) {
    it(`starts embedded PostgreSQL, migrates, and exits 0 on ${signal}`, async () => {
      const dataDir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "pgfiber-start-"))
      const service = startService(dataDir, await freePort())
      try {
        await waitFor("the migrations", () => service.output().includes("migrations applied"))
        expect(service.output()).toContain("0001_queue")
        expect(serverRunning(dataDir)).toBe(true)
        service.child.kill(signal)
        const code = await service.exited
        expect({ code, output: code === 0 ? "" : service.output() }).toEqual({ code: 0, output: "" })
        expect(serverRunning(dataDir)).toBe(false)
        // the data is kept: a second start finds the schema up to date
        const again = startService(dataDir, await freePort())
        await waitFor("the second start", () => again.output().includes("pgfiber starting"))
        await new Promise((r) => setTimeout(r, 1500))
        expect(again.output()).not.toContain("migrations applied")
        again.child.kill(signal)
        expect(await again.exited).toBe(0)
      } finally {
        if (service.child.exitCode === null) service.child.kill("SIGKILL")
        Fs.rmSync(dataDir, { recursive: true, force: true })
      }
    }, 90_000)
  }
})
