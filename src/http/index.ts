/** `pgfiber/http`: the HTTP API (jobs, dead letters, calls, health, metrics, OpenAPI) as a Layer. */
export * as Server from "./Server.js"
export * as Api from "./Api.js"
export * as ApiKeys from "../auth/ApiKeys.js"
export * as Submit from "../runtime/Submit.js"
