// `node scripts/split-packages.mjs [--dry-run]`: the mechanical part of splitting the repository into npm
// workspaces (#31): `git mv` of src/, migrations/ and bin/ into packages/<name>/, and the import specifiers that
// pointed at a moved file rewritten to its new place. Deterministic and idempotent: on a tree already split it
// moves nothing and rewrites nothing; on a tree with files it does not know by name, each follows its folder.
//
// Where a file goes: the longest rule below that is a prefix of its path (a folder ends with "/"); everything else
// under src/ is the core's. A specifier is any quoted string starting with ./ or ../ that resolves, from the file
// that holds it (or, failing that, from the repository's root: code a test writes for a child process), to a file
// that moves or whose holder moves. It becomes:
// - a relative path when the holder and the target end in the same package, or the holder is outside packages/
//   (test/, bench/, scripts/);
// - `<package>/internal/<path under src>` across packages (each package's `exports` maps `./internal/*` to its
//   build, and the repository's tsconfig `paths` and vitest aliases to its sources).
// It touches nothing else: package.json files, tsconfigs, the build and the docs are hand-made commits after it.
import { execFileSync } from "node:child_process"
import * as Fs from "node:fs"
import * as Path from "node:path"
import { fileURLToPath } from "node:url"

const root = Path.resolve(Path.dirname(fileURLToPath(import.meta.url)), "..")
const dryRun = process.argv.includes("--dry-run")

/** The packages: their folder under packages/ and their npm name. */
export const packages = {
  core: { dir: "packages/pgfiber", name: "pgfiber" },
  media: { dir: "packages/media", name: "@pgfiber/media" },
  service: { dir: "packages/service", name: "@pgfiber/service" }
}

const src = (pkg, path = "") => `${packages[pkg].dir}/src/${path}`

/** Old path (a file, or a folder ending in "/") → new path; the longest matching prefix wins. */
export const rules = [
  ["src/", src("core")],
  ["migrations/", `${packages.core.dir}/migrations/`],
  // the media pipelines and their outside-world clients
  ["src/layers/Analyzer.ts", src("media", "layers/Analyzer.ts")],
  ["src/layers/Media.ts", src("media", "layers/Media.ts")],
  ["src/layers/SpeechKit.ts", src("media", "layers/SpeechKit.ts")],
  ["src/layers/Storage.ts", src("media", "layers/Storage.ts")],
  ["src/layers/Transcription.ts", src("media", "layers/Transcription.ts")],
  ["src/layers/storage/", src("media", "layers/storage/")],
  ["src/stages/calls/", src("media", "stages/calls/")],
  ["src/stages/documents/", src("media", "stages/documents/")],
  ["src/testing/SpeechKitSimulator.ts", src("media", "testing/SpeechKitSimulator.ts")],
  ["src/testing/MemoryStorage.ts", src("media", "testing/MemoryStorage.ts")],
  ["src/testing/media.ts", src("media", "testing/index.ts")],
  // the service: its composition, its faces, the stages it adds, tracing, the command
  ["src/App.ts", src("service", "App.ts")],
  ["src/main.ts", src("service", "main.ts")],
  ["src/auth/", src("service", "auth/")],
  ["src/cli/", src("service", "cli/")],
  ["src/dashboard/", src("service", "dashboard/")],
  ["src/http/", src("service", "http/")],
  ["src/stages/", src("service", "stages/")],
  ["src/layers/Tracing.ts", src("service", "layers/Tracing.ts")],
  ["bin/", `${packages.service.dir}/bin/`],
  // the core keeps its own housekeeping stage (it needs nothing above the queue)
  ["src/stages/housekeeping/", src("core", "stages/housekeeping/")]
]

export const destination = (path) => {
  let best
  for (const [from, to] of rules) {
    const matches = from.endsWith("/") ? path.startsWith(from) : path === from
    if (matches && (best === undefined || from.length > best[0].length)) best = [from, to]
  }
  if (best === undefined) return path
  return best[0].endsWith("/") ? best[1] + path.slice(best[0].length) : best[1]
}

/** The package a (new) path belongs to, or undefined outside packages/. */
const packageOf = (path) => Object.keys(packages).find((k) => path.startsWith(`${packages[k].dir}/`))

const git = (...args) => execFileSync("git", args, { cwd: root, encoding: "utf8", maxBuffer: 64 * 1024 * 1024 })

const tracked = git("ls-files", "-z").split("\0").filter(Boolean).sort()
const trackedSet = new Set(tracked)
const moves = tracked.filter((f) => destination(f) !== f).map((f) => [f, destination(f)])
const newPath = new Map(moves)
const moved = (f) => newPath.get(f) ?? f

