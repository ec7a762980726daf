/**
 * Calls.create / Calls.get on real Postgres and s3rver: the call, its source artifact and its first job are
 * written together or not at all; bad requests write nothing; reads are scoped by org. Plus the poll schedule
 * and the handler-time settings, which need no database.
 */
import { describe, expect, it, layer } from "@effect/vitest"
import { ConfigProvider, Duration, Effect } from "effect"
import * as NodeFs from "node:fs/promises"
import * as NodePath from "node:path"
import * as Db from "../../../packages/pgfiber/src/layers/Db.js"
import * as Storage from "../../../packages/media/src/layers/Storage.js"
import * as PgQueue from "../../../packages/pgfiber/src/queue/PgQueue.js"
import { Calls, Settings } from "../../../packages/media/src/stages/calls/index.js"
import { bucket, jobsOf, listObjects, noise, pipelineRows, S3Server, tempDirectory, worldLayer } from "./support.js"

const orgId = "org-calls"

const countRows = Effect.flatMap(Db.Db, (db) =>
  Effect.orDie(db.run((sql) => sql<Array<{ calls: number; jobs: number }>>`
    select (select count(*)::int from calls) as calls, (select count(*)::int from jobs) as jobs`)).pipe(Effect.map(([r]) => r!)))

describe("Calls", () => {
  layer(worldLayer(), { excludeTestServices: true, timeout: 180_000 })((it) => {
    it.scoped("create from a file: uploads it, writes the call, its source artifact and its extract_audio job", () =>
      Effect.gen(function*() {
        const storage = yield* Storage.Storage
        const dir = yield* tempDirectory("calls-create-")
        const file = NodePath.join(dir, "Recording.M4A")
        const bytes = noise(10_000)
        yield* Effect.promise(() => NodeFs.writeFile(file, bytes))

        const id = yield* Calls.create({ orgId, file })
        const key = `orgs/${orgId}/calls/${id}/source.m4a`
        expect(Buffer.compare(yield* storage.get(key), bytes)).toBe(0)
        const call = yield* Calls.get(id)
        expect(call).toMatchObject({
          id,
          orgId,
          status: "queued",
          error: null,
          sourceKey: key,
          sourceUri: yield* storage.uri(key),
          operationId: null,
          completedAt: null,
          transcript: null,
          analysis: null
        })
        expect(call.artifacts).toEqual([
          expect.objectContaining({ kind: "source", storageKey: key, bytes: 10_000, durationMs: null })
        ])
        const [job, ...others] = yield* jobsOf(id)
        expect(others).toEqual([])
        expect(job).toMatchObject({
          stage: "extract_audio",
          payload: { callId: id },
          orgId,
          subjectId: id,
          dedupeKey: `extract_audio:${id}`,
          status: "queued",
          maxAttempts: 5
        })
      }))

    it.effect("create from a storage URI (s3:// or the endpoint URL) reads the object in place, uploads nothing", () =>
      Effect.gen(function*() {
        const storage = yield* Storage.Storage
        const { endpoint } = yield* S3Server
        const key = `orgs/${orgId}/inbox/a.wav`
        yield* storage.put(key, noise(100))
        const before = yield* listObjects("")

        const fromS3 = yield* Calls.create({ orgId, uri: `s3://${bucket}/${key}` })
        const fromUrl = yield* Calls.create({ orgId, uri: `${endpoint}/${bucket}/${key}` })
        expect(yield* listObjects("")).toEqual(before)
        for (const [id, uri] of [[fromS3, `s3://${bucket}/${key}`], [fromUrl, `${endpoint}/${bucket}/${key}`]] as const) {
          const call = yield* Calls.get(id)
          expect([call.sourceUri, call.sourceKey]).toEqual([uri, key])
          expect(call.artifacts.map((a) => [a.kind, a.storageKey, a.bytes])).toEqual([["source", key, null]])
        }
      }))

    it.scoped("bad requests fail InvalidCall and write nothing", () =>
      Effect.gen(function*() {
        const dir = yield* tempDirectory("calls-bad-")
        const file = NodePath.join(dir, "a.wav")
        yield* Effect.promise(() => NodeFs.writeFile(file, noise(100)))
        // objects that exist, but another org's or outside every org's prefix
        const storage = yield* Storage.Storage
        yield* storage.put("orgs/another-org/inbox/a.wav", noise(100))
        yield* storage.put("inbox/a.wav", noise(100))
        const rowsBefore = yield* countRows
        const objectsBefore = yield* listObjects("")
        const cases: ReadonlyArray<[Calls.CreateCall, string]> = [
          [{ orgId: "../etc", file }, "orgId must match"],
          [{ orgId: "", file }, "orgId must match"],
          [{ orgId: "a/b", file }, "orgId must match"],
          [{ orgId }, "give exactly one of file or uri"],
          [{ orgId, file, uri: `s3://${bucket}/x` }, "give exactly one of file or uri"],
          [{ orgId, file: NodePath.join(dir, "missing.wav") }, "no such file"],
          [{ orgId, file: dir }, "not a regular file"],
          // one answer, naming no path, whether the URI is not this storage's, outside the org, or names nothing
          [{ orgId, uri: `s3://another-bucket/orgs/${orgId}/inbox/a.wav` }, Calls.sourceRefused],
          [{ orgId, uri: "ftp://example.com/a.wav" }, Calls.sourceRefused],
          [{ orgId, uri: `s3://${bucket}/orgs/${orgId}/inbox/never-uploaded.wav` }, Calls.sourceRefused],
          [{ orgId, uri: `s3://${bucket}/orgs/another-org/inbox/a.wav` }, Calls.sourceRefused],
          [{ orgId, uri: `s3://${bucket}/inbox/a.wav` }, Calls.sourceRefused]
        ]
        for (const [input, message] of cases) {
          const error = yield* Effect.flip(Calls.create(input))
          expect([error._tag, error.message]).toEqual(["InvalidCall", expect.stringContaining(message)])
        }
        expect(yield* countRows).toEqual(rowsBefore)
        expect(yield* listObjects("")).toEqual(objectsBefore)
      }))

    it.scoped("when the transaction fails (the queue refuses the job), no call is written and the upload is removed", () =>
      Effect.gen(function*() {
        const dir = yield* tempDirectory("calls-atomic-")
        const file = NodePath.join(dir, "a.wav")
        yield* Effect.promise(() => NodeFs.writeFile(file, noise(100)))
        const rowsBefore = yield* countRows
        const objectsBefore = yield* listObjects("")
        const refusing = PgQueue.layer({ knownStages: ["something_else"] })
        const error = yield* Effect.flip(Calls.create({ orgId, file }).pipe(Effect.provide(refusing)))
        expect(error._tag).toBe("InvalidJob")
        expect(yield* countRows).toEqual(rowsBefore)
        expect(yield* listObjects("")).toEqual(objectsBefore)
      }))

    it.scoped("get: scoped by org through row-level security; unknown and malformed ids are not found", () =>
      Effect.gen(function*() {
        const db = yield* Db.Db
        const dir = yield* tempDirectory("calls-get-")
        const file = NodePath.join(dir, "a.wav")
        yield* Effect.promise(() => NodeFs.writeFile(file, noise(100)))
        const id = yield* Calls.create({ orgId, file })

        expect((yield* Calls.get(id, { orgId })).id).toBe(id)
        const other = yield* Effect.flip(Calls.get(id, { orgId: "org-other" }))
        expect([other._tag, other.message]).toEqual(["CallNotFound", `call ${id} not found`])
        for (const missing of ["6f1c9a1e-0000-4000-8000-000000000000", "not-a-uuid", ""]) {
          expect((yield* Effect.flip(Calls.get(missing)))._tag).toBe("CallNotFound")
        }
        // the tables themselves, not only Calls.get: another org sees no row of this call and cannot add one
        const seen = yield* db.withOrg("org-other", pipelineRows(id))
        expect(seen).toEqual({ calls: [], artifacts: [], transcripts: [], analyses: [] })
        const forged = yield* Effect.either(db.withOrg("org-other", db.run((sql) =>
          sql`insert into call_artifacts (call_id, org_id, kind, storage_key) values (${id}, ${orgId}, 'forged', 'x')`)))
        expect(forged._tag === "Left" && forged.left.message).toContain("row-level security")
      }))
  })
})

