/**
 * Dashboard sessions: after a sign-in with an API key, a cookie that says who signed in (the key's id, org and
 * scope) and until when, signed with HMAC-SHA256 under the server's session secret. Nothing is kept in memory,
 * so several servers sharing `DASHBOARD_SESSION_SECRET` accept each other's sessions; every page still checks
 * that the key is live, so revoking it ends its sessions. The cookie is `HttpOnly`, `SameSite=Strict`, scoped
 * to the dashboard's path, and `Secure` when the request came over https. Each form carries a CSRF token
 * derived from the session's nonce, checked on every POST (in addition to SameSite).
 */
import * as Crypto from "node:crypto"
import type * as ApiKeys from "../auth/ApiKeys.js"

export const cookieName = "pgfiber_dashboard"

export interface Session extends ApiKeys.Viewer {
  readonly expiresAt: number
  /** Random per sign-in; the CSRF token is derived from it. */
  readonly nonce: string
}

const mac = (secret: Buffer, text: string) => Crypto.createHmac("sha256", secret).update(text).digest("base64url")

const safeEqual = (a: string, b: string) => {
  const x = Buffer.from(a)
  const y = Buffer.from(b)
  return x.length === y.length && Crypto.timingSafeEqual(x, y)
}

export const newSecret = () => Crypto.randomBytes(32)

export const seal = (secret: Buffer, viewer: ApiKeys.Viewer, ttlMs: number, now: number): { readonly value: string; readonly session: Session } => {
  const session: Session = { ...viewer, expiresAt: now + ttlMs, nonce: Crypto.randomBytes(16).toString("base64url") }
  const body = Buffer.from(JSON.stringify({ k: session.keyId, o: session.orgId, a: session.admin, e: session.expiresAt, n: session.nonce })).toString("base64url")
  return { value: `v1.${body}.${mac(secret, `v1.${body}`)}`, session }
}

/** The session a cookie value carries, when its signature holds and it has not expired. */
export const open = (secret: Buffer, value: string, now: number): Session | undefined => {
  const parts = value.split(".")
  if (parts.length !== 3 || parts[0] !== "v1") return undefined
  if (!safeEqual(parts[2]!, mac(secret, `v1.${parts[1]}`))) return undefined
  try {
    const p = JSON.parse(Buffer.from(parts[1]!, "base64url").toString("utf8")) as { k: unknown; o: unknown; a: unknown; e: unknown; n: unknown }
    if (typeof p.k !== "string" || typeof p.e !== "number" || typeof p.n !== "string" || typeof p.a !== "boolean") return undefined
    if (p.o !== null && typeof p.o !== "string") return undefined
    if (p.e <= now) return undefined
    return { keyId: p.k, orgId: p.o, admin: p.a, expiresAt: p.e, nonce: p.n }
  } catch {
    return undefined
  }
}

export const csrfToken = (secret: Buffer, session: Session) => mac(secret, `csrf.${session.nonce}`)

export const csrfValid = (secret: Buffer, session: Session, presented: string | undefined) =>
  presented !== undefined && safeEqual(presented, csrfToken(secret, session))

/** The cookie named `name` in a Cookie header. */
export const readCookie = (header: string | undefined, name: string): string | undefined => {
  for (const part of (header ?? "").split(";")) {
    const at = part.indexOf("=")
    if (at > 0 && part.slice(0, at).trim() === name) return part.slice(at + 1).trim()
  }
  return undefined
}

export const setCookie = (value: string, options: { readonly path: string; readonly secure: boolean; readonly maxAgeS: number }) =>
  `${cookieName}=${value}; Path=${options.path}; HttpOnly; SameSite=Strict; Max-Age=${options.maxAgeS}${options.secure ? "; Secure" : ""}`

export const clearCookie = (options: { readonly path: string; readonly secure: boolean }) =>
  `${cookieName}=; Path=${options.path}; HttpOnly; SameSite=Strict; Max-Age=0${options.secure ? "; Secure" : ""}`
