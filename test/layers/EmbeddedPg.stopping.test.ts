/**
 * A command that starts while the last user of a shared folder is stopping its server (postmaster.pid says
 * `stopping`) must not wait a minute for it to become ready and then fail: once it has stopped, the command starts
 * its own, saying so.
 */
import { Effect, Exit, Fiber, Logger, Scope } from "effect"
import { spawn } from "node:child_process"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { describe, expect, it } from "vitest"
import * as EmbeddedPg from "../../packages/pgfiber/src/layers/EmbeddedPg.js"
import { waitForPromise as waitFor } from "../support/waitFor.js"

describe("EmbeddedPg on a shared folder whose server is stopping", () => {
  it("waits for it to stop, then starts its own", async () => {
    const parent = Fs.mkdtempSync(Path.join(Os.tmpdir(), "pgfiber-stopping-"))
    const dataDir = Path.join(parent, "postgres")
    const logs: Array<string> = []
    const logger = Logger.replace(
      Logger.defaultLogger,
      Logger.make(({ message }) => void logs.push(Array.isArray(message) ? message.join(" ") : String(message)))
    )
    const options = { dataDir, port: 0, share: true } as const
    const fake = { pid: undefined as number | undefined }
    try {
      // a cluster on the folder (initdb), its server stopped again
      await Effect.runPromise(Effect.scoped(EmbeddedPg.start(options)))
      // "the server" now stopping: a process working in the folder (as a postmaster does) named by postmaster.pid
      const child = spawn(process.execPath, ["-e", "setInterval(() => {}, 1000)"], { cwd: dataDir, stdio: "ignore" })
      fake.pid = child.pid
      Fs.writeFileSync(Path.join(dataDir, "postmaster.pid"), [child.pid, dataDir, "0", "5999", "/tmp", "127.0.0.1", "0 0", "stopping", ""].join("\n"))
      await waitFor("the fake server to be seen", () => EmbeddedPg.runningServer(dataDir)?.pid === child.pid)

      const scope = Effect.runSync(Scope.make())
      const starting = Effect.runFork(EmbeddedPg.start(options).pipe(Scope.extend(scope), Effect.provide(logger)))
      try {
        await waitFor("the command to wait for the stopping server", () => logs.some((l) => l.includes("is stopping: waiting")))
        // it stops: the postmaster removes its postmaster.pid and exits
        Fs.rmSync(Path.join(dataDir, "postmaster.pid"))
        child.kill("SIGKILL")
        const stoppedAt = Date.now()
        const server = await Effect.runPromise(Fiber.join(starting))
        // not after the minute it once waited for a server that was stopping (a start takes seconds)
        expect(Date.now() - stoppedAt).toBeLessThan(45_000)
        expect(logs.some((l) => l.includes(`(pid ${child.pid}) stopped while this process waited for it: starting it here`))).toBe(true)
        const running = EmbeddedPg.runningServer(dataDir)
        expect(running?.port).toBe(server.port)
        expect(running?.pid).not.toBe(child.pid)
      } finally {
        await Effect.runPromise(Fiber.interrupt(starting))
        await Effect.runPromise(Scope.close(scope, Exit.void))
      }
      expect(EmbeddedPg.runningServer(dataDir)).toBeUndefined()
    } finally {
      if (fake.pid !== undefined && EmbeddedPg.isAlive(fake.pid)) process.kill(fake.pid, "SIGKILL")
      Fs.rmSync(parent, { recursive: true, force: true })
    }
  })
})
