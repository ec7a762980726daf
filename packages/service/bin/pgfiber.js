#!/usr/bin/env -S node --max-semi-space-size=4
// --max-semi-space-size=4: V8's young generation at 4 MiB per semi-space instead of 16 keeps an idle service
// near 110 MiB of RSS instead of 125 (`npm run bench:startup`); `npm start` runs node with the same flag.
// `npx pgfiber …` / the installed `pgfiber` command: the compiled CLI (`npm run build`, run by `prepare`).
const cli = new URL("../dist/cli.js", import.meta.url)
try {
  await import(cli.href)
} catch (error) {
  if (error?.code === "ERR_MODULE_NOT_FOUND" && String(error.message).includes("dist/cli.js")) {
    process.stderr.write("pgfiber: the compiled CLI (dist/cli.js) is missing: run `npm run build` in the checkout (npm ci runs it)\n")
    process.exit(1)
  }
  throw error
}