const codeFile = /\.(ts|tsx|mts|cts|js|mjs|cjs)$/
const scanned = tracked.filter((f) =>
  codeFile.test(f) && /^(src|test|bench|scripts|bin|packages\/[^/]+\/(src|bin|test|scripts))\//.test(f) &&
  f !== "scripts/split-packages.mjs"
)

/** The tracked file a relative specifier names from `dir` (.js for .ts, a folder's index), or undefined. */
const resolve = (dir, spec) => {
  const base = Path.posix.normalize(Path.posix.join(dir, spec))
  if (base.startsWith("../")) return undefined
  const candidates = /\.(m|c)?js$/.test(spec)
    ? [base, base.replace(/\.js$/, ".ts").replace(/\.mjs$/, ".mts").replace(/\.cjs$/, ".cts"), base.replace(/\.js$/, ".tsx")]
    : /\.(m|c)?tsx?$/.test(spec)
    ? [base]
    : [`${base}.ts`, `${base}.js`, `${base}/index.ts`, `${base}/index.js`]
  return candidates.find((c) => trackedSet.has(c))
}

/** The specifier for `target` (old path) as `holder` (old path) will see it after the move. */
const specifierFor = (holder, target, original, fromRoot) => {
  const holderNew = moved(holder)
  const targetNew = moved(target)
  const ext = Path.posix.extname(original)
  const targetExt = Path.posix.extname(target)
  // keep the specifier's own style: `.js` for a `.ts` file, no extension where it had none, an index folder as such
  const styled = (path) => {
    if (ext === "") {
      const noExt = path.slice(0, -targetExt.length)
      // `../queue` named queue/index.ts: it still names the folder
      return /\/index$/.test(noExt) && !/(^|\/)index$/.test(original) ? noExt.replace(/\/index$/, "") : noExt
    }
    return ext === targetExt ? path : path.slice(0, -targetExt.length) + ext
  }
  const holderPkg = packageOf(holderNew)
  const targetPkg = packageOf(targetNew)
  if (holderPkg !== undefined && targetPkg !== undefined && holderPkg !== targetPkg && !fromRoot) {
    const under = targetNew.slice(src(targetPkg).length)
    return `${packages[targetPkg].name}/internal/${styled(under)}`
  }
  const fromDir = fromRoot ? "." : Path.posix.dirname(holderNew)
  const relative = Path.posix.relative(fromDir, styled(targetNew))
  return relative.startsWith("../") ? relative : `./${relative}`
}

const literal = /(["'`])(\.{1,2}\/[^"'`\n$\\]*)\1/g

const rewrite = (holder, text) => {
  let changes = 0
  const out = text.replace(literal, (whole, quote, spec) => {
    let target = resolve(Path.posix.dirname(holder), spec)
    let fromRoot = false
    if (target === undefined) {
      target = resolve(".", spec)
      fromRoot = target !== undefined
    }
    if (target === undefined) return whole
    if (moved(target) === target && moved(holder) === holder) return whole
    const next = specifierFor(holder, target, spec, fromRoot)
    if (next === spec) return whole
    changes++
    return `${quote}${next}${quote}`
  })
  return { out, changes }
}

const main = () => {
  const edits = []
  for (const file of scanned) {
    const text = Fs.readFileSync(Path.join(root, file), "utf8")
    const { out, changes } = rewrite(file, text)
    if (changes > 0) edits.push([file, out, changes])
  }
  console.log(`${moves.length} files to move, ${edits.length} files with rewritten specifiers (${edits.reduce((n, e) => n + e[2], 0)} specifiers)`)
  if (dryRun) {
    for (const [from, to] of moves) console.log(`mv ${from} -> ${to}`)
    for (const [file, , changes] of edits) console.log(`edit ${file} (${changes})`)
    return
  }
  for (const [from, to] of moves) {
    Fs.mkdirSync(Path.join(root, Path.dirname(to)), { recursive: true })
    git("mv", from, to)
  }
  for (const [file, out] of edits) Fs.writeFileSync(Path.join(root, moved(file)), out)
  // the folders the move emptied (git tracks no folder; an untracked file keeps its folder)
  const removeEmpty = (dir) => {
    if (!Fs.existsSync(dir) || !Fs.statSync(dir).isDirectory()) return
    for (const entry of Fs.readdirSync(dir)) removeEmpty(Path.join(dir, entry))
    if (Fs.readdirSync(dir).length === 0) Fs.rmdirSync(dir)
  }
  for (const top of ["src", "migrations", "bin"]) removeEmpty(Path.join(root, top))
}

if (process.argv[1] && Path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) main()
