/**
 * The npm package as a user gets it: `npm pack` (which runs the build), the tarball's contents and its manifest
 * (no `prepare`: the build script is not shipped), then a plain
 * `npm install` of the tarball into an empty project, where plain `node` (no tsx) imports `pgfiber`, declares a
 * stage, enqueues a job and sees it completed on embedded PostgreSQL, and runs the installed `pgfiber --help`.
 *
 * It packs a copy of the sources (a pack rewrites package.json for a moment), and installs from the
 * registry (or npm's cache), so it takes a minute or two. It runs in the suite's embedded pass (DATABASE_URL
 * unset), since it never uses the run's database: CI's second pass would only repeat it.
 */
import { describe, expect, it } from "vitest"
import { execFile } from "node:child_process"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"

const root = Path.resolve(import.meta.dirname, "../..")
const npm = process.platform === "win32" ? "npm.cmd" : "npm"

const run = (command: string, args: ReadonlyArray<string>, cwd: string, env: Record<string, string | undefined> = process.env) =>
  new Promise<{ code: number; stdout: string; stderr: string }>((resolve) => {
    execFile(command, args, { cwd, env, maxBuffer: 64 * 1024 * 1024, timeout: 480_000 }, (error, stdout, stderr) => {
      const code = error === null ? 0 : typeof (error as { code?: unknown }).code === "number" ? (error as { code: number }).code : 1
      resolve({ code, stdout, stderr })
    })
  })

/** What `npm pack` needs to build the package, copied; node_modules linked (the build's tools are dev dependencies). */
const copySources = (into: string) => {
  for (const entry of ["package.json", "package-lock.json", "tsconfig.json", "tsconfig.build.json", "README.md", "LICENSE"]) {
    Fs.copyFileSync(Path.join(root, entry), Path.join(into, entry))
  }
  for (const dir of ["src", "migrations", "bin", "docs", "scripts"]) {
    Fs.cpSync(Path.join(root, dir), Path.join(into, dir), { recursive: true })
  }
  Fs.symlinkSync(Path.join(root, "node_modules"), Path.join(into, "node_modules"), "dir")
}

const userProgram = `
import { Effect, Layer, Schema } from "effect"
import { Queue, Stage, Worker, layerPgQueue } from "pgfiber"

const seen = []
const greet = Stage.make({
  name: "greet",
  payload: Schema.Struct({ to: Schema.String }),
  concurrency: 2,
  handler: ({ to }) => Effect.sync(() => {
    seen.push(to)
  })
})

const program = Effect.gen(function*() {
  const { id } = yield* Stage.enqueue(greet, { to: "world" })
  while (seen.length === 0) yield* Effect.sleep("50 millis")
  const queue = yield* Queue.Queue
  // a completed job stays readable, with its final state, for its retention
  while ((yield* queue.get(id))?.status !== "completed") yield* Effect.sleep("50 millis")
  console.log(JSON.stringify({ id, seen }))
})

const worker = Worker.layer([greet], Worker.defaults())
await Effect.runPromise(program.pipe(Effect.provide(worker.pipe(Layer.provideMerge(layerPgQueue()))), Effect.scoped))
`

