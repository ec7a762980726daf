/**
 * The README's quick start, as a test, on the compiled service (`node dist/cli.js start`, what `npm start` runs):
 * - with no DATABASE_URL it brings up embedded PostgreSQL; CLI commands and a second service run beside it use
 *   that server (they do not start a second one on the same folder); a job submitted over HTTP with a key from the CLI runs on the echo
 *   stage; a terminal's Ctrl-C (SIGINT to the whole process group) exits 0 and leaves no postgres behind;
 * - SIGINT to node alone, and the same with an external DATABASE_URL, exit 0 too;
 * - after a `kill -9` of the service, the next start finds the server it left, says so, and comes up by itself;
 * - after a `kill -9` of its embedded server, the service says why, restarts it on the same data and port, serves
 *   again (a CLI command run meanwhile uses that server, waiting for it if need be), and Ctrl-C leaves no
 *   PostgreSQL process of the folder; a server that cannot be restarted ends the service with exit 1 and the cause.
 */
import { describe, expect, inject, it } from "vitest"
import { spawn } from "node:child_process"
import * as Fs from "node:fs"
import * as Net from "node:net"
import * as Os from "node:os"
import * as Path from "node:path"
import postgres from "postgres"
import { isAlive } from "../../packages/pgfiber/src/layers/EmbeddedPg.js"
import { waitForPromise as waitFor } from "../support/waitFor.js"

const root = Path.resolve(import.meta.dirname, "../..")
const cli = Path.join(root, "dist", "cli.js")

const freePort = () =>
  new Promise<number>((resolve) => {
    const server = Net.createServer().listen(0, "127.0.0.1", () => {
      const port = (server.address() as Net.AddressInfo).port
      server.close(() => resolve(port))
    })
  })

const baseEnv = (dataDir: string, extra: Record<string, string> = {}) => {
  const env: Record<string, string | undefined> = { ...process.env }
  for (const name of ["DATABASE_URL", "PGFIBER_SCHEMA", "SPEECHKIT_API_KEY", "TRANSCRIBE_URL", "PGFIBER_ECHO_STAGE"]) delete env[name]
  return {
    ...env,
    PGFIBER_DATA_DIR: dataDir,
    LOG_LEVEL: "info",
    LOG_FORMAT: "json",
    HTTP_HOST: "127.0.0.1",
    SHUTDOWN_GRACE_MS: "5000",
    // any free port for the admin listener: several test runs share this machine
    ADMIN_PORT: "0",
    ...extra
  }
}

/** The service in its own process group, as a terminal runs it, so the test can Ctrl-C the whole group. */
const startService = async (dataDir: string, extra: Record<string, string> = {}) => {
  const httpPort = await freePort()
  const child = spawn(process.execPath, [cli, "start"], {
    cwd: root,
    env: baseEnv(dataDir, { HTTP_PORT: String(httpPort), ...extra }),
    stdio: ["ignore", "pipe", "pipe"],
    detached: true
  })
  let output = ""
  child.stdout.on("data", (d) => (output += d))
  child.stderr.on("data", (d) => (output += d))
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)))
  return { child, exited, httpPort, base: `http://127.0.0.1:${httpPort}`, output: () => output }
}

type Service = Awaited<ReturnType<typeof startService>>

/**
 * Starts the service and waits for /healthz 200. The HTTP port is picked free just before, so on a busy machine
 * another process may take it first: then the start is tried again on a new port (every attempt is kept, so a
 * test can read what each said).
 */
const startHealthy = async (dataDir: string, services: Array<Service>, extra: Record<string, string> = {}) => {
  for (let attempt = 1; ; attempt++) {
    const service = await startService(dataDir, extra)
    services.push(service)
    try {
      await waitFor("/healthz", healthy(service))
      return service
    } catch (e) {
      if (attempt < 4 && service.child.exitCode !== null && service.output().includes("EADDRINUSE")) continue
      throw e
    }
  }
}

const runCli = (dataDir: string, args: ReadonlyArray<string>) =>
  new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve, reject) => {
    const child = spawn(process.execPath, [cli, ...args], { cwd: root, env: baseEnv(dataDir), stdio: ["ignore", "pipe", "pipe"] })
    let stdout = ""
    let stderr = ""
    child.stdout.on("data", (d) => (stdout += d))
    child.stderr.on("data", (d) => (stderr += d))
    child.on("error", reject)
    child.on("close", (code) => resolve({ code, stdout, stderr }))
  })

const healthy = (service: Service) => async () => {
  if (service.child.exitCode !== null) throw new Error(`the service exited (${service.child.exitCode}):\n${service.output()}`)
  return fetch(`${service.base}/healthz`).then((r) => r.status === 200, () => false)
}

