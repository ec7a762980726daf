/**
 * Call analysis from a transcript: who talked how much and how fast, how much of the call was
 * silence, the longest monologue, and the words that came up most.
 *
 * `layerDeterministic` computes everything from the segments and nothing else, so the same
 * transcript always gives the same analysis (safe to recompute on a retried `analyze` job).
 * An LLM-backed analyzer fits behind the same tag: it fills the optional `summary`, reports itself
 * in `analyzer`, and may fail with the JobError tags an HTTP API needs; `layerWithSummary` is that shape.
 */
import { Context, Effect, Layer, Schema } from "effect"
import * as JobError from "pgfiber/internal/JobError.js"

// ---------------------------------------------------------------------------------------------
// Schemas, shared with the stages that store transcripts and analyses

const Milliseconds = Schema.Number.pipe(Schema.finite(), Schema.nonNegative())

/** One utterance on one channel; SpeechKit's channelTag is a string, other sources use numbers. */
export const Segment = Schema.Struct({
  startMs: Milliseconds,
  endMs: Milliseconds,
  channel: Schema.Union(Schema.String, Schema.Number),
  text: Schema.String
}).pipe(Schema.filter((segment) => segment.endMs >= segment.startMs || "endMs must not be before startMs"))
export type Segment = typeof Segment.Type

export const Transcript = Schema.Struct({
  segments: Schema.Array(Segment),
  language: Schema.optional(Schema.String),
  /** The recording's length; without it the call is taken to end with its last segment. */
  durationMs: Schema.optional(Milliseconds)
})
export type Transcript = typeof Transcript.Type

export const ChannelStats = Schema.Struct({
  /** Channels are reported as strings, so 0 and "0" are one channel. */
  channel: Schema.String,
  /** Time covered by this channel's segments; its own overlapping segments count once. */
  talkMs: Schema.Number,
  /** This channel's part of all channels' talk time, 0..1 (crosstalk counts for both sides). */
  share: Schema.Number,
  words: Schema.Int,
  /** Words per minute of this channel's own talk time. */
  wordsPerMinute: Schema.Number
})
export type ChannelStats = typeof ChannelStats.Type

export const Monologue = Schema.Struct({
  channel: Schema.String,
  startMs: Schema.Number,
  endMs: Schema.Number,
  durationMs: Schema.Number
})
export type Monologue = typeof Monologue.Type

export const Keyword = Schema.Struct({ word: Schema.String, count: Schema.Int })
export type Keyword = typeof Keyword.Type

export const CallAnalysis = Schema.Struct({
  /** Which analyzer produced this, so stored analyses can be told apart and redone. */
  analyzer: Schema.String,
  durationMs: Schema.Number,
  totalWords: Schema.Int,
  /** Share of the call covered by no segment, 0..1; 0 for a call of no length. */
  silenceRatio: Schema.Number,
  /** Ordered by channel: numeric channels numerically first, then the rest by code point. */
  channels: Schema.Array(ChannelStats),
  /** Consecutive segments of one channel (in start order) merged; null without segments. */
  longestMonologue: Schema.NullOr(Monologue),
  /** Top 10 by count, ties alphabetical; stopwords, numbers and one-letter words left out. */
  keywords: Schema.Array(Keyword),
  language: Schema.optional(Schema.String),
  /** Free-text summary; only analyzers backed by a language model write it. */
  summary: Schema.optional(Schema.String)
})
export type CallAnalysis = typeof CallAnalysis.Type

export type AnalyzerError = JobError.Transient | JobError.RateLimited | JobError.Permanent

export class Analyzer extends Context.Tag("pgfiber/Analyzer")<Analyzer, {
  readonly analyze: (transcript: Transcript) => Effect.Effect<CallAnalysis, AnalyzerError>
}>() {}

// ---------------------------------------------------------------------------------------------
// Words

