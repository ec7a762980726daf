/**
 * Optional OpenTelemetry export. The spans are already there (`Effect.fn` on queue operations, `stage.<name>`
 * per job run, `http.server` per request); when OTEL_EXPORTER_OTLP_ENDPOINT is set they are sent over
 * OTLP/HTTP (JSON) to `<endpoint>/v1/traces` by `@effect/opentelemetry`'s OtlpTracer, which needs no
 * OpenTelemetry SDK. The package is loaded only then, so a build without it runs untraced; asking for tracing
 * without it installed fails start-up with the package to install.
 */
import type * as OtlpSerialization from "@effect/opentelemetry/OtlpSerialization"
import type * as OtlpTracer from "@effect/opentelemetry/OtlpTracer"
import * as FetchHttpClient from "@effect/platform/FetchHttpClient"
import { Config, ConfigError, Effect, Layer, Option } from "effect"

export const config = Config.all({
  endpoint: Config.option(Config.string("OTEL_EXPORTER_OTLP_ENDPOINT")),
  serviceName: Config.string("OTEL_SERVICE_NAME").pipe(Config.withDefault("pgfiber"))
})

/**
 * Kept in a variable so the bundle does not require the optional package; its types (imported as types only,
 * erased from the build) say what this module uses of it.
 */
const otelPackage = "@effect/opentelemetry"
interface Otel {
  readonly OtlpTracer: { readonly layer: typeof OtlpTracer.layer }
  readonly OtlpSerialization: { readonly layerJson: Layer.Layer<OtlpSerialization.OtlpSerialization> }
}

const tracesUrl = (endpoint: string) => `${endpoint.replace(/\/+$/, "")}/v1/traces`

export const layer: Layer.Layer<never, ConfigError.ConfigError> = Layer.unwrapEffect(
  Effect.gen(function*() {
    const { endpoint, serviceName } = yield* config
    if (Option.isNone(endpoint) || endpoint.value.trim() === "") return Layer.empty
    if (!/^https?:\/\//.test(endpoint.value)) {
      return yield* Effect.fail(ConfigError.InvalidData(["OTEL_EXPORTER_OTLP_ENDPOINT"], "must be an http(s) URL"))
    }
    const otel = yield* Effect.tryPromise(() => import(otelPackage) as Promise<Otel>).pipe(
      Effect.mapError(() =>
        ConfigError.InvalidData(
          ["OTEL_EXPORTER_OTLP_ENDPOINT"],
          `is set, but ${otelPackage} is not installed: npm install ${otelPackage}`
        )
      )
    )
    const tracer = otel.OtlpTracer.layer({
      url: tracesUrl(endpoint.value),
      resource: { serviceName }
    })
    yield* Effect.logInfo(`exporting traces to ${tracesUrl(endpoint.value)}`)
    // the wire format is a service (JSON here), as is the HTTP client that sends it
    return tracer.pipe(Layer.provide(otel.OtlpSerialization.layerJson), Layer.provide(FetchHttpClient.layer))
  })
)