/** The embedded server's pid from the postmaster.pid it writes while it runs. */
const serverPid = (dataDir: string): number | undefined => {
  try {
    return Number(Fs.readFileSync(Path.join(dataDir, "postgres", "postmaster.pid"), "utf8").split("\n")[0])
  } catch {
    return undefined
  }
}

/**
 * The PostgreSQL processes of a data folder, whatever their title: each one (the postmaster, its backends and
 * helpers) works in the folder, so /proc/<pid>/cwd names it.
 */
const postgresProcessesOf = (folder: string): ReadonlyArray<number> => {
  const found: Array<number> = []
  for (const name of Fs.readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue
    try {
      if (Fs.readlinkSync(`/proc/${name}/cwd`) === folder) found.push(Number(name))
    } catch {
      // gone meanwhile, or not ours to read
    }
  }
  return found
}

/** Whatever happens, no process of the test survives it. */
const cleanup = (dataDir: string, services: ReadonlyArray<Service>) => {
  for (const s of services) {
    if (s.child.exitCode === null && s.child.pid !== undefined) {
      try {
        process.kill(-s.child.pid, "SIGKILL")
      } catch {
        // gone already
      }
    }
  }
  const pid = serverPid(dataDir)
  if (pid !== undefined && isAlive(pid)) process.kill(pid, "SIGQUIT")
  Fs.rmSync(dataDir, { recursive: true, force: true })
}

const ctrlC = (service: Service) => process.kill(-service.child.pid!, "SIGINT")