/** A small list for Russian and English calls: function words, pronouns, fillers. ё is folded to е. */
export const stopwords: ReadonlySet<string> = new Set([
  // English
  "a", "about", "all", "also", "am", "an", "and", "any", "are", "as", "at", "be", "been", "but", "by", "can",
  "could", "did", "do", "does", "don't", "for", "from", "had", "has", "have", "he", "her", "here", "him", "his",
  "how", "i", "i'm", "if", "in", "into", "is", "it", "it's", "its", "just", "let", "me", "my", "no", "not", "of",
  "oh", "ok", "okay", "on", "or", "our", "she", "so", "some", "that", "that's", "the", "their", "them", "then",
  "there", "these", "they", "this", "those", "to", "uh", "um", "up", "us", "was", "we", "well", "were", "what",
  "when", "where", "which", "who", "will", "with", "would", "yeah", "yes", "you", "your",
  // Russian
  "а", "ага", "алло", "без", "бы", "был", "была", "были", "было", "быть", "в", "вам", "вас", "во", "вот", "все",
  "всё", "вы", "где", "да", "для", "до", "его", "ее", "если", "есть", "еще", "же", "за", "здесь", "и", "из", "или",
  "им", "их", "к", "как", "когда", "кто", "ли", "мне", "мы", "на", "надо", "не", "нет", "ни", "но", "ну", "о",
  "об", "он", "она", "они", "оно", "от", "по", "при", "про", "с", "со", "так", "там", "тем", "то", "тоже", "ты",
  "тут", "у", "угу", "уже", "чем", "что", "чтобы", "это", "этот", "эта", "эти", "я"
].map((word) => word.replace(/ё/g, "е")))

