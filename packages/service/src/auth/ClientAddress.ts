/**
 * Who a request comes from, for the failed-authentication limit (AuthLimiter.ts). Behind a TLS proxy every
 * request arrives from the proxy's address and the client's is in `X-Forwarded-For`, but anyone can send that
 * header: it is believed only when the peer is a configured proxy (`PGFIBER_TRUSTED_PROXIES`, addresses or
 * CIDRs). The header is read from the right, skipping trusted proxies, so a client cannot choose its address
 * by sending a header of its own: the first address a trusted proxy vouches for that is not itself a proxy is
 * the client. IPv4-mapped IPv6 addresses (`::ffff:10.0.0.1`) are the IPv4 address, so one client has one name.
 */
import { Config, ConfigError, Either } from "effect"
import * as Net from "node:net"

export interface TrustedProxies {
  /** As configured, for logs and docs. */
  readonly entries: ReadonlyArray<string>
  readonly contains: (address: string) => boolean
}

/** No proxy is trusted: `X-Forwarded-For` is ignored and the peer's address is the client's. */
export const none: TrustedProxies = { entries: [], contains: () => false }

const mappedV4 = /^::ffff:(\d{1,3}(?:\.\d{1,3}){3})$/i

/**
 * An address as one client's name: IPv4 dotted, IPv6 lower case, a mapped IPv4 as IPv4; an `X-Forwarded-For`
 * entry may carry a port (`1.2.3.4:5678`, `[::1]:80`) or brackets. Undefined when it is not an IP address.
 */
export const normalise = (text: string): string | undefined => {
  let address = text.trim()
  const bracketed = /^\[([^\]]+)\](?::\d{1,5})?$/.exec(address)
  if (bracketed !== null) address = bracketed[1]!
  else if (/^\d{1,3}(?:\.\d{1,3}){3}:\d{1,5}$/.test(address)) address = address.slice(0, address.lastIndexOf(":"))
  const mapped = mappedV4.exec(address)
  if (mapped !== null) address = mapped[1]!
  const family = Net.isIP(address)
  return family === 4 ? address : family === 6 ? address.toLowerCase() : undefined
}

/** Parses a list of addresses and CIDRs separated by commas or spaces; Left names the first bad entry. */
export const parseTrustedProxies = (text: string): Either.Either<TrustedProxies, string> => {
  const entries = text.split(/[\s,]+/).filter((e) => e !== "")
  const list = new Net.BlockList()
  for (const entry of entries) {
    const [base = "", bits, ...rest] = entry.split("/")
    // an address as written (no port, no brackets), a mapped IPv4 read as IPv4
    const address = Net.isIP(base) === 0 ? undefined : normalise(base)
    const family = address === undefined ? 0 : Net.isIP(address)
    const max = family === 4 ? 32 : 128
    const prefix = bits === undefined ? max : /^\d{1,3}$/.test(bits) ? Number(bits) : NaN
    if (address === undefined || rest.length > 0 || !(prefix >= 0 && prefix <= max)) {
      return Either.left(`"${entry.slice(0, 60)}" is not an IP address or CIDR (e.g. 10.0.0.0/8, 192.168.1.10, fd00::/8)`)
    }
    list.addSubnet(address, prefix, family === 4 ? "ipv4" : "ipv6")
  }
  return Either.right({
    entries,
    contains: (address) => {
      const family = Net.isIP(address)
      return family !== 0 && list.check(address, family === 4 ? "ipv4" : "ipv6")
    }
  })
}

/** `PGFIBER_TRUSTED_PROXIES`: unset or empty trusts no proxy; a bad entry fails at start-up, naming the variable. */
export const config: Config.Config<TrustedProxies> = Config.string("PGFIBER_TRUSTED_PROXIES").pipe(
  Config.mapOrFail((text) => Either.mapLeft(parseTrustedProxies(text), (message) => ConfigError.InvalidData([], message))),
  Config.withDefault(none)
)

/**
 * The client's address: the peer's, unless the peer is a trusted proxy; then the right-most `X-Forwarded-For`
 * entry that is not a trusted proxy (or the left-most, when every one is). An entry that is not an address
 * stops the walk at the proxy that wrote it.
 */
export const resolve = (trusted: TrustedProxies, peer: string | undefined, forwardedFor: string | undefined): string => {
  let client = (peer === undefined ? undefined : normalise(peer)) ?? peer ?? "unknown"
  if (forwardedFor === undefined || !trusted.contains(client)) return client
  const hops = forwardedFor.split(",")
  for (let i = hops.length - 1; i >= 0; i--) {
    const hop = normalise(hops[i]!)
    if (hop === undefined) return client
    client = hop
    if (!trusted.contains(hop)) return hop
  }
  return client
}
