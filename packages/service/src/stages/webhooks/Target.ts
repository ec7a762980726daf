/**
 * Where a webhook may point: http or https, no credentials in the URL, and, unless an operator allows it
 * (`PGFIBER_WEBHOOK_ALLOW_PRIVATE=true`), a host whose every address is public: loopback, private, link-local,
 * carrier-grade NAT, unique-local, multicast and unspecified addresses are refused, so a tenant cannot make the
 * server call into its own network (SSRF). Checked when a webhook is made and again before each delivery (a
 * name may resolve elsewhere later); the delivery itself follows no redirect.
 */
import { Config, Data, Effect } from "effect"
import * as Dns from "node:dns/promises"
import * as Net from "node:net"

export class TargetRefused extends Data.TaggedError("TargetRefused")<{ readonly message: string }> {}

export const allowPrivateConfig = Config.boolean("PGFIBER_WEBHOOK_ALLOW_PRIVATE").pipe(Config.withDefault(false))

const blocked = new Net.BlockList()
for (const [net, prefix] of [
  ["0.0.0.0", 8], ["10.0.0.0", 8], ["100.64.0.0", 10], ["127.0.0.0", 8], ["169.254.0.0", 16], ["172.16.0.0", 12],
  ["192.0.0.0", 24], ["192.168.0.0", 16], ["198.18.0.0", 15], ["224.0.0.0", 4], ["240.0.0.0", 4]
] as const) blocked.addSubnet(net, prefix, "ipv4")
for (const [net, prefix] of [["::", 128], ["::1", 128], ["fc00::", 7], ["fe80::", 10], ["ff00::", 8]] as const) {
  blocked.addSubnet(net, prefix, "ipv6")
}

/** An address the server must not call for a tenant (IPv4-mapped IPv6 is judged by its IPv4 part). */
export const isPrivateAddress = (address: string): boolean => {
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address)
  if (mapped) return blocked.check(mapped[1]!, "ipv4")
  return Net.isIPv4(address) ? blocked.check(address, "ipv4") : Net.isIPv6(address) ? blocked.check(address, "ipv6") : true
}

/** The URL when it may be called; the reason (fit for the tenant: it names only their own URL) when not. */
export const check = (text: string, allowPrivate: boolean) =>
  Effect.gen(function*() {
    let url: URL
    try {
      url = new URL(text)
    } catch {
      return yield* new TargetRefused({ message: "url is not a valid absolute URL" })
    }
    if (url.protocol !== "https:" && url.protocol !== "http:") return yield* new TargetRefused({ message: "url must be http or https" })
    if (url.username !== "" || url.password !== "") return yield* new TargetRefused({ message: "url must not carry credentials" })
    if (allowPrivate) return url
    const host = url.hostname.replace(/^\[(.*)\]$/, "$1")
    const addresses = Net.isIP(host) !== 0
      ? [host]
      : yield* Effect.tryPromise({
        try: () => Dns.lookup(host, { all: true, verbatim: true }).then((all) => all.map((a) => a.address)),
        catch: () => new TargetRefused({ message: `url's host ${host} could not be resolved` })
      })
    if (addresses.length === 0 || addresses.some(isPrivateAddress)) {
      return yield* new TargetRefused({ message: `url's host ${host} is a loopback, private or link-local address, which webhooks may not call` })
    }
    return url
  })
