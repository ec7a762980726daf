// `npm run sizes` (after `npm run build`): what each package weighs to a user, beside graphile-worker's and
// pg-boss's, measured the same way: `npm pack` for the packed size, then a plain `npm install` of the tarball
// (with `effect`, the peer a user of pgfiber writes their code with, named as the README does) into an empty
// project and the size of its node_modules (`du -sk`, what lands on disk). graphile-worker and pg-boss install
// from the registry at the versions the repository's benchmarks use. Prints a Markdown table (for the README).
import { execFileSync } from "node:child_process"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { fileURLToPath } from "node:url"

const root = Path.resolve(Path.dirname(fileURLToPath(import.meta.url)), "..")
const readJson = (file) => JSON.parse(Fs.readFileSync(file, "utf8"))
const rootPkg = readJson(Path.join(root, "package.json"))

const npm = (args, cwd) => execFileSync("npm", args, { cwd, encoding: "utf8", maxBuffer: 64 * 1024 * 1024, stdio: ["ignore", "pipe", "pipe"] })

const kib = (dir) => Number(execFileSync("du", ["-sk", dir], { encoding: "utf8" }).split(/\s/)[0])
const mib = (k) => `${(k / 1024).toFixed(1)} MiB`

const installInto = (work, name, specs) => {
  const dir = Path.join(work, name.replace(/[@/]/g, "_"))
  Fs.mkdirSync(dir)
  Fs.writeFileSync(Path.join(dir, "package.json"), JSON.stringify({ name: "sizes", private: true, type: "module" }))
  npm(["install", "--no-audit", "--no-fund", "--prefer-offline", ...specs], dir)
  const modules = Path.join(dir, "node_modules")
  return { installed: kib(modules), top: Fs.readdirSync(modules).filter((n) => !n.startsWith(".")).length }
}

const main = () => {
  const work = Fs.mkdtempSync(Path.join(Os.tmpdir(), "pgfiber-sizes-"))
  try {
    const packed = JSON.parse(npm(["pack", "--workspaces", "--json", "--pack-destination", work], root))
    const tarball = (name) => Path.join(work, packed.find((p) => p.name === name).filename)
    // the bare name, as the README installs it: npm picks the Effect 3 that the packages' peer range accepts
    const effect = "effect"
    const rows = [
      ["`pgfiber` (core) + effect", packed.find((p) => p.name === "pgfiber").size, installInto(work, "core", [tarball("pgfiber"), effect])],
      ["`@pgfiber/media` (+ core, effect)", packed.find((p) => p.name === "@pgfiber/media").size, installInto(work, "media", [tarball("pgfiber"), tarball("@pgfiber/media"), effect])],
      ["`@pgfiber/service` (+ core, media)", packed.find((p) => p.name === "@pgfiber/service").size, installInto(work, "service", [tarball("pgfiber"), tarball("@pgfiber/media"), tarball("@pgfiber/service")])]
    ]
    for (const name of ["graphile-worker", "pg-boss"]) {
      const spec = `${name}@${rootPkg.devDependencies[name]}`
      const info = JSON.parse(npm(["pack", spec, "--json", "--dry-run"], work))[0]
      rows.push([`\`${name}\` ${info.version}`, info.size, installInto(work, name, [spec])])
    }
    console.log(`Node ${process.version}, npm ${npm(["--version"], root).trim()}; installed = \`du -sk node_modules\` of an empty project after \`npm install\`.\n`)
    console.log("| package | packed | installed | entries in node_modules |")
    console.log("| --- | ---: | ---: | ---: |")
    for (const [label, size, { installed, top }] of rows) console.log(`| ${label} | ${mib(size / 1024)} | ${mib(installed)} | ${top} |`)
  } finally {
    Fs.rmSync(work, { recursive: true, force: true })
  }
}

main()
