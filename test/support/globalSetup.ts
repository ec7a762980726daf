/**
 * One PostgreSQL for the whole run: DATABASE_URL when set (CI's second pass), else an embedded server
 * started here and stopped at the end (the fresh-machine path). Each test file then makes its own schema.
 * First, the compiled CLI (dist/cli.js, what the CLI and start-up tests spawn) is rebuilt from the sources,
 * a few seconds with esbuild, so a test never runs a stale build.
 */
import { Effect, Exit, Redacted, Scope } from "effect"
import type { TestProject } from "vitest/node"
import * as EmbeddedPg from "../../packages/pgfiber/src/layers/EmbeddedPg.js"

declare module "vitest" {
  export interface ProvidedContext {
    databaseUrl: string
  }
}

export default async function setup(project: TestProject) {
  // @ts-expect-error: a plain ES module script, no declarations
  const { buildCli } = (await import("../../scripts/build.mjs")) as { buildCli: () => Promise<void> }
  await buildCli()
  const fromEnv = process.env.DATABASE_URL
  if (fromEnv) {
    project.provide("databaseUrl", fromEnv)
    return
  }
  const scope = Effect.runSync(Scope.make())
  const server = await Effect.runPromise(
    EmbeddedPg.start({ dataDir: undefined, port: 0, postgresFlags: ["-c", "max_connections=300"] }).pipe(Scope.extend(scope))
  )
  project.provide("databaseUrl", Redacted.value(server.url))
  return async () => {
    await Effect.runPromise(Scope.close(scope, Exit.void))
  }
}
