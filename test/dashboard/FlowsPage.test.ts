/**
 * The job page's flows parts, rendered from data (no server): what a waiting job waits on, its parents and
 * children with their status and policy, its batch; a job with no edges shows no flows section.
 */
import { describe, expect, it } from "@effect/vitest"
import * as Pages from "../../packages/service/src/dashboard/Pages.js"

const page: Pages.JobPage = {
  id: "7", stage: "zip", orgId: "acme", subjectId: null, payload: {}, status: "waiting", priority: 50, attempts: 0,
  maxAttempts: 5, polls: 0, availableAt: new Date("2026-01-01T00:00:00Z"), lockedBy: null, lockedUntil: null, dedupeKey: null,
  lastError: null, errors: [], createdAt: new Date("2026-01-01T00:00:00Z"), updatedAt: new Date("2026-01-01T00:00:00Z"),
  startedAt: null, finishedAt: null, lastRunMs: null, output: null, progress: null, progressMessage: null, deadLetter: null,
  waitingOn: 1, batchId: "3"
}

describe("dashboard job page: flows", () => {
  it("shows what a waiting job waits on, its parents and children, and its batch", () => {
    const text = Pages.job("/ui", "csrf", page, [], {
      parents: [
        { id: "5", stage: "resize", status: "completed", onFailure: "cancel", output: { ok: true } },
        { id: "6", stage: "resize", status: "running", onFailure: "continue", output: null }
      ],
      children: [{ id: "9", stage: "mail", status: "waiting", onFailure: "deadLetter", output: null }]
    }).text
    expect(text).toContain(`<span data-job-field="waitingOn">1 parent</span>`)
    expect(text).toContain(`<span data-job-field="batchId">3</span>`)
    expect(text).toMatch(/<table id="parents">.*href="\/ui\/jobs\/5".*completed.*cancel.*href="\/ui\/jobs\/6".*running.*continue/s)
    expect(text).toMatch(/<table id="children">.*href="\/ui\/jobs\/9".*waiting.*deadLetter/s)
    // a waiting job can be cancelled from its page
    expect(text).toContain(`data-action="cancel"`)
  })

  it("a job with no parents or children has no flows section", () => {
    const text = Pages.job("/ui", "csrf", { ...page, status: "queued", waitingOn: null, batchId: null }, [], { parents: [], children: [] }).text
    expect(text).not.toContain(`id="parents"`)
    expect(text).not.toContain(`id="children"`)
  })
})
