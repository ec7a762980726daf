/**
 * A stale postmaster.pid (the server crashed, its pid now belongs to another process) must not make an unrelated
 * process look like the server, nor get it signalled: only a pid verified as a postmaster of the folder is.
 */
import { Duration, Effect, Exit, Scope } from "effect"
import { spawn, type ChildProcess } from "node:child_process"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { afterEach, describe, expect, it } from "vitest"
import * as EmbeddedPg from "../../packages/pgfiber/src/layers/EmbeddedPg.js"
import { waitForPromise as waitFor } from "../support/waitFor.js"

/** A live process that is not postgres; it reports every signal it gets on stdout, and survives SIGINT/SIGQUIT/SIGTERM. */
const bystander = async () => {
  const child = spawn(process.execPath, [
    "-e",
    `for (const s of ["SIGINT", "SIGQUIT", "SIGTERM"]) process.on(s, () => console.log("got " + s)); console.log("up"); setInterval(() => {}, 1000)`
  ], { stdio: ["ignore", "pipe", "inherit"], cwd: Os.tmpdir() })
  let output = ""
  child.stdout!.on("data", (d) => (output += d))
  await waitFor("the bystander to start", () => output.includes("up"))
  return { child, output: () => output }
}

const writePostmasterPid = (dataDir: string, pid: number, port: number, status = "ready") =>
  Fs.writeFileSync(Path.join(dataDir, "postmaster.pid"), [pid, dataDir, "0", port, "/tmp", "127.0.0.1", "0 0", status, ""].join("\n"))

const children: Array<ChildProcess> = []
const folders: Array<string> = []
afterEach(() => {
  for (const child of children.splice(0)) child.kill("SIGKILL")
  for (const folder of folders.splice(0)) Fs.rmSync(folder, { recursive: true, force: true })
})

describe("EmbeddedPg and a stale postmaster.pid", () => {
  it("does not take a live process that is not a postmaster of the folder for the server", async () => {
    const dataDir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "pgfiber-stale-"))
    folders.push(dataDir)
    const other = await bystander()
    children.push(other.child)
    writePostmasterPid(dataDir, other.child.pid!, 5432)
    expect(EmbeddedPg.readPostmasterPid(dataDir)?.pid).toBe(other.child.pid)
    expect(EmbeddedPg.isAlive(other.child.pid!)).toBe(true)
    expect(EmbeddedPg.isPostmasterOf(other.child.pid!, dataDir)).toBe(false)
    expect(EmbeddedPg.runningServer(dataDir)).toBeUndefined()
  })

  it("sees its real server, and after it crashed signals nothing when the folder's pid names another process", async () => {
    const scope = Effect.runSync(Scope.make())
    let closed = false
    try {
      const server = await Effect.runPromise(
        EmbeddedPg.start({ dataDir: undefined, port: 0, stopTimeout: Duration.seconds(1) }).pipe(Scope.extend(scope))
      )
      const found = EmbeddedPg.runningServer(server.dataDir)
      // the check recognises a real postmaster of the folder
      expect(found?.port).toBe(server.port)
      const pgPid = found!.pid
      // it crashes; its pid is taken by an unrelated process (simulated: its postmaster.pid now names one)
      process.kill(pgPid, "SIGKILL")
      await waitFor("the server to be gone", () => !EmbeddedPg.isAlive(pgPid))
      const other = await bystander()
      children.push(other.child)
      writePostmasterPid(server.dataDir, other.child.pid!, server.port)
      expect(EmbeddedPg.runningServer(server.dataDir)).toBeUndefined()
      // the last one out stops whatever server runs on the folder: none does, so nothing is signalled
      await Effect.runPromise(Scope.close(scope, Exit.void))
      closed = true
      expect(EmbeddedPg.isAlive(other.child.pid!)).toBe(true)
      expect(other.output()).not.toContain("got ")
    } finally {
      if (!closed) await Effect.runPromise(Scope.close(scope, Exit.void))
    }
  })
})
