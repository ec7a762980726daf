import * as Path from "node:path"
import { defineConfig } from "vitest/config"

const packages = Path.resolve(import.meta.dirname, "packages")

export default defineConfig({
  // the workspaces' bare specifiers to their sources, as tsconfig.json's `paths` (the packages' `exports` name dist/)
  resolve: {
    alias: [
      { find: /^pgfiber$/, replacement: `${packages}/pgfiber/src/index.ts` },
      { find: /^pgfiber\/testing$/, replacement: `${packages}/pgfiber/src/testing/index.ts` },
      { find: /^pgfiber\/client$/, replacement: `${packages}/pgfiber/src/client/index.ts` },
      { find: /^pgfiber\/internal\/(.*)\.js$/, replacement: `${packages}/pgfiber/src/$1.ts` },
      { find: /^@pgfiber\/media\/(calls|documents)$/, replacement: `${packages}/media/src/stages/$1/index.ts` },
      { find: /^@pgfiber\/media\/testing$/, replacement: `${packages}/media/src/testing/index.ts` },
      { find: /^@pgfiber\/media\/internal\/(.*)\.js$/, replacement: `${packages}/media/src/$1.ts` },
      { find: /^@pgfiber\/service\/http$/, replacement: `${packages}/service/src/http/index.ts` },
      { find: /^@pgfiber\/service\/internal\/(.*)\.js$/, replacement: `${packages}/service/src/$1.ts` }
    ]
  },
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
