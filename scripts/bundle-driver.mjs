// Puts the repository's fixed porsager driver inside a package while npm packs it (the package's `prepack` and
// `postpack`), so every app that installs the package gets the fix, with no patch or install script of its own.
//
// porsager/postgres 3.4.9 keeps a pending write's bytes across a reconnect (the startup message is then never
// flushed, and the connection times out round after round); `patches/postgres+<version>.patch` is the fix, which
// patch-package applies to node_modules on `npm ci`. The packages list `postgres` in `bundleDependencies`, so npm
// packs the copy found in the package's own node_modules/ and installs it from the tarball instead of the
// registry's. In the workspace that copy is hoisted to the root, where npm's pack does not look for it; this copies
// it in for the pack, after checking it carries every line of the patch (a copy without the fix is never packed),
// and takes it out afterwards.
//
//   node scripts/bundle-driver.mjs stage     (in the package's folder: what `prepack` runs)
//   node scripts/bundle-driver.mjs unstage   (what `postpack` runs)
import * as Fs from "node:fs"
import * as Path from "node:path"
import { fileURLToPath } from "node:url"

const root = Path.resolve(Path.dirname(fileURLToPath(import.meta.url)), "..")
const driver = "postgres"
const installed = Path.join(root, "node_modules", driver)
/** Marks a copy this script made, so `unstage` never removes one that npm itself installed there. */
const marker = (pkg) => Path.join(pkg, "node_modules", `.${driver}-bundled-from-the-workspace`)

/** Each hunk's resulting text (its context and added lines), per file the patch changes (paths inside the driver). */
const patchedHunks = (patch) => {
  const files = new Map()
  let hunks
  let hunk
  for (const line of patch.split("\n")) {
    const target = /^\+\+\+ b\/node_modules\/[^/]+\/(.+)$/.exec(line)
    if (target) {
      hunks = []
      files.set(target[1], hunks)
      hunk = undefined
    } else if (hunks && line.startsWith("@@")) {
      hunk = []
      hunks.push(hunk)
    } else if (hunk && (line.startsWith(" ") || line.startsWith("+"))) {
      hunk.push(line.slice(1))
    }
  }
  return files
}

/** Fails unless the installed driver has a patch in patches/ and carries it (patch-package ran on `npm ci`). */
export const checkFixed = () => {
  const version = JSON.parse(Fs.readFileSync(Path.join(installed, "package.json"), "utf8")).version
  const patchFile = Path.join(root, "patches", `${driver}+${version}.patch`)
  if (!Fs.existsSync(patchFile)) {
    throw new Error(`${driver} ${version} is installed, and patches/ has no fix for it: check that this version fixes the close race (test/layers/PorsagerCloseRace.pg.test.ts), then drop the bundling, or port the patch`)
  }
  for (const [file, hunks] of patchedHunks(Fs.readFileSync(patchFile, "utf8"))) {
    const text = Fs.readFileSync(Path.join(installed, file), "utf8")
    for (const hunk of hunks) {
      if (!text.includes(hunk.join("\n"))) {
        throw new Error(`node_modules/${driver}/${file} lacks the fix in ${Path.relative(root, patchFile)} (run \`npx patch-package\`)`)
      }
    }
  }
  return version
}

const stage = (pkg) => {
  const target = Path.join(pkg, "node_modules", driver)
  if (Fs.existsSync(target) && !Fs.existsSync(marker(pkg))) throw new Error(`${target} exists already: npm installed a driver of its own for this package`)
  const version = checkFixed()
  Fs.rmSync(target, { recursive: true, force: true })
  Fs.mkdirSync(Path.dirname(target), { recursive: true })
  Fs.writeFileSync(marker(pkg), "")
  Fs.cpSync(installed, target, { recursive: true, dereference: true })
  console.error(`bundling ${driver} ${version} with the fix in patches/ into ${Path.relative(root, pkg)}`)
}

const unstage = (pkg) => {
  if (!Fs.existsSync(marker(pkg))) return
  Fs.rmSync(Path.join(pkg, "node_modules", driver), { recursive: true, force: true })
  Fs.rmSync(marker(pkg), { force: true })
  const modules = Path.join(pkg, "node_modules")
  if (Fs.readdirSync(modules).length === 0) Fs.rmdirSync(modules)
}

if (process.argv[1] && Path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const command = process.argv[2]
  if (command === "stage") stage(process.cwd())
  else if (command === "unstage") unstage(process.cwd())
  else if (command === "check") console.log(`${driver} ${checkFixed()} carries its fix`)
  else throw new Error("usage: node scripts/bundle-driver.mjs stage|unstage|check")
}
