import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Either, Schema } from "effect"
import * as JobError from "../../packages/pgfiber/src/JobError.js"
import * as Analyzer from "../../packages/media/src/layers/Analyzer.js"

/**
 * A support call, 60 s, agent on channel 0 and client on channel 1. Every expected number below is
 * worked out by hand in the comments, not copied from the implementation's output.
 */
const supportCall: Analyzer.Transcript = {
  durationMs: 60_000,
  language: "en-US",
  segments: [
    { startMs: 0, endMs: 10_000, channel: 0, text: "Hello, thank you for calling Acme support." }, // 7 words
    { startMs: 9_000, endMs: 20_000, channel: 1, text: "Hi, I want a refund for my order" }, // 8 words, overlaps 1 s
    { startMs: 25_000, endMs: 30_000, channel: 0, text: "Your refund for the order is approved." }, // 7 words
    { startMs: 30_000, endMs: 40_000, channel: 1, text: "The order number is 12345" }, // 5 words
    { startMs: 42_000, endMs: 50_000, channel: 1, text: "Great, thank you! Refund, refund." } // 5 words
  ]
}

describe("Analyzer.analyzeDeterministic", () => {
  it("computes talk time, shares, words per minute, silence, monologue and keywords by hand", () => {
    const analysis = Analyzer.analyzeDeterministic(supportCall)
    expect(analysis).toEqual({
      analyzer: "deterministic/1",
      durationMs: 60_000,
      totalWords: 32, // 7 + 8 + 7 + 5 + 5
      // Covered: [0, 20 s] (0-10 and 9-20 overlap) = 20 s, [25, 40 s] (touching) = 15 s, [42, 50 s] = 8 s
      // → 43 s of 60 s; silence 17/60 = 0.28333…
      silenceRatio: 0.2833,
      channels: [
        // 10 s + 5 s = 15 s; 15/44 = 0.340909…; 14 words / 0.25 min = 56
        { channel: "0", talkMs: 15_000, share: 0.3409, words: 14, wordsPerMinute: 56 },
        // 11 s + 10 s + 8 s = 29 s; 29/44 = 0.659090…; 18 words / (29/60) min = 37.241…
        { channel: "1", talkMs: 29_000, share: 0.6591, words: 18, wordsPerMinute: 37.2 }
      ],
      // Runs in start order: 0 [0,10], 1 [9,20], 0 [25,30], 1 [30,40]+[42,50] → 1 from 30 s to 50 s
      longestMonologue: { channel: "1", startMs: 30_000, endMs: 50_000, durationMs: 20_000 },
      // refund ×4, order ×3, thank ×2, then the ×1 words alphabetically until 10 (support, want cut);
      // you/for/your/the/is/i/a/my are stopwords, 12345 is a number
      keywords: [
        { word: "refund", count: 4 },
        { word: "order", count: 3 },
        { word: "thank", count: 2 },
        { word: "acme", count: 1 },
        { word: "approved", count: 1 },
        { word: "calling", count: 1 },
        { word: "great", count: 1 },
        { word: "hello", count: 1 },
        { word: "hi", count: 1 },
        { word: "number", count: 1 }
      ],
      language: "en-US"
    })
    expect(analysis.summary).toBeUndefined()
  })

  it("an empty transcript is all zeros, no monologue, no keywords", () => {
    expect(Analyzer.analyzeDeterministic({ segments: [] })).toEqual({
      analyzer: "deterministic/1",
      durationMs: 0,
      totalWords: 0,
      silenceRatio: 0,
      channels: [],
      longestMonologue: null,
      keywords: []
    })
    // A 30 s recording in which nobody spoke is all silence.
    const silent = Analyzer.analyzeDeterministic({ segments: [], durationMs: 30_000 })
    expect(silent.silenceRatio).toBe(1)
    expect(silent.durationMs).toBe(30_000)
  })

  it("crosstalk counts for both channels; a channel's own overlapping segments count once", () => {
    const analysis = Analyzer.analyzeDeterministic({
      segments: [
        { startMs: 0, endMs: 6_000, channel: "agent", text: "one two three" },
        { startMs: 4_000, endMs: 8_000, channel: "agent", text: "four" }, // agent covers [0, 8 s] = 8 s
        { startMs: 2_000, endMs: 5_000, channel: "client", text: "five six" } // entirely inside the agent's talk
      ]
    })
    // Shares are of all talk (8 + 3 = 11 s), not of the call: 8/11 = 0.72727…, 3/11 = 0.27272…
    expect(analysis.channels).toEqual([
      { channel: "agent", talkMs: 8_000, share: 0.7273, words: 4, wordsPerMinute: 30 }, // 4 / (8/60)
      { channel: "client", talkMs: 3_000, share: 0.2727, words: 2, wordsPerMinute: 40 } // 2 / (3/60)
    ])
    // Union is [0, 8 s] and the call ends at 8 s: no silence.
    expect(analysis.durationMs).toBe(8_000)
    expect(analysis.silenceRatio).toBe(0)
    // Start order: agent 0, client 2 s, agent 4 s → agent [0,6], client [2,5], agent [4,8]; longest 6 s.
    expect(analysis.longestMonologue).toEqual({ channel: "agent", startMs: 0, endMs: 6_000, durationMs: 6_000 })
  })

  it("channel 0 and \"0\" are one channel; numeric channels sort numerically before named ones", () => {
    const analysis = Analyzer.analyzeDeterministic({
      segments: [
        { startMs: 0, endMs: 1_000, channel: "10", text: "a" },
        { startMs: 1_000, endMs: 2_000, channel: "b", text: "a" },
        { startMs: 2_000, endMs: 3_000, channel: 2, text: "a" },
        { startMs: 3_000, endMs: 4_000, channel: "2", text: "a" },
        { startMs: 4_000, endMs: 5_000, channel: "A", text: "a" }
      ]
    })
    expect(analysis.channels.map((c) => [c.channel, c.talkMs])).toEqual([["2", 2_000], ["10", 1_000], ["A", 1_000], ["b", 1_000]])
  })

  it("a recording longer than its last segment counts the tail as silence; a shorter one is stretched", () => {
    const segments = [{ startMs: 1_000, endMs: 4_000, channel: 0, text: "x" }]
    expect(Analyzer.analyzeDeterministic({ segments, durationMs: 10_000 }).silenceRatio).toBe(0.7) // 7 of 10 s
    const stretched = Analyzer.analyzeDeterministic({ segments, durationMs: 2_000 })
    expect(stretched.durationMs).toBe(4_000)
    expect(stretched.silenceRatio).toBe(0.25) // [0, 1 s] of 4 s
  })

  it("Russian: ё folds to е, stopwords drop, ties are alphabetical", () => {
    const analysis = Analyzer.analyzeDeterministic({
      segments: [{ startMs: 0, endMs: 6_000, channel: "1", text: "Да, я ещё жду доставку. Доставка всё ещё не пришла!" }]
    })
    expect(analysis.totalWords).toBe(10)
    // да я еще все еще не are stopwords (всё and ещё through the ё fold); а < у decides доставка/доставку
    expect(analysis.keywords).toEqual([
      { word: "доставка", count: 1 },
      { word: "доставку", count: 1 },
      { word: "жду", count: 1 },
      { word: "пришла", count: 1 }
    ])
    expect(Analyzer.words("Don't из-за 3,5 it’s")).toEqual(["don't", "из-за", "3", "5", "it's"])
  })

  it("the order segments arrive in does not change the result", () => {
    const reversed = { ...supportCall, segments: [...supportCall.segments].reverse() }
    expect(Analyzer.analyzeDeterministic(reversed)).toEqual(Analyzer.analyzeDeterministic(supportCall))
  })
})

