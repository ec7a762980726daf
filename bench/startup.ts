/**
 * `npm run bench:startup`: what a start costs, compiled (`node packages/service/dist/cli.js`, what `npm start` and the installed
 * `pgfiber` run) against tsx (`node --import tsx packages/service/src/main.ts`, the development path), same machine, same run,
 * interleaved, medians of --runs (default 5):
 * - `pgfiber --help`, `pgfiber stats` and `pgfiber keys create`: wall time and CPU (user + system) of the whole
 *   process (the two commands on a migrated schema of DATABASE_URL); the CLI loads only the named command's module
 *   (packages/service/src/main.ts), and the pipelines only when a command runs: each should answer in well under a second;
 * - `pgfiber start`: from spawn to the first `/healthz` 200, on DATABASE_URL (default: the local PostgreSQL) so
 *   the number is pgfiber's own start, not an embedded server's;
 * - RSS when idle (5 s after /healthz) and the peak RSS (VmHWM) after draining --jobs echo jobs.
 * `--cli-only` skips the service's start and drain (the CLI's numbers in a few seconds).
 * Build first (`npm run build`). Prints a Markdown table.
 */
import * as Child from "node:child_process"
import * as Fs from "node:fs"
import * as Path from "node:path"
import postgres from "postgres"
import { freePort, median, repoDir, sleep } from "./lib.js"

const arg = (name: string, fallback: number) => {
  const i = process.argv.indexOf(`--${name}`)
  return i > 0 ? Number(process.argv[i + 1]) : fallback
}
const runs = arg("runs", 5)
const jobs = arg("jobs", 20_000)
const databaseUrl = process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test"

const variants = {
  // as bin/pgfiber.js (its shebang) and `npm start` run it
  compiled: ["--max-semi-space-size=4", Path.join(repoDir, "packages", "service", "dist", "cli.js")],
  tsx: ["--import", "tsx", Path.join(repoDir, "packages", "service", "src", "main.ts")]
} as const
type Variant = keyof typeof variants

const cliOnly = process.argv.includes("--cli-only")

/** The CLI commands timed, each as a whole process. */
const commands = {
  help: ["--help"],
  stats: ["stats"],
  keys: ["keys", "create", "--org", "bench"]
} as const
type Timed = keyof typeof commands

const timeCommand = (variant: Variant, args: ReadonlyArray<string>, schema?: string) =>
  new Promise<{ wallMs: number; cpuMs: number }>((resolve, reject) => {
    const start = process.hrtime.bigint()
    const useTime = Fs.existsSync("/usr/bin/time")
    const command = useTime ? "/usr/bin/time" : process.execPath
    const argv = useTime ? ["-f", "%U %S", process.execPath, ...variants[variant], ...args] : [...variants[variant], ...args]
    const env = { ...process.env, DATABASE_URL: databaseUrl, LOG_LEVEL: "warning", ...(schema === undefined ? {} : { PGFIBER_SCHEMA: schema }) }
    const child = Child.spawn(command, argv, { cwd: repoDir, env, stdio: ["ignore", "ignore", "pipe"] })
    let stderr = ""
    child.stderr.on("data", (d) => (stderr += d))
    child.on("error", reject)
    child.on("close", (code) => {
      const wallMs = Number(process.hrtime.bigint() - start) / 1e6
      if (code !== 0) return reject(new Error(`${args.join(" ")} exited ${code}: ${stderr}`))
      const [user, sys] = stderr.trim().split("\n").at(-1)!.split(" ").map(Number)
      resolve({ wallMs, cpuMs: useTime ? (user! + sys!) * 1000 : Number.NaN })
    })
  })

const status = (pid: number, field: "VmRSS" | "VmHWM") => {
  const line = Fs.readFileSync(`/proc/${pid}/status`, "utf8").split("\n").find((l) => l.startsWith(`${field}:`))
  return Number(line!.replace(/\D+/g, "")) / 1024
}

