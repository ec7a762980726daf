/**
 * `pgfiber/client`: the queue as promises, for a Node service that does not use Effect. `connect()`, then
 * `enqueue`, `get`, `cancel`, `wait`, `events` (an async iterator) and `close` (Client.ts).
 */
export * from "./Client.js"
