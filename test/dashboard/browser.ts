/**
 * A real Chromium for the browser tests, found robustly: `CHROMIUM_PATH`, then the system's (Debian's
 * `chromium` package, which .ci/run installs), then the binary of the `@sparticuz/chromium` npm package (a
 * dev dependency: a fresh machine's `npm test` needs no system install; `CHROMIUM_SKIP_SYSTEM=1` forces it).
 * None found is a failure, not a skip: these tests are the dashboard's proof.
 */
import * as Fs from "node:fs"
import { chromium, type Browser } from "playwright-core"

const candidates = ["/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome", "/usr/bin/google-chrome-stable", "/snap/bin/chromium"]

export const findChromium = async (): Promise<string> => {
  const fromEnv = process.env.CHROMIUM_PATH
  if (fromEnv && Fs.existsSync(fromEnv)) return fromEnv
  if (process.env.CHROMIUM_SKIP_SYSTEM !== "1") for (const path of candidates) if (Fs.existsSync(path)) return path
  try {
    const name = "@sparticuz/chromium"
    const mod = (await import(name)) as { default: { executablePath: () => Promise<string> } }
    const path = await mod.default.executablePath()
    if (path && Fs.existsSync(path)) return path
  } catch {
    // not installed
  }
  throw new Error(
    `no Chromium found (tried CHROMIUM_PATH, ${candidates.join(", ")}, @sparticuz/chromium): ` +
      "install Debian's chromium package (apt-get install -y chromium) or set CHROMIUM_PATH"
  )
}

export const launch = async (): Promise<Browser> =>
  chromium.launch({
    executablePath: await findChromium(),
    // root in CI containers: Chromium's sandbox needs user namespaces these do not have
    args: ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--lang=en-US"],
    // a POSIX locale in the environment (LANG=C, or none) gives the page an invalid default language tag
    // ("en-US@posix") in the npm package's build, and Intl throws on it
    env: { ...process.env, LANG: "en_US.UTF-8", LC_ALL: "en_US.UTF-8" },
    timeout: 120_000
  })
