import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    globalSetup: ["test/support/globalSetup.ts"],
    // every pool checks its held jobs' invariants on every transition (src/runtime/pool/Held.ts), in this process
    // and in the worker processes the tests spawn (they inherit the environment)
    env: { PGFIBER_CHECK_INVARIANTS: "1" },
    // each file works in its own schema, so files run in parallel; two cores, so two forks
    pool: "forks",
    poolOptions: { forks: { maxForks: 2, minForks: 1 } },
    // deadlines, not speed: a test that spawns processes must pass at load 20 on two cores
    testTimeout: 180_000,
    hookTimeout: 120_000,
    // expect.poll (the browser tests) waits up to 30 s by default, not 1 s
    expect: { poll: { timeout: 30_000, interval: 50 } },
    // one retry: a test that passes only on its retry is reported as FLAKY by NotesReporter (and at the end of
    // .ci/run), to be fixed, not ignored; a test that fails twice fails the run
    retry: 1,
    reporters: ["default", "json", "./test/support/NotesReporter.ts"],
    outputFile: { json: ".data/test-results.json" }
  }
})