describe("Settings", () => {
  const settings = (options: Settings.CallStageOptions = {}, env: Record<string, string> = {}) =>
    Settings.resolve(options).pipe(Effect.withConfigProvider(ConfigProvider.fromMap(new Map(Object.entries(env)))))

  it.effect("the first poll waits max(5 s, duration / 6); later ones × 1.5 up to 60 s", () =>
    Effect.gen(function*() {
      const s = yield* settings()
      const ms = (d: Duration.Duration) => Duration.toMillis(d)
      expect(ms(Settings.firstPollAfter(s, 12_000))).toBe(5000)
      expect(ms(Settings.firstPollAfter(s, 120_000))).toBe(20_000)
      expect([0, 1, 2, 3, 4, 5, 6, 7].map((polls) => ms(Settings.nextPollAfter(s, 12_000, polls)))).toEqual([
        7500, 11_250, 16_875, 25_313, 37_969, 56_953, 60_000, 60_000
      ])
      // a long recording waits for a sixth of itself first, then looks every minute
      expect(ms(Settings.nextPollAfter(s, 3_600_000, 0))).toBe(60_000)
      expect([ms(s.pollDeadline), s.allowFileUris]).toEqual([24 * 3_600_000, false])
    }))

  it.effect("options win over the environment, the environment over the defaults; a bad variable is Permanent", () =>
    Effect.gen(function*() {
      const env = { TRANSCRIBE_POLL_DEADLINE_MS: "3600000", TRANSCRIBE_POLL_CAP_MS: "30000", SPEECHKIT_ALLOW_FILE_URIS: "true", MEDIA_TEMP_DIR: "/var/tmp" }
      const fromEnv = yield* settings({}, env)
      expect([Duration.toMillis(fromEnv.pollDeadline), Duration.toMillis(fromEnv.pollCap), fromEnv.allowFileUris, fromEnv.tempDir])
        .toEqual([3_600_000, 30_000, true, "/var/tmp"])
      const fromOptions = yield* settings({ pollDeadline: "1 minute", allowFileUris: false }, env)
      expect([Duration.toMillis(fromOptions.pollDeadline), fromOptions.allowFileUris]).toEqual([60_000, false])
      const bad = yield* Effect.flip(settings({}, { TRANSCRIBE_POLL_DEADLINE_MS: "-5" }))
      expect(bad._tag).toBe("Permanent")
      expect(bad.message).toContain("TRANSCRIBE_POLL_DEADLINE_MS")
    }))
})
