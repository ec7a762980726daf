/** `pgfiber/http`: the HTTP API (jobs, dead letters, calls, health, metrics, OpenAPI) and the web dashboard, as Layers. */
export * as Server from "./Server.js"
export * as Dashboard from "../dashboard/Dashboard.js"
export * as Api from "./Api.js"
export * as ApiKeys from "../auth/ApiKeys.js"
export * as Submit from "pgfiber/internal/runtime/Submit.js"