describe.skipIf(process.env.DATABASE_URL !== undefined && process.env.DATABASE_URL !== "")("the npm package", () => {
  it("packs, installs into an empty project, and runs a job and the CLI under plain node", async () => {
    const work = Fs.mkdtempSync(Path.join(Os.tmpdir(), "pgfiber-pack-"))
    try {
      const source = Path.join(work, "source")
      Fs.mkdirSync(source)
      copySources(source)
      const t0 = Date.now()
      const phase = (what: string) => console.log(`${what}: ${((Date.now() - t0) / 1000).toFixed(1)} s`)
      const packed = await run(npm, ["pack", "--json", "--pack-destination", work], source)
      expect({ code: packed.code, stderr: packed.code === 0 ? "" : packed.stderr }).toEqual({ code: 0, stderr: "" })
      const [info] = JSON.parse(packed.stdout.slice(packed.stdout.indexOf("["))) as Array<{
        filename: string
        size: number
        unpackedSize: number
        files: Array<{ path: string }>
      }>
      const files = info!.files.map((f) => f.path)
      for (const wanted of ["dist/index.js", "dist/index.d.ts", "dist/index.js.map", "dist/testing/index.js", "dist/cli.js", "bin/pgfiber.js", "migrations/0001_queue.sql", "README.md", "LICENSE", "package.json"]) {
        expect(files).toContain(wanted)
      }
      for (const unwanted of [/^test\//, /^bench\//, /^\.ci\//, /^scripts\//, /^node_modules\//, /\.tmp$/, /^\.data\//]) {
        expect(files.filter((f) => unwanted.test(f))).toEqual([])
      }
      console.log(`pgfiber tarball: ${(info!.size / 1024).toFixed(0)} KiB packed, ${(info!.unpackedSize / 1024).toFixed(0)} KiB unpacked, ${files.length} files`)
      // the shipped manifest declares no build (`prepare` names scripts/build.mjs, which is not shipped): only the
      // scripts that run the shipped CLI; the checkout's package.json is put back as it was
      const unpacked = Path.join(work, "unpacked")
      Fs.mkdirSync(unpacked)
      expect((await run("tar", ["xzf", Path.join(work, info!.filename), "-C", unpacked, "package/package.json"], work)).code).toBe(0)
      const shipped = JSON.parse(Fs.readFileSync(Path.join(unpacked, "package", "package.json"), "utf8")) as { scripts: Record<string, string> }
      expect(Object.keys(shipped.scripts).sort()).toEqual(["migrate", "pgfiber", "start"])
      expect(Fs.readFileSync(Path.join(source, "package.json"), "utf8")).toBe(Fs.readFileSync(Path.join(root, "package.json"), "utf8"))
      expect(Fs.existsSync(Path.join(source, "package.json.packing"))).toBe(false)

      phase("packed")
      // an empty project, a plain npm install of the tarball (and effect, which a user writes their code with)
      const project = Path.join(work, "project")
      Fs.mkdirSync(project)
      Fs.writeFileSync(Path.join(project, "package.json"), JSON.stringify({ name: "uses-pgfiber", private: true, type: "module" }))
      const effectRange = (JSON.parse(Fs.readFileSync(Path.join(root, "package.json"), "utf8")) as { dependencies: Record<string, string> })
        .dependencies.effect!
      const installed = await run(npm, ["install", "--no-audit", "--no-fund", "--prefer-offline", Path.join(work, info!.filename), `effect@${effectRange}`], project)
      expect({ code: installed.code, stderr: installed.code === 0 ? "" : installed.stderr }).toEqual({ code: 0, stderr: "" })
      phase("installed")
      // what a production install weighs (the user's project: pgfiber and its dependencies, no dev tools)
      const du = await run("du", ["-sk", Path.join(project, "node_modules")], project)
      if (du.code === 0) console.log(`production install: ${Math.round(Number(du.stdout.split(/\s/)[0]) / 1024)} MiB in node_modules`)

      // plain node: import pgfiber, a stage, a job completed on embedded PostgreSQL
      Fs.writeFileSync(Path.join(project, "main.mjs"), userProgram)
      const env: Record<string, string | undefined> = { ...process.env, LOG_LEVEL: "warning", PGFIBER_DATA_DIR: Path.join(project, ".data") }
      delete env.DATABASE_URL
      delete env.NODE_OPTIONS
      delete env.PGFIBER_SCHEMA
      const job = await run(process.execPath, ["main.mjs"], project, env)
      expect({ code: job.code, stderr: job.code === 0 ? "" : job.stderr }).toEqual({ code: 0, stderr: "" })
      const result = JSON.parse(job.stdout.trim().split("\n").at(-1)!) as { id: string; seen: Array<string> }
      expect(result.seen).toEqual(["world"])
      phase("ran a job")
      // the embedded server stopped with the program
      expect(Fs.existsSync(Path.join(project, ".data", "postgres", "postmaster.pid"))).toBe(false)

      // the subpath for tests resolves too
      const testing = await run(process.execPath, ["--input-type=module", "-e", "const t = await import('pgfiber/testing'); console.log(typeof t.SpeechKitSimulator.layer)"], project, env)
      expect(testing.stdout.trim()).toBe("function")

      // the dashboard's assets come from the installed packages (uPlot is a dependency, nothing from a CDN)
      const dashboard = await run(process.execPath, ["--input-type=module", "-e",
        "const { Dashboard } = await import('pgfiber/http'); const a = Dashboard.assets['uPlot.iife.min.js'](); console.log(a.body.length > 10000, Dashboard.assets['dashboard.js']().body.length > 1000)"], project, env)
      expect({ code: dashboard.code, stdout: dashboard.stdout.trim(), stderr: dashboard.code === 0 ? "" : dashboard.stderr }).toEqual({ code: 0, stdout: "true true", stderr: "" })

      // the installed command
      const help = await run(Path.join(project, "node_modules", ".bin", "pgfiber"), ["--help"], project, env)
      expect(help.code).toBe(0)
      expect(help.stdout).toContain("pgfiber")
      expect(help.stdout).toContain("enqueue")
    } finally {
      Fs.rmSync(work, { recursive: true, force: true })
    }
  }, 600_000)
})
