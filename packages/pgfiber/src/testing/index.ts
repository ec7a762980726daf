/**
 * `pgfiber/testing`: doubles for your own tests. The in-memory queue (with `TestClock`, delays and leases run in
 * virtual time). The media pipelines' doubles (the SpeechKit simulator, in-memory storage) are the media
 * package's (`testing/media.ts`), so testing a queue loads no HTTP server.
 */
export * as MemoryQueue from "../queue/MemoryQueue.js"