describe("npm start on a machine with no PostgreSQL", () => {
  // Two lanes side by side, each test in a data folder and on ports of its own: the restart that cannot succeed
  // waits out the supervisor's whole retry schedule (a minute, mostly asleep) beside the others, not after them.
  describe("serving and recovering", { concurrent: true }, () => {
    it.sequential("serves, the CLI beside it uses its server, a job runs, and Ctrl-C to the process group exits 0 leaving no postgres", async () => {
      const dataDir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "pgfiber-start-"))
      const services: Array<Service> = []
      try {
        const service = await startHealthy(dataDir, services)
        expect(service.output()).toContain("0001_queue")
        const pgPid = serverPid(dataDir)!
        expect(isAlive(pgPid)).toBe(true)
        // the record of the running server: readable by this user only
        const record = Path.join(dataDir, "postgres.json")
        expect(Fs.statSync(record).mode & 0o777).toBe(0o600)

        // the README's second step: a key from the CLI, beside the running service
        const key = await runCli(dataDir, ["keys", "create", "--org", "acme"])
        expect({ code: key.code, stderr: key.code === 0 ? "" : key.stderr }).toEqual({ code: 0, stderr: "" })
        expect(key.stderr).toContain("using the embedded PostgreSQL already running")
        const token = key.stdout.trim()
        expect(token).toMatch(/^pgf_/)

        // the third: a job over HTTP, run by the echo stage that needs no outside service
        const submitted = await fetch(`${service.base}/jobs`, {
          method: "POST",
          headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
          body: JSON.stringify({ stage: "pgfiber.echo", payload: { message: "hello" } })
        })
        expect(submitted.status).toBe(201)
        const { id } = (await submitted.json()) as { id: string }
        await waitFor("the job to run", () => service.output().includes(`"jobId":"${id}"`) && service.output().includes("echo: hello"))
        // it stays readable, completed, for its retention (PGFIBER_RETAIN_COMPLETED, 7 days by default)
        await waitFor("the job to complete", () =>
          fetch(`${service.base}/jobs/${id}`, { headers: { authorization: `Bearer ${token}` } })
            .then((r) => r.json() as Promise<{ status?: string }>).then((j) => j.status === "completed"))

        const stats = await runCli(dataDir, ["stats"])
        expect(stats.code).toBe(0)
        expect(stats.stdout).toMatch(/^pgfiber\.echo\s+0\s+0\s+0\s+0\s+0\s+-$/m)
        // both CLI commands used the service's server: still the same one, still running
        expect(serverPid(dataDir)).toBe(pgPid)

        // a second `npm start` on the same folder uses that server too, serves, and stopping it leaves the first's
        const second = await startHealthy(dataDir, services)
        expect(second.output()).toContain("using the embedded PostgreSQL already running")
        expect(serverPid(dataDir)).toBe(pgPid)
        ctrlC(second)
        expect(await second.exited).toBe(0)
        expect(isAlive(pgPid)).toBe(true)
        expect(await healthy(service)()).toBe(true)

        ctrlC(service)
        const code = await service.exited
        expect({ code, output: code === 0 ? "" : service.output() }).toEqual({ code: 0, output: "" })
        await waitFor("postgres to be gone", () => !isAlive(pgPid))
        expect(Fs.existsSync(record)).toBe(false)
        expect(Fs.existsSync(Path.join(dataDir, "postgres", "postmaster.pid"))).toBe(false)
      } finally {
        cleanup(dataDir, services)
      }
    }, 240_000)

    it.sequential("SIGINT to node alone exits 0 and stops the server; the data is kept for the next start", async () => {
      const dataDir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "pgfiber-start-"))
      const services: Array<Service> = []
      try {
        const service = await startHealthy(dataDir, services)
        const pgPid = serverPid(dataDir)!
        service.child.kill("SIGINT")
        expect(await service.exited).toBe(0)
        await waitFor("postgres to be gone", () => !isAlive(pgPid))
        // the data is kept: a second start finds the schema up to date
        const again = await startHealthy(dataDir, services)
        expect(again.output()).not.toContain("migrations applied")
        again.child.kill("SIGTERM")
        expect(await again.exited).toBe(0)
      } finally {
        cleanup(dataDir, services)
      }
    }, 240_000)

    it.sequential("after kill -9 of its embedded server, the service says why, restarts it, serves again, and Ctrl-C leaves no postgres", async () => {
      const dataDir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "pgfiber-start-"))
      const pgData = Path.join(dataDir, "postgres")
      const services: Array<Service> = []
      try {
        const service = await startHealthy(dataDir, services)
        const key = await runCli(dataDir, ["keys", "create", "--org", "acme"])
        expect({ code: key.code, stderr: key.code === 0 ? "" : key.stderr }).toEqual({ code: 0, stderr: "" })
        const token = key.stdout.trim()
        const pgPid = serverPid(dataDir)!
        expect(postgresProcessesOf(pgData)).toContain(pgPid)

        process.kill(pgPid, "SIGKILL")
        // a CLI command run meanwhile uses the server the service brings back: it never starts one of its own
        const stats = await runCli(dataDir, ["stats"])
        expect({ code: stats.code, stderr: stats.code === 0 ? "" : stats.stderr }).toEqual({ code: 0, stderr: "" })
        expect(stats.stderr).not.toContain("embedded PostgreSQL started")
        expect(stats.stderr).not.toContain("starting it here")

        await waitFor("the service to say its server died", () => service.output().includes(`embedded PostgreSQL (pid ${pgPid}`))
        expect(service.output()).toContain("stopped unexpectedly (killed by SIGKILL): restarting it on the same data")
        await waitFor("the service to restart it", () => service.output().includes("embedded PostgreSQL restarted on port"))
        const restarted = serverPid(dataDir)!
        expect(restarted).not.toBe(pgPid)
        expect(isAlive(restarted)).toBe(true)
        // the record names the server that runs now
        const record = Path.join(dataDir, "postgres.json")
        expect((JSON.parse(Fs.readFileSync(record, "utf8")) as { serverPid: number }).serverPid).toBe(restarted)

        // it serves again by itself: a job submitted now runs
        let id = ""
        await waitFor("a job to be accepted again", async () => {
          const r = await fetch(`${service.base}/jobs`, {
            method: "POST",
            headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
            body: JSON.stringify({ stage: "pgfiber.echo", payload: { message: "after the restart" } })
          })
          if (r.status !== 201) return false
          id = ((await r.json()) as { id: string }).id
          return true
        })
        await waitFor("the job to complete", () =>
          fetch(`${service.base}/jobs/${id}`, { headers: { authorization: `Bearer ${token}` } })
            .then((r) => r.json() as Promise<{ status?: string }>).then((j) => j.status === "completed", () => false))

        ctrlC(service)
        const code = await service.exited
        expect({ code, output: code === 0 ? "" : service.output() }).toEqual({ code: 0, output: "" })
        await waitFor("every postgres process of the folder to be gone", () => postgresProcessesOf(pgData).length === 0)
        await waitFor("the killed and the restarted servers to be gone", () => !isAlive(pgPid) && !isAlive(restarted))
        expect(Fs.existsSync(record)).toBe(false)
        expect(Fs.existsSync(Path.join(pgData, "postmaster.pid"))).toBe(false)
      } finally {
        cleanup(dataDir, services)
      }
    }, 300_000)

    it.sequential("a command run while the service's server is down waits for the service to bring it back, says so, and uses it", async () => {
      const dataDir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "pgfiber-start-"))
      const services: Array<Service> = []
      let paused: Service | undefined
      try {
        const service = await startHealthy(dataDir, services)
        const pgPid = serverPid(dataDir)!
        // the service is held still, so its dead server stays down (a zombie it has not reaped) until we let go
        process.kill(service.child.pid!, "SIGSTOP")
        paused = service
        process.kill(pgPid, "SIGKILL")
        const child = spawn(process.execPath, [cli, "stats"], { cwd: root, env: baseEnv(dataDir), stdio: ["ignore", "pipe", "pipe"] })
        let stderr = ""
        child.stderr.on("data", (d) => (stderr += d))
        child.stdout.resume()
        const code = new Promise<number | null>((resolve) => child.on("close", resolve))
        await waitFor("the command to say it waits", () => stderr.includes(`is not running, but pgfiber process(es) ${service.child.pid} use it`))
        process.kill(service.child.pid!, "SIGCONT")
        paused = undefined
        const exit = await code
        expect({ code: exit, stderr: exit === 0 ? "" : stderr }).toEqual({ code: 0, stderr: "" })
        expect(stderr).toContain("using the embedded PostgreSQL already running")
        expect(stderr).not.toContain("starting it here")
        expect(stderr).not.toContain("embedded PostgreSQL started")
        // the one server on the folder is the service's restart of it
        await waitFor("the service to restart it", () => service.output().includes("embedded PostgreSQL restarted on port"))
        expect(service.output()).toContain(`embedded PostgreSQL (pid ${pgPid}`)
        ctrlC(service)
        expect(await service.exited).toBe(0)
        await waitFor("every postgres process of the folder to be gone", () => postgresProcessesOf(Path.join(dataDir, "postgres")).length === 0)
      } finally {
        if (paused !== undefined) process.kill(paused.child.pid!, "SIGCONT")
        cleanup(dataDir, services)
      }
    }, 300_000)

    it.sequential("after kill -9 of the service, the next start finds the server it left, says so, and comes up", async () => {
      const dataDir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "pgfiber-start-"))
      const services: Array<Service> = []
      try {
        const first = await startHealthy(dataDir, services)
        const pgPid = serverPid(dataDir)!
        process.kill(first.child.pid!, "SIGKILL")
        await first.exited
        // the orphan: still running, holding the folder
        expect(isAlive(pgPid)).toBe(true)

        const before = services.length
        const second = await startHealthy(dataDir, services)
        // (the first attempt found the orphan; a retry after a taken HTTP port would find none)
        expect(services[before]!.output()).toContain(`left running by a pgfiber process that is gone (pid ${first.child.pid})`)
        ctrlC(second)
        expect(await second.exited).toBe(0)
        await waitFor("postgres to be gone", () => !isAlive(pgPid))
      } finally {
        cleanup(dataDir, services)
      }
    }, 240_000)
  })

  describe("losing its server", { concurrent: true }, () => {
    it("when its embedded server dies and cannot be restarted, the service exits 1 naming the cause", async () => {
      const dataDir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "pgfiber-start-"))
      const pgData = Path.join(dataDir, "postgres")
      const services: Array<Service> = []
      try {
        const service = await startHealthy(dataDir, services)
        const pgPid = serverPid(dataDir)!
        // the running server does not miss it; a new one refuses the folder without it
        Fs.renameSync(Path.join(pgData, "PG_VERSION"), Path.join(dataDir, "PG_VERSION.moved"))
        process.kill(pgPid, "SIGKILL")
        const code = await service.exited
        const output = service.output()
        expect({ code, output: code === 1 ? "" : output }).toEqual({ code: 1, output: "" })
        expect(output).toContain("stopped unexpectedly (killed by SIGKILL): restarting it on the same data")
        expect(output).toContain("a restart failed")
        expect(output).toMatch(/pgfiber: embedded PostgreSQL: the server on \S+ stopped unexpectedly \(killed by SIGKILL\) and could not be restarted/)
        expect(output).toContain("PG_VERSION")
        await waitFor("every postgres process of the folder to be gone", () => postgresProcessesOf(pgData).length === 0)
      } finally {
        cleanup(dataDir, services)
      }
    }, 300_000)
  })
})

describe("npm start with DATABASE_URL", () => {
  it("Ctrl-C to the process group exits 0", async () => {
    const dataDir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "pgfiber-start-"))
    const schema = `start_${process.pid}_${Date.now().toString(36)}`
    const services: Array<Service> = []
    try {
      const service = await startHealthy(dataDir, services, { DATABASE_URL: inject("databaseUrl"), PGFIBER_SCHEMA: schema })
      ctrlC(service)
      expect(await service.exited).toBe(0)
      // no embedded server was involved
      expect(Fs.existsSync(Path.join(dataDir, "postgres"))).toBe(false)
    } finally {
      cleanup(dataDir, services)
      const sql = postgres(inject("databaseUrl"), { max: 1, onnotice: () => undefined })
      await sql.unsafe(`drop schema if exists ${schema} cascade`).finally(() => sql.end({ timeout: 5 }))
    }
  }, 240_000)
})
