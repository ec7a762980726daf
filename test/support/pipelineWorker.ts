/**
 * Spawns test/fixtures/pipelineWorker.ts (a real worker process running a pipeline's stages) for the tests
 * that SIGKILL a worker mid-job; it is killed at the end of the test's scope if still alive.
 */
import { fixture, spawnWorkerProcess } from "./workerProcess.js"

/** A worker process, SIGKILLed at the end of the test if still alive. */
export const spawnPipelineWorker = (env: Record<string, string>) =>
  spawnWorkerProcess(fixture("pipelineWorker.ts"), { SWEEP_INTERVAL_MS: "3600000", LOG_LEVEL: "warn", ...env })