const service = async (variant: Variant, sql: postgres.Sql, schema: string) => {
  const port = await freePort()
  const start = process.hrtime.bigint()
  const child = Child.spawn(process.execPath, [...variants[variant], "start"], {
    cwd: repoDir,
    env: { ...process.env, DATABASE_URL: databaseUrl, PGFIBER_SCHEMA: schema, HTTP_HOST: "127.0.0.1", HTTP_PORT: String(port), LOG_LEVEL: "warning" },
    stdio: ["ignore", "ignore", "inherit"]
  })
  const exited = new Promise<void>((resolve) => child.on("exit", () => resolve()))
  try {
    while (!(await fetch(`http://127.0.0.1:${port}/healthz`).then((r) => r.ok, () => false))) {
      if (child.exitCode !== null) throw new Error(`${variant} exited`)
      await sleep(10)
    }
    const readyMs = Number(process.hrtime.bigint() - start) / 1e6
    await sleep(5000)
    const idleMiB = status(child.pid!, "VmRSS")
    await sql.unsafe(`insert into ${schema}.jobs (stage, payload) select 'pgfiber.echo', '{}'::jsonb from generate_series(1, ${jobs})`)
    const drainStart = Date.now()
    while ((await sql.unsafe(`select count(*)::int as n from ${schema}.jobs`))[0]!.n > 0) await sleep(100)
    const drainS = (Date.now() - drainStart) / 1000
    const peakMiB = status(child.pid!, "VmHWM")
    return { readyMs, idleMiB, peakMiB, drainS }
  } finally {
    child.kill("SIGTERM")
    await exited
  }
}

const main = async () => {
  const sql = postgres(databaseUrl, { max: 2, onnotice: () => undefined })
  const timed: Record<Timed, Record<Variant, Array<{ wallMs: number; cpuMs: number }>>> = {
    help: { compiled: [], tsx: [] },
    stats: { compiled: [], tsx: [] },
    keys: { compiled: [], tsx: [] }
  }
  const serve: Record<Variant, Array<Awaited<ReturnType<typeof service>>>> = { compiled: [], tsx: [] }
  const load: Array<number> = []
  try {
    for (let i = 0; i < runs; i++) {
      for (const variant of ["compiled", "tsx"] as const) {
        load.push(Number(Fs.readFileSync("/proc/loadavg", "utf8").split(" ")[0]))
        timed.help[variant].push(await timeCommand(variant, commands.help))
        const schema = `startup_${variant}_${process.pid}_${i}`
        try {
          await timeCommand(variant, ["migrate"], schema)
          timed.stats[variant].push(await timeCommand(variant, commands.stats, schema))
          timed.keys[variant].push(await timeCommand(variant, commands.keys, schema))
          if (!cliOnly) serve[variant].push(await service(variant, sql, schema))
        } finally {
          await sql.unsafe(`drop schema if exists ${schema} cascade`)
        }
      }
    }
  } finally {
    await sql.end()
  }
  const m = (v: Variant, f: (s: Awaited<ReturnType<typeof service>>) => number) => median(serve[v].map(f))
  const t = (what: Timed) => (v: Variant) =>
    `${median(timed[what][v].map((x) => x.wallMs)).toFixed(0)} / ${median(timed[what][v].map((x) => x.cpuMs)).toFixed(0)}`
  const row = (label: string, f: (v: Variant) => string) => `| ${label} | ${f("compiled")} | ${f("tsx")} |`
  console.log(
    [
      `Node ${process.version}, ${(await import("node:os")).cpus().length} cores, median 1-minute load ${median(load).toFixed(1)}; medians of ${runs} interleaved runs.`,
      "",
      "| | compiled (`node packages/service/dist/cli.js`) | tsx (`node --import tsx packages/service/src/main.ts`) |",
      "| --- | ---: | ---: |",
      row("`pgfiber --help`, wall / CPU, ms", t("help")),
      row("`pgfiber stats`, wall / CPU, ms", t("stats")),
      row("`pgfiber keys create`, wall / CPU, ms", t("keys")),
      ...(cliOnly ? [] : [
        row("`pgfiber start` to `/healthz` 200, ms", (v) => m(v, (s) => s.readyMs).toFixed(0)),
        row("RSS idle, MiB", (v) => m(v, (s) => s.idleMiB).toFixed(0)),
        row(`peak RSS draining ${jobs.toLocaleString("en")} echo jobs, MiB`, (v) => m(v, (s) => s.peakMiB).toFixed(0)),
        row("drain time, s", (v) => m(v, (s) => s.drainS).toFixed(1))
      ])
    ].join("\n")
  )
}

await main()
