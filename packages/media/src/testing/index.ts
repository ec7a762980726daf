/**
 * The media pipelines' doubles for your own tests: the SpeechKit simulator (a local HTTP server that speaks
 * SpeechKit's REST API and checks requests as SpeechKit would) and in-memory storage.
 */
export * as SpeechKitSimulator from "./SpeechKitSimulator.js"
export { layerMemory as layerMemoryStorage, makeMemory as makeMemoryStorage } from "./MemoryStorage.js"
