/**
 * In-process object storage for unit tests: the same key rules and URIs (`memory:///key`) as the real stores;
 * `download` and `fromFile` still touch the real filesystem.
 */
import * as FileSystem from "@effect/platform/FileSystem"
import * as NodeFileSystem from "@effect/platform-node/NodeFileSystem"
import { Effect, Layer, Stream } from "effect"
import * as NodePath from "node:path"
import {
  type Body,
  bodyToStream,
  concatBytes,
  encodeKey,
  notThisStorage,
  ObjectNotFound,
  parseLocation,
  Storage,
  validateKey,
  writeFileAtomically
} from "../layers/storage/Service.js"


export const makeMemory = Effect.gen(function*() {
  const fs = yield* FileSystem.FileSystem
  const objects = new Map<string, Uint8Array>()

  const requireObject = (key: string) =>
    Effect.flatMap(validateKey(key), (key) => {
      const bytes = objects.get(key)
      return bytes === undefined
        ? Effect.fail(new ObjectNotFound({ key, message: `no object ${key} in memory storage` }))
        : Effect.succeed(bytes)
    })

  const put = Effect.fn("Storage.put")(function*<E>(key: string, body: Body<E>) {
    yield* validateKey(key)
    const chunks = yield* Stream.runCollect(bodyToStream(fs, body))
    // Copied so a caller mutating its buffer afterwards cannot change the stored object.
    objects.set(key, Uint8Array.from(concatBytes(Array.from(chunks))))
  })

  const get = Effect.fn("Storage.get")(function*(key: string) {
    return Uint8Array.from(yield* requireObject(key))
  })

  const download = Effect.fn("Storage.download")(function*(key: string, localPath: string) {
    const bytes = yield* requireObject(key)
    yield* writeFileAtomically(fs, NodePath.resolve(localPath), Stream.make(bytes))
  })

  const exists = (key: string) => Effect.map(validateKey(key), (key) => objects.has(key))

  const remove = (key: string) =>
    Effect.map(validateKey(key), (key) => {
      objects.delete(key)
    })

  const uri = (key: string) => Effect.map(validateKey(key), (key) => `memory:///${encodeKey(key)}`)

  const parseUri = (uri: string) =>
    Effect.flatMap(parseLocation(uri), (location) =>
      location._tag === "Memory" ? validateKey(location.key) : Effect.fail(notThisStorage(uri, "expected memory:///key")))

  return Storage.of({ put, get, download, exists, remove, uri, parseUri })
})

/** In-process objects for unit tests; `download` and `fromFile` still touch the real filesystem. */
export const layerMemory: Layer.Layer<Storage> = Layer.effect(Storage, makeMemory).pipe(
  Layer.provide(NodeFileSystem.layer)
)

// ---------------------------------------------------------------------------------------------