/** Lowercased words: letters and digits, with inner apostrophes and hyphens (don't, из-за). */
export const words = (text: string): ReadonlyArray<string> =>
  text.toLowerCase().replace(/ё/g, "е").match(/[\p{L}\p{N}]+(?:['’-][\p{L}\p{N}]+)*/gu)?.map((word) =>
    word.replace(/’/g, "'")
  ) ?? []

const isKeyword = (word: string) => word.length > 1 && !/^\p{N}+$/u.test(word) && !stopwords.has(word)

// Plain code-point order, never localeCompare: the result must not depend on the machine's ICU.
const compareText = (a: string, b: string) => (a < b ? -1 : a > b ? 1 : 0)

const isNumeric = (channel: string) => /^\d+$/.test(channel)

const compareChannels = (a: string, b: string) =>
  isNumeric(a) && isNumeric(b)
    ? Number(a) - Number(b) || compareText(a, b)
    : isNumeric(a) !== isNumeric(b)
    ? (isNumeric(a) ? -1 : 1)
    : compareText(a, b)

// ---------------------------------------------------------------------------------------------
// The deterministic analysis

interface Span {
  readonly startMs: number
  readonly endMs: number
}

/** Length of the union of spans: overlapping and touching spans count once. */
const coveredMs = (spans: ReadonlyArray<Span>): number => {
  const sorted = [...spans].sort((a, b) => a.startMs - b.startMs || a.endMs - b.endMs)
  let total = 0
  let current: { startMs: number; endMs: number } | undefined
  for (const span of sorted) {
    if (current !== undefined && span.startMs <= current.endMs) {
      current.endMs = Math.max(current.endMs, span.endMs)
    } else {
      if (current !== undefined) total += current.endMs - current.startMs
      current = { startMs: span.startMs, endMs: span.endMs }
    }
  }
  return current === undefined ? total : total + current.endMs - current.startMs
}

const round = (value: number, digits: number) => {
  const factor = 10 ** digits
  return Math.round(value * factor) / factor
}

export const deterministicAnalyzerName = "deterministic/1"

/** The whole analysis as a pure function; `layerDeterministic` is this behind the tag. */
export const analyzeDeterministic = (transcript: Transcript): CallAnalysis => {
  // Clamped rather than trusted: callers may pass transcripts that never went through the Schema.
  const segments = transcript.segments
    .map((segment) => {
      const startMs = Math.max(0, segment.startMs)
      return {
        startMs,
        endMs: Math.max(startMs, segment.endMs),
        channel: String(segment.channel),
        words: words(segment.text)
      }
    })
    .sort((a, b) => a.startMs - b.startMs || a.endMs - b.endMs || compareChannels(a.channel, b.channel))

  const durationMs = Math.max(transcript.durationMs ?? 0, ...segments.map((segment) => segment.endMs))

  const byChannel = new Map<string, Array<(typeof segments)[number]>>()
  for (const segment of segments) {
    const list = byChannel.get(segment.channel) ?? []
    list.push(segment)
    byChannel.set(segment.channel, list)
  }
  const perChannel = [...byChannel.entries()]
    .sort(([a], [b]) => compareChannels(a, b))
    .map(([channel, own]) => ({
      channel,
      talkMs: coveredMs(own),
      words: own.reduce((sum, segment) => sum + segment.words.length, 0)
    }))
  const totalTalkMs = perChannel.reduce((sum, channel) => sum + channel.talkMs, 0)
  const channels = perChannel.map(({ channel, talkMs, words }) => ({
    channel,
    talkMs,
    share: totalTalkMs > 0 ? round(talkMs / totalTalkMs, 4) : 0,
    words,
    wordsPerMinute: talkMs > 0 ? round(words / (talkMs / 60_000), 1) : 0
  }))

  let longestMonologue: Monologue | null = null
  let run: { channel: string; startMs: number; endMs: number } | undefined
  const closeRun = () => {
    // Strictly longer wins, so among equals the earliest run stays.
    if (run !== undefined && (longestMonologue === null || run.endMs - run.startMs > longestMonologue.durationMs)) {
      longestMonologue = { ...run, durationMs: run.endMs - run.startMs }
    }
  }
  for (const segment of segments) {
    if (run !== undefined && run.channel === segment.channel) {
      run.endMs = Math.max(run.endMs, segment.endMs)
    } else {
      closeRun()
      run = { channel: segment.channel, startMs: segment.startMs, endMs: segment.endMs }
    }
  }
  closeRun()

  const counts = new Map<string, number>()
  for (const segment of segments) {
    for (const word of segment.words) {
      if (isKeyword(word)) counts.set(word, (counts.get(word) ?? 0) + 1)
    }
  }
  const keywords = [...counts.entries()]
    .sort(([wordA, countA], [wordB, countB]) => countB - countA || compareText(wordA, wordB))
    .slice(0, 10)
    .map(([word, count]) => ({ word, count }))

  return {
    analyzer: deterministicAnalyzerName,
    durationMs,
    totalWords: segments.reduce((sum, segment) => sum + segment.words.length, 0),
    silenceRatio: durationMs > 0 ? round((durationMs - coveredMs(segments)) / durationMs, 4) : 0,
    channels,
    longestMonologue,
    keywords,
    ...(transcript.language === undefined ? {} : { language: transcript.language })
  }
}

export const makeDeterministic: Analyzer["Type"] = Analyzer.of({
  analyze: Effect.fn("Analyzer.analyze")(function*(transcript: Transcript) {
    yield* Effect.annotateCurrentSpan({ analyzer: deterministicAnalyzerName, segments: transcript.segments.length })
    return analyzeDeterministic(transcript)
  })
})

/** The default: no network, no model, same input same output. */
export const layerDeterministic: Layer.Layer<Analyzer> = Layer.succeed(Analyzer, makeDeterministic)

/**
 * The deterministic analysis plus a summary from `summarize` (a language model, later). Its failures
 * pass through with their JobError tags, so a rate-limited model is retried, not dead-lettered.
 */
export const layerWithSummary = <R>(
  name: string,
  summarize: (transcript: Transcript, analysis: CallAnalysis) => Effect.Effect<string, AnalyzerError, R>
): Layer.Layer<Analyzer, never, R> =>
  Layer.effect(
    Analyzer,
    Effect.map(Effect.context<R>(), (context) =>
      Analyzer.of({
        analyze: Effect.fn("Analyzer.analyze")(function*(transcript: Transcript) {
          yield* Effect.annotateCurrentSpan({ analyzer: name, segments: transcript.segments.length })
          const analysis = analyzeDeterministic(transcript)
          const summary = yield* Effect.provide(summarize(transcript, analysis), context)
          return { ...analysis, analyzer: name, summary }
        })
      }))
  )
