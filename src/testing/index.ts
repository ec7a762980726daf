/**
 * `pgfiber/testing`: doubles for your own tests. The SpeechKit simulator (a local HTTP server that speaks
 * SpeechKit's REST API and checks requests as SpeechKit would), in-memory storage and the in-memory queue
 * (with `TestClock`, delays and leases run in virtual time).
 */
export * as SpeechKitSimulator from "./SpeechKitSimulator.js"
export * as MemoryQueue from "../queue/MemoryQueue.js"
export { layerMemory as layerMemoryStorage, makeMemory as makeMemoryStorage } from "./MemoryStorage.js"
