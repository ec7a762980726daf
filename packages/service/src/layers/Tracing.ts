/**
 * Optional OpenTelemetry export. The spans are already there (`Effect.fn` on queue operations, `stage.<name>`
 * per job run, `http.server` per request); when OTEL_EXPORTER_OTLP_ENDPOINT is set they are sent over
 * OTLP/HTTP (JSON) to `<endpoint>/v1/traces` by `@effect/opentelemetry`'s OtlpTracer, which needs no
 * OpenTelemetry SDK. The package is loaded only then, so a build without it runs untraced; asking for tracing
 * without it installed fails start-up with the package to install.
 */
import * as FetchHttpClient from "@effect/platform/FetchHttpClient"
import { Config, ConfigError, Effect, Layer, Option } from "effect"

export const config = Config.all({
  endpoint: Config.option(Config.string("OTEL_EXPORTER_OTLP_ENDPOINT")),
  serviceName: Config.string("OTEL_SERVICE_NAME").pipe(Config.withDefault("pgfiber"))
})

/** Kept in a variable so the type checker does not require the optional package. */
const otelPackage = "@effect/opentelemetry"

const tracesUrl = (endpoint: string) => `${endpoint.replace(/\/+$/, "")}/v1/traces`

export const layer: Layer.Layer<never, ConfigError.ConfigError> = Layer.unwrapEffect(
  Effect.gen(function*() {
    const { endpoint, serviceName } = yield* config
    if (Option.isNone(endpoint) || endpoint.value.trim() === "") return Layer.empty
    if (!/^https?:\/\//.test(endpoint.value)) {
      return yield* Effect.fail(ConfigError.InvalidData(["OTEL_EXPORTER_OTLP_ENDPOINT"], "must be an http(s) URL"))
    }
    const otel = yield* Effect.tryPromise(() => import(otelPackage) as Promise<any>).pipe(
      Effect.mapError(() =>
        ConfigError.InvalidData(
          ["OTEL_EXPORTER_OTLP_ENDPOINT"],
          `is set, but ${otelPackage} is not installed: npm install ${otelPackage}`
        )
      )
    )
    // the package is optional and loaded by name, so its types are not imported: its layers are typed here, loosely
    const tracer: Layer.Layer<never, never, any> = otel.OtlpTracer.layer({
      url: tracesUrl(endpoint.value),
      resource: { serviceName }
    })
    // newer versions take the wire format as a service; older ones encode JSON themselves
    const serialization: Layer.Layer<any> = otel.OtlpSerialization?.layerJson ?? Layer.empty
    yield* Effect.logInfo(`exporting traces to ${tracesUrl(endpoint.value)}`)
    return tracer.pipe(Layer.provide(serialization), Layer.provide(FetchHttpClient.layer)) as Layer.Layer<never>
  })
)
