/**
 * A vitest reporter that writes, at the end of a run, what a reader of a CI log needs at its end: each failed test
 * (file, name, the first line of its error), each test that passed only when retried (flaky: a bug to fix, not
 * to ignore), each file that failed outside a test (a hook, an import) and each unhandled error. Lines are appended
 * to `.data/test-notes.txt` (or `PGFIBER_TEST_NOTES`), which `.ci/run` prints above its summary line.
 */
import * as Fs from "node:fs"
import * as Path from "node:path"
import type { Reporter, TestCase, TestModule } from "vitest/node"

const firstLine = (text: string | undefined) => (text ?? "").split("\n").find((l) => l.trim() !== "")?.trim().slice(0, 300) ?? ""

export default class NotesReporter implements Reporter {
  private readonly lines: Array<string> = []
  private readonly failedModules = new Set<string>()
  private readonly label = process.env.DATABASE_URL ? "PostgreSQL at DATABASE_URL" : "embedded PostgreSQL"

  onTestCaseResult(test: TestCase) {
    const where = `${Path.relative(process.cwd(), test.module.moduleId)} > ${test.fullName}`
    const result = test.result()
    if (result.state === "failed") {
      this.failedModules.add(test.module.moduleId)
      this.lines.push(`FAILED ${where}: ${firstLine(result.errors?.[0]?.message)}`)
    } else if (result.state === "passed" && test.diagnostic()?.flaky) {
      this.lines.push(`FLAKY (passed on retry ${test.diagnostic()?.retryCount}) ${where}`)
    }
  }

  onTestRunEnd(modules: ReadonlyArray<TestModule>, unhandled: ReadonlyArray<{ message?: string }>) {
    for (const module of modules) {
      const file = Path.relative(process.cwd(), module.moduleId)
      for (const error of module.errors()) this.lines.push(`FILE FAILED ${file}: ${firstLine(error.message)}`)
      if (!module.ok() && module.errors().length === 0 && !this.failedModules.has(module.moduleId)) {
        this.lines.push(`FILE FAILED ${file}: outside its tests (a beforeAll/afterAll hook); its log above says why`)
      }
    }
    for (const error of unhandled) this.lines.push(`UNHANDLED ERROR: ${firstLine(error.message)}`)
    if (this.lines.length === 0) return
    const file = process.env.PGFIBER_TEST_NOTES ?? ".data/test-notes.txt"
    Fs.mkdirSync(Path.dirname(file), { recursive: true })
    Fs.appendFileSync(file, this.lines.map((l) => `[${this.label}] ${l}\n`).join(""))
  }
}
