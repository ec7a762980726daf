/**
 * Logs: JSON lines by default (one object per line, for journald / a log shipper), `pretty` for a terminal.
 * Every value logged passes through `redactSecrets`, so a payload field named like a secret never reaches a log.
 */
import { Config, Either, HashMap, Layer, Logger, LogLevel } from "effect"
import * as ConfigError from "effect/ConfigError"

const secretKey = /(token|secret|password|passwd|api[-_]?key|access[-_]?key|authorization|cookie|credential|private[-_]?key|^key$)/i

/** A deep copy with secret-looking fields replaced by "<redacted>"; non-plain values pass through. */
export const redactSecrets = (value: unknown, depth = 0): unknown => {
  if (depth > 8 || value === null || typeof value !== "object") return value
  if (Array.isArray(value)) return value.map((v) => redactSecrets(v, depth + 1))
  const proto = Object.getPrototypeOf(value)
  if (proto !== Object.prototype && proto !== null) return value
  return Object.fromEntries(
    Object.entries(value).map(([k, v]) => [k, secretKey.test(k) ? "<redacted>" : redactSecrets(v, depth + 1)])
  )
}

export const config = Config.all({
  format: Config.literal("json", "pretty", "logfmt")("LOG_FORMAT").pipe(Config.withDefault("json" as const)),
  level: Config.string("LOG_LEVEL").pipe(
    Config.mapOrFail((text) => {
      const wanted = text.trim().toLowerCase()
      const level = LogLevel.allLevels.find((l) => l._tag.toLowerCase() === wanted || l.label.toLowerCase() === wanted)
      return level
        ? Either.right(level)
        : Either.left(ConfigError.InvalidData([], `"${text}" is not a log level (trace, debug, info, warn, error, fatal, none)`))
    }),
    Config.withDefault(LogLevel.Info)
  )
})

const redacting = <O>(logger: Logger.Logger<unknown, O>) =>
  Logger.mapInputOptions(logger, (options) => ({
    ...options,
    message: Array.isArray(options.message) ? options.message.map((m) => redactSecrets(m)) : redactSecrets(options.message),
    annotations: HashMap.map(options.annotations, (v) => redactSecrets(v))
  }))

export const make = (format: "json" | "pretty" | "logfmt", level: LogLevel.LogLevel) =>
  Layer.mergeAll(
    Logger.replace(
      Logger.defaultLogger,
      format === "json"
        ? redacting(Logger.jsonLogger).pipe(Logger.withConsoleLog)
        : format === "logfmt"
        ? redacting(Logger.logfmtLogger).pipe(Logger.withConsoleLog)
        : redacting(Logger.prettyLogger())
    ),
    Logger.minimumLogLevel(level)
  )

export const layer = Layer.unwrapEffect(Config.map(config, ({ format, level }) => make(format, level)))
