/** Objects as files under a root directory, written atomically (temp file, fsync, rename). */
import * as FileSystem from "@effect/platform/FileSystem"
import * as NodeFileSystem from "@effect/platform-node/NodeFileSystem"
import { Effect, Layer, Stream } from "effect"
import * as NodePath from "node:path"
import * as NodeUrl from "node:url"
import {
  type Body,
  bodyToStream,
  fsErrorToJobError,
  notThisStorage,
  ObjectNotFound,
  parseLocation,
  Storage,
  validateKey,
  type WriteError,
  writeFileAtomically
} from "./Service.js"

export const defaultRootDir = ".data/storage"

export const makeFs = (rootDir: string = defaultRootDir) =>
  Effect.gen(function*() {
    const fs = yield* FileSystem.FileSystem
    const root = NodePath.resolve(rootDir)
    yield* fs.makeDirectory(root, { recursive: true }).pipe(Effect.mapError(fsErrorToJobError(`creating ${root}`)))
    const pathOf = (key: string) => NodePath.join(root, ...key.split("/"))

    // A directory at the key's path (a prefix of other keys) is not an object.
    const isObject = (key: string) =>
      fs.stat(pathOf(key)).pipe(
        Effect.map((info) => info.type === "File"),
        Effect.catchIf(
          (error) => error._tag === "SystemError" && error.reason === "NotFound",
          () => Effect.succeed(false)
        ),
        Effect.mapError(fsErrorToJobError(`stat ${key}`))
      )

    const requireObject = (key: string) =>
      Effect.filterOrFail(
        isObject(key),
        (found) => found,
        () => new ObjectNotFound({ key, message: `no object ${key} in ${root}` })
      )

    const put = Effect.fn("Storage.put")(function*<E>(key: string, body: Body<E>) {
      yield* Effect.annotateCurrentSpan({ key, driver: "fs" })
      yield* validateKey(key)
      yield* writeFileAtomically(fs, pathOf(key), bodyToStream(fs, body))
    })

    const get = Effect.fn("Storage.get")(function*(key: string) {
      yield* Effect.annotateCurrentSpan({ key, driver: "fs" })
      yield* validateKey(key)
      yield* requireObject(key)
      return yield* fs.readFile(pathOf(key)).pipe(Effect.mapError(fsErrorToJobError(`reading ${key}`)))
    })

    const download = Effect.fn("Storage.download")(function*(key: string, localPath: string) {
      yield* Effect.annotateCurrentSpan({ key, localPath, driver: "fs" })
      yield* validateKey(key)
      yield* requireObject(key)
      const source = fs.stream(pathOf(key)).pipe(Stream.mapError(fsErrorToJobError(`reading ${key}`)))
      yield* writeFileAtomically(fs, NodePath.resolve(localPath), source)
    })

    const exists = Effect.fn("Storage.exists")(function*(key: string) {
      yield* Effect.annotateCurrentSpan({ key, driver: "fs" })
      yield* validateKey(key)
      return yield* isObject(key)
    })

    // Empty parent directories are left behind on purpose: pruning them races a concurrent put.
    const remove = Effect.fn("Storage.remove")(function*(key: string) {
      yield* Effect.annotateCurrentSpan({ key, driver: "fs" })
      yield* validateKey(key)
      if (yield* isObject(key)) {
        yield* fs.remove(pathOf(key), { force: true }).pipe(Effect.mapError(fsErrorToJobError(`removing ${key}`)))
      }
    })

    const uri = (key: string) => Effect.map(validateKey(key), (key) => NodeUrl.pathToFileURL(pathOf(key)).href)

    const parseUri = (uri: string) =>
      Effect.flatMap(parseLocation(uri), (location) => {
        if (location._tag !== "File") return Effect.fail(notThisStorage(uri, "expected a file:// URI"))
        const relative = NodePath.relative(root, location.path)
        if (relative === "" || relative.startsWith("..") || NodePath.isAbsolute(relative)) {
          return Effect.fail(notThisStorage(uri, `outside ${root}`))
        }
        return validateKey(relative.split(NodePath.sep).join("/"))
      })

    return Storage.of({ put, get, download, exists, remove, uri, parseUri })
  })

/** Objects as files under `rootDir` (default `.data/storage`), written atomically. */
export const layerFs = (rootDir: string = defaultRootDir): Layer.Layer<Storage, WriteError> =>
  Layer.effect(Storage, makeFs(rootDir)).pipe(Layer.provide(NodeFileSystem.layer))

// ---------------------------------------------------------------------------------------------
// Memory
