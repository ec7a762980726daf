import { describe, expect, it } from "vitest"
import * as ErrorText from "../../packages/pgfiber/src/runtime/ErrorText.js"

describe("ErrorText.scrubPaths", () => {
  it("shortens absolute paths and file URIs to their last segment", () => {
    expect(ErrorText.scrubPaths("ffprobe cannot read /srv/pgfiber/storage/orgs/acme/calls/7.wav: Invalid data found"))
      .toBe("ffprobe cannot read …/7.wav: Invalid data found")
    expect(ErrorText.scrubPaths("no object orgs/acme/a.wav in /var/lib/pgfiber/storage"))
      .toBe("no object orgs/acme/a.wav in …/storage")
    expect(ErrorText.scrubPaths("source file not found: file:///tmp/upload-1/b.ogg")).toBe("source file not found: …/b.ogg")
    expect(ErrorText.scrubPaths("cannot run ffmpeg at /work/app/node_modules/@ffmpeg-installer/linux-x64/ffmpeg (set FFMPEG_PATH)"))
      .toBe("cannot run ffmpeg at …/ffmpeg (set FFMPEG_PATH)")
  })

  it("shortens the file names in a defect's stack frames", () => {
    const stack = "defect: Error: null pointer\n    at handler (/home/svc/app/dist/stages/calls/Analyze.js:41:13)\n    at node:internal/process/task_queues:95:5"
    expect(ErrorText.scrubPaths(stack))
      .toBe("defect: Error: null pointer\n    at handler (…/Analyze.js:41:13)\n    at node:internal/process/task_queues:95:5")
  })

  it("leaves storage keys, URLs, rates and plain text alone", () => {
    for (
      const text of [
        "no object orgs/acme/calls/1.wav",
        "POST https://stt.api.cloud.yandex.net/speech/stt/v2/longRunningRecognize: 429",
        "s3://bucket/orgs/acme/x.wav does not point into this storage",
        "rate limited: 500/hour, 5/s",
        "the value / the other"
      ]
    ) expect(ErrorText.scrubPaths(text)).toBe(text)
  })
})
