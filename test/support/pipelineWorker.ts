/**
 * Spawns test/fixtures/pipelineWorker.ts (a real worker process running a pipeline's stages) for the tests
 * that SIGKILL a worker mid-job; it is killed at the end of the test's scope if still alive.
 */
import { Effect } from "effect"
import { spawn } from "node:child_process"
import * as Path from "node:path"
import { databaseUrl } from "./pg.js"

const fixture = Path.resolve(import.meta.dirname, "../fixtures/pipelineWorker.ts")

/** A worker process, SIGKILLed at the end of the test if still alive. */
export const spawnPipelineWorker = (env: Record<string, string>) =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const child = spawn(process.execPath, ["--import", "tsx", fixture], {
        env: { ...process.env, DATABASE_URL: databaseUrl(), SWEEP_INTERVAL_MS: "3600000", LOG_LEVEL: "warn", ...env },
        stdio: ["ignore", "pipe", "pipe"]
      })
      let output = ""
      child.stdout!.on("data", (d) => (output += d))
      child.stderr!.on("data", (d) => (output += d))
      const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)))
      return { child, exited, output: () => output }
    }),
    ({ child }) => Effect.sync(() => child.exitCode === null && child.signalCode === null && child.kill("SIGKILL"))
  )
