/**
 * Webhooks: per-org subscriptions to job events, each delivery a job of the internal stage `pgfiber.webhook`,
 * signed per the Standard Webhooks spec (docs/events.md).
 */
export * as Delivery from "./Delivery.js"
export * as Subscriptions from "./Subscriptions.js"
export * as Target from "./Target.js"
