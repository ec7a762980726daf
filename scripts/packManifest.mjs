// The package.json that `npm pack` / `npm publish` ship. npm packs the file as it is on disk, and the
// repository's scripts name files the package does not ship (scripts/, bench/, test tools): `prepare` runs the
// build on `npm ci` and on installs from git, which is right for a checkout and wrong in a tarball. So:
// - `prepack` builds, then runs `node scripts/packManifest.mjs strip`: package.json is kept aside as
//   package.json.packing and rewritten with only the scripts that run what the package ships;
// - `postpack` runs `node scripts/packManifest.mjs restore`: the kept copy goes back, byte for byte.
// A pack that failed in between leaves package.json.packing; the next `strip` (or `restore`) puts it back first.
import * as Fs from "node:fs"
import * as Path from "node:path"
import { fileURLToPath } from "node:url"

const root = Path.resolve(Path.dirname(fileURLToPath(import.meta.url)), "..")
const manifest = Path.join(root, "package.json")
const kept = `${manifest}.packing`

/** The scripts a user of the package can run: each runs the shipped dist/cli.js. */
const publishedScripts = ["start", "migrate", "pgfiber"]

const restore = () => {
  if (Fs.existsSync(kept)) Fs.renameSync(kept, manifest)
}

const strip = () => {
  restore()
  const text = Fs.readFileSync(manifest, "utf8")
  const pkg = JSON.parse(text)
  Fs.writeFileSync(kept, text)
  pkg.scripts = Object.fromEntries(Object.entries(pkg.scripts ?? {}).filter(([name]) => publishedScripts.includes(name)))
  Fs.writeFileSync(manifest, `${JSON.stringify(pkg, null, 2)}\n`)
}

const command = process.argv[2]
if (command === "strip") strip()
else if (command === "restore") restore()
else {
  process.stderr.write("usage: node scripts/packManifest.mjs strip|restore\n")
  process.exit(2)
}
