/**
 * What a request may carry before anything reads it as text: no NUL anywhere in its path or query (PostgreSQL
 * cannot store one, and no name or id holds one), no query text PostgreSQL would refuse, a body in UTF-8 only
 * (a body labelled with another charset is 415, not read as UTF-8), and a body whose bytes are valid UTF-8 (the
 * first bad byte's offset is named; a decoder would otherwise put U+FFFD in its place and store that). Each check
 * answers with the problem in words, or undefined; Server.ts turns them into 400 and 415.
 */
import * as Queue from "pgfiber/internal/queue/Queue.js"

/** A NUL in the path (raw or percent-encoded), or query text PostgreSQL could not store. */
export const urlProblem = (url: string): string | undefined => {
  const at = url.indexOf("?")
  const path = at < 0 ? url : url.slice(0, at)
  // eslint-disable-next-line no-control-regex -- finding the NUL is the point
  if (/%00|\u0000/i.test(path)) return "the path contains a NUL character (%00), which no name or id may hold"
  if (at < 0) return undefined
  for (const [name, value] of new URLSearchParams(url.slice(at + 1))) {
    const problem = Queue.textProblem(name) ?? Queue.textProblem(value)
    // eslint-disable-next-line no-control-regex -- the NUL is taken out of the name the message quotes
    if (problem !== undefined) return `query parameter ${JSON.stringify(name.replace(/\u0000/g, "").slice(0, 40))} ${problem}`
  }
  return undefined
}

/** A `charset` in the Content-Type other than UTF-8's names. */
export const charsetProblem = (contentType: string | undefined): string | undefined => {
  const match = /;\s*charset\s*=\s*(?:"([^"]*)"|([^;\s]*))/i.exec(contentType ?? "")
  if (match === null) return undefined
  const charset = (match[1] ?? match[2] ?? "").trim().toLowerCase()
  return charset === "utf-8" || charset === "utf8"
    ? undefined
    : `charset ${JSON.stringify(charset.slice(0, 40))} is not supported: send the body as UTF-8 (charset=utf-8, or no charset)`
}

/**
 * The offset of the first byte that does not begin a well-formed UTF-8 sequence (RFC 3629: no overlong forms,
 * no surrogates, nothing past U+10FFFF, no truncated sequence); undefined when every byte does.
 */
export const invalidUtf8Offset = (bytes: Uint8Array): number | undefined => {
  let i = 0
  while (i < bytes.length) {
    const lead = bytes[i]!
    if (lead < 0x80) {
      i += 1
      continue
    }
    // continuation bytes are 80..BF, except the second byte after E0 (overlong), ED (surrogates), F0 (overlong), F4 (> U+10FFFF)
    const follow = lead >= 0xc2 && lead <= 0xdf ? 1 : lead >= 0xe0 && lead <= 0xef ? 2 : lead >= 0xf0 && lead <= 0xf4 ? 3 : 0
    if (follow === 0) return i
    const low = lead === 0xe0 ? 0xa0 : lead === 0xf0 ? 0x90 : 0x80
    const high = lead === 0xed ? 0x9f : lead === 0xf4 ? 0x8f : 0xbf
    for (let k = 1; k <= follow; k++) {
      const next = bytes[i + k]
      if (next === undefined || next < (k === 1 ? low : 0x80) || next > (k === 1 ? high : 0xbf)) return i
    }
    i += follow + 1
  }
  return undefined
}

/** The body's bytes are not UTF-8: where, and what is there. */
export const utf8Problem = (bytes: Uint8Array): string | undefined => {
  const at = invalidUtf8Offset(bytes)
  if (at === undefined) return undefined
  const shown = Array.from(bytes.subarray(at, at + 4), (b) => b.toString(16).toUpperCase().padStart(2, "0")).join(" ")
  return `the request body is not valid UTF-8: invalid byte sequence at byte offset ${at} (${shown})`
}
