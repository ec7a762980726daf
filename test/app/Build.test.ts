/**
 * The bundle's build (`node scripts/build.mjs --cli`, what the test setup runs) beside a CLI that is running: the
 * chunks the build in place loads lazily stay for one more build (a running CLI imports them by path, later), older
 * ones go, and the new build's chunks are all there.
 */
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { afterEach, describe, expect, it } from "vitest"

const folders: Array<string> = []
afterEach(() => {
  for (const folder of folders.splice(0)) Fs.rmSync(folder, { recursive: true, force: true })
})

describe("buildCli", () => {
  it("keeps the previous build's chunks, drops older ones", async () => {
    // @ts-expect-error: a plain ES module script, no declarations
    const { buildCli } = (await import("../../scripts/build.mjs")) as { buildCli: (outdir?: string) => Promise<void> }
    const outdir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "pgfiber-build-"))
    folders.push(outdir)
    const chunks = Path.join(outdir, "cli-chunks")
    Fs.mkdirSync(chunks)
    // "the previous build": cli.js loads Server-PREV lazily, which imports chunk-PREV; chunk-OLDER is from before it
    Fs.writeFileSync(Path.join(outdir, "cli.js"), `import{a}from"./cli-chunks/chunk-PREV.js";const s=()=>import("./cli-chunks/Server-PREV.js");`)
    Fs.writeFileSync(Path.join(chunks, "Server-PREV.js"), `import{b}from"./chunk-PREV.js";export{b}`)
    Fs.writeFileSync(Path.join(chunks, "Server-PREV.js.map"), "{}")
    Fs.writeFileSync(Path.join(chunks, "chunk-PREV.js"), `export const a=1,b=2`)
    Fs.writeFileSync(Path.join(chunks, "chunk-OLDER.js"), `export const c=3`)

    await buildCli(outdir)

    const names = Fs.readdirSync(chunks)
    expect(names).toEqual(expect.arrayContaining(["Server-PREV.js", "Server-PREV.js.map", "chunk-PREV.js"]))
    expect(names).not.toContain("chunk-OLDER.js")
    const cli = Fs.readFileSync(Path.join(outdir, "cli.js"), "utf8")
    const loaded = [...cli.matchAll(/"\.\/cli-chunks\/([\w-]+\.js)"/g)].map((m) => m[1])
    expect(loaded.length).toBeGreaterThan(0)
    for (const name of loaded) expect(names).toContain(name)
  })
})
