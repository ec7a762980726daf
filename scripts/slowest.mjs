// The slowest tests of a vitest JSON report (`--outputFile.json=…`): `node scripts/slowest.mjs FILE [N]`.
// CI prints the ten slowest of each pass; docs/testing.md says why each of them takes the time it does.
import * as Fs from "node:fs"
import * as Path from "node:path"

const [file, count = "10"] = process.argv.slice(2)
if (!file) {
  process.stderr.write("usage: node scripts/slowest.mjs REPORT.json [N]\n")
  process.exit(2)
}
const report = JSON.parse(Fs.readFileSync(file, "utf8"))
const tests = report.testResults.flatMap((suite) =>
  suite.assertionResults.map((test) => ({
    file: Path.relative(process.cwd(), suite.name),
    title: test.fullName ?? test.title,
    ms: test.duration ?? 0
  }))
)
tests.sort((a, b) => b.ms - a.ms)
for (const test of tests.slice(0, Number(count))) {
  process.stdout.write(`${(test.ms / 1000).toFixed(1).padStart(7)} s  ${test.file}  ${test.title}\n`)
}