describe("Analyzer schemas", () => {
  it("a transcript with a segment ending before it starts does not decode", () => {
    const decoded = Schema.decodeUnknownEither(Analyzer.Transcript)({
      segments: [{ startMs: 5_000, endMs: 1_000, channel: 0, text: "x" }]
    })
    expect(Either.isLeft(decoded)).toBe(true)
    expect(Either.isLeft(decoded) && decoded.left.message).toContain("endMs must not be before startMs")
  })

  it("an analysis survives a JSON round trip through its Schema", () => {
    const analysis = Analyzer.analyzeDeterministic(supportCall)
    const json = JSON.stringify(Schema.encodeSync(Analyzer.CallAnalysis)(analysis))
    expect(Schema.decodeUnknownSync(Analyzer.CallAnalysis)(JSON.parse(json))).toEqual(analysis)
  })
})

describe("Analyzer layers", () => {
  it.effect("layerDeterministic serves the pure analysis behind the tag", () =>
    Effect.gen(function*() {
      const analyzer = yield* Analyzer.Analyzer
      expect(yield* analyzer.analyze(supportCall)).toEqual(Analyzer.analyzeDeterministic(supportCall))
    }).pipe(Effect.provide(Analyzer.layerDeterministic)))

  it.effect("layerWithSummary adds a summary and passes a model's RateLimited through", () =>
    Effect.gen(function*() {
      const summarized = yield* Effect.flatMap(Analyzer.Analyzer, (a) => a.analyze(supportCall)).pipe(
        Effect.provide(Analyzer.layerWithSummary("test-model", (_transcript, analysis) =>
          Effect.succeed(`${analysis.channels.length} channels, top word ${analysis.keywords[0]?.word}`)))
      )
      expect(summarized.summary).toBe("2 channels, top word refund")
      expect(summarized.analyzer).toBe("test-model")
      expect(summarized.channels).toEqual(Analyzer.analyzeDeterministic(supportCall).channels)

      const limited = yield* Effect.flatMap(Analyzer.Analyzer, (a) => a.analyze(supportCall)).pipe(
        Effect.provide(Analyzer.layerWithSummary("test-model", () =>
          Effect.fail(new JobError.RateLimited({ message: "slow down", retryAfter: Duration.seconds(20) })))),
        Effect.flip
      )
      expect(limited._tag).toBe("RateLimited")
    }))
})
