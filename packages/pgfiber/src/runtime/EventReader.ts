/**
 * The process's one reader of the event log: every follower here that has caught up (each `Events.follow`, each
 * `GET /events` client, `pgfiber events --follow`) is fed from one cursor and one read loop, so N followers cost
 * one statement and one decode per read, not N. Each read takes whole rows (EventLog.readRows) under the union
 * of the followers' filters (one org, some stages, some kinds, when they all agree; else wider), and each
 * follower is handed the events of the rows its own filter takes, past its own cursor.
 *
 * Reads are coalesced: a read starts when a NOTIFY arrives (never a second while one is in flight; the NOTIFYs
 * heard meanwhile are one wake-up), at least `minReadSpacing` after the last read, or `busyReadSpacing` when the
 * last read brought events (a busy queue sends a NOTIFY per claim and settle: one read gathers a burst of them).
 * While the log says events are held back by an older transaction it polls (20 ms doubling to `heldPollMax`),
 * since that transaction may write no event and so NOTIFY nothing. With no follower attached it reads nothing.
 *
 * A follower is in one of two modes (`Follower.mode`), changed only here: "own" (it reads by itself, with its
 * filter, until caught up: a resume from an old id, a start from the beginning, a fall-back) and "fed" (the
 * reader pushes its events). The invariants: a fed follower's cursor is never behind the reader's (`attach`
 * checks it synchronously, so no read can end between the check and the attachment; the rows of a read cover
 * everything after the reader's cursor, and the follower drops what is at or before its own); a follower that
 * falls too far behind (`maxBuffered`) or a failed read sends it back to "own" with its cursor where its events
 * end, so nothing is missed or repeated, and its own read reports the error as before.
 */
import { Context, Duration, Effect, Queue as Q } from "effect"
import * as EventLog from "../queue/EventLog.js"

/** The slowest look while events are held back by an older transaction (it starts at 20 ms and doubles). */
export const heldPollMax = Duration.seconds(1)
/** The least time between two reads when the last found nothing: the first events of a burst come this soon. */
export const minReadSpacing = Duration.millis(25)
/** The least time between two reads when the last found events: under load one read gathers many statements' rows. */
export const busyReadSpacing = Duration.millis(100)
/** Events per read (whole rows: a read may bring up to a row more). */
export const pageSize = 5000
/** A fed follower with more events than this waiting to be taken goes back to reading by itself. */
export const maxBuffered = 20_000

export interface Follower {
  readonly filter: EventLog.Filter
  /** "own": reads by itself; "fed": the reader hands it events. */
  mode: "own" | "fed"
  /** Where its events end (taken or waiting in `buffer`). */
  cursor: EventLog.Cursor
  /** Events handed over and not taken yet. */
  buffer: Array<EventLog.LoggedEvent>
  /** The last read it made by itself saw events held back (the reader takes over the polling). */
  held: boolean
  /** `EventReader.heard()` when its last read by itself began: a NOTIFY heard since may be for rows it did not see. */
  heardAtRead: number
  /** Wakes its stream: events were handed over, or it went back to "own". */
  readonly signal: () => void
}

/** Whether `f` takes this row's events at all (job and subject are checked per event). */
const takesRow = (f: EventLog.Filter, row: EventLog.Row) =>
  (f.org === undefined || row.orgId === f.org) &&
  (f.stages === undefined || f.stages.length === 0 || f.stages.includes(row.stage)) &&
  (f.kinds === undefined || f.kinds.length === 0 || f.kinds.includes(row.kind))

/**
 * The row's events `f` takes after `cursor`, pushed onto `out`. `cursor` sits before, inside or after the row
 * (read order is (tx, id)); inside, the places up to its own are skipped.
 */
const handOut = (f: EventLog.Filter, cursor: { readonly tx: bigint; readonly row: bigint; readonly place: number }, row: EventLog.Row, out: Array<EventLog.LoggedEvent>) => {
  const tx = BigInt(row.tx), id = BigInt(row.id)
  if (tx < cursor.tx || (tx === cursor.tx && id < cursor.row)) return
  const skip = tx === cursor.tx && id === cursor.row ? cursor.place + 1 - row.first : 0
  const perEvent = f.jobId !== undefined || f.subjectId !== undefined
  for (let i = Math.max(0, skip); i < row.events.length; i++) {
    const e = row.events[i]!
    if (perEvent && ((f.jobId !== undefined && e.jobId !== f.jobId) || (f.subjectId !== undefined && e.subjectId !== f.subjectId))) continue
    out.push(e)
  }
}

/** One value when every follower names the same one; undefined (no filter) otherwise. */
const common = <A>(values: ReadonlyArray<A | undefined>): A | undefined =>
  values.length > 0 && values.every((v) => v !== undefined && v === values[0]) ? values[0] : undefined

/** The union of lists when every follower filters by one; undefined (no filter) when one does not. */
const union = <A>(lists: ReadonlyArray<ReadonlyArray<A> | undefined>): ReadonlyArray<A> | undefined =>
  lists.every((l) => l !== undefined && l.length > 0) ? [...new Set(lists.flat() as Array<A>)] : undefined

/** What one read asks the log for: every fed follower's rows, filtered in SQL as far as they all agree. */
export const readFilter = (followers: ReadonlyArray<Follower>): EventLog.Filter => ({
  org: common(followers.map((f) => f.filter.org)),
  stages: union(followers.map((f) => f.filter.stages)),
  kinds: union(followers.map((f) => f.filter.kinds)),
  jobId: common(followers.map((f) => f.filter.jobId)),
  subjectId: common(followers.map((f) => f.filter.subjectId))
})

/** Whether a read under `read` brought every row `f` takes (true for the followers it was made for). */
const covers = (read: EventLog.Filter, f: EventLog.Filter) => {
  const list = <A>(r: ReadonlyArray<A> | undefined, x: ReadonlyArray<A> | undefined) =>
    r === undefined || r.length === 0 || (x !== undefined && x.length > 0 && x.every((v) => r.includes(v)))
  return (read.org === undefined || read.org === f.org) && list(read.stages, f.stages) && list(read.kinds, f.kinds) &&
    (read.jobId === undefined || read.jobId === f.jobId) && (read.subjectId === undefined || read.subjectId === f.subjectId)
}

/**
 * Hands a read's rows to every fed follower its filter covered (one that came while the read was in flight with
 * a wider filter is sent back to read by itself), past each one's cursor; one too far behind is sent back too.
 */
const deliver = (
  fed: ReadonlySet<Follower>,
  page: EventLog.RowPage,
  filter: EventLog.Filter,
  backToOwn: (f: Follower) => void
) => {
  for (const f of [...fed]) {
    if (!covers(filter, f.filter)) {
      backToOwn(f)
      continue
    }
    const at = EventLog.placeOf(f.cursor.id)
    const position = { tx: BigInt(f.cursor.tx), row: BigInt(at.row), place: at.place }
    const events: Array<EventLog.LoggedEvent> = []
    for (const row of page.rows) if (takesRow(f.filter, row)) handOut(f.filter, position, row, events)
    if (f.buffer.length + events.length > maxBuffered) {
      // it does not keep up: it reads the rest by itself, from where its events end
      backToOwn(f)
      continue
    }
    for (const e of events) f.buffer.push(e)
    f.cursor = EventLog.later(f.cursor, page.next)
    if (events.length > 0) f.signal()
  }
}

export interface EventReader {
  /**
   * Feeds `follower` from here on when its cursor is not behind the reader's (true); false: it reads by itself
   * again first. Synchronous, so no read ends between the check and the attachment.
   */
  readonly attach: (follower: Follower) => boolean
  /**
   * Feeds `follower` from the point the reader's next events start, when followers are fed already (true): a
   * start "from now" that costs no statement. False: nobody is fed; it takes its cursor itself.
   */
  readonly attachAtReader: (follower: Follower) => boolean
  readonly detach: (follower: Follower) => void
  /** A NOTIFY of new events (or a listener's reconnect). */
  readonly wake: () => void
  /** NOTIFYs heard so far. */
  readonly heard: () => number
  /** Reads made so far (all followers together): what tests count. */
  readonly reads: () => number
  /** Followers fed now. */
  readonly fed: () => number
}

/** The read loop, forked in the caller's scope; it runs for the scope's life. */
export const make = (log: Context.Tag.Service<EventLog.EventLog>) =>
  Effect.gen(function*() {
    const fed = new Set<Follower>()
    const woken = yield* Q.sliding<void>(1)
    let cursor: EventLog.Cursor = EventLog.beginning
    /** The cursor of the read in flight, if one is. */
    let readingFrom: EventLog.Cursor | null = null
    let caughtUp = true
    let held = false
    let heldWaitMs = 20
    let lastReadAt = 0
    let lastFoundEvents = false
    let reads = 0
    let heard = 0

    const backToOwn = (f: Follower) => {
      fed.delete(f)
      f.mode = "own"
      f.signal()
    }

    const attach = (f: Follower) => {
      // the reads to come cover everything after this point: the one in flight's cursor, or the reader's
      const from = readingFrom ?? (fed.size === 0 ? null : cursor)
      if (from !== null && EventLog.later(f.cursor, from) !== f.cursor) return false
      if (from === null) {
        // nobody fed and no read in flight: the reader starts where this follower is
        cursor = f.cursor
        caughtUp = true
        held = f.held
      } else {
        held = held || f.held
      }
      fed.add(f)
      f.mode = "fed"
      // held rows need a poll; a NOTIFY heard since its last read may have been answered before it was fed
      if (held || f.heardAtRead !== heard) Q.unsafeOffer(woken, undefined)
      return true
    }

    const attachAtReader = (f: Follower) => {
      const from = readingFrom ?? (fed.size === 0 ? null : cursor)
      if (from === null) return false
      f.cursor = from
      f.heardAtRead = heard
      return attach(f)
    }

    const waitForNews = Effect.gen(function*() {
      if (caughtUp) {
        if (!held || fed.size === 0) {
          heldWaitMs = 20
          yield* Q.take(woken)
        } else {
          yield* Effect.raceFirst(Q.take(woken), Effect.sleep(Duration.millis(heldWaitMs)))
          heldWaitMs = Math.min(heldWaitMs * 2, Duration.toMillis(heldPollMax))
        }
      }
      const spacing = Duration.toMillis(lastFoundEvents ? busyReadSpacing : minReadSpacing)
      const since = Date.now() - lastReadAt
      if (since < spacing) yield* Effect.sleep(Duration.millis(spacing - since))
      // every NOTIFY heard until now is answered by the read that follows
      yield* Q.takeAll(woken)
    })

    const readOnce = Effect.gen(function*() {
      yield* waitForNews
      if (fed.size === 0) {
        caughtUp = true
        return
      }
      lastReadAt = Date.now()
      reads++
      const filter = readFilter([...fed])
      readingFrom = cursor
      const reading = Effect.either(log.readRows(cursor, filter, pageSize))
      const page = yield* Effect.onInterrupt(reading, () => Effect.sync(() => void (readingFrom = null)))
      readingFrom = null // nothing yields from here to the hand-out: an attach never sees the read over, the cursor unmoved
      if (page._tag === "Left") {
        // each follower reads by itself again, and reports the error as it did before
        yield* Effect.logWarning("the shared event reader could not read the log; its followers read by themselves", page.left.message)
        for (const f of [...fed]) backToOwn(f)
        caughtUp = true
        return
      }
      cursor = page.right.next
      caughtUp = !page.right.full
      held = page.right.held
      lastFoundEvents = page.right.rows.length > 0
      deliver(fed, page.right, filter, backToOwn)
    })

    yield* readOnce.pipe(
      Effect.catchAllCause((cause) => Effect.logError("the shared event reader failed; it goes on", cause)),
      Effect.forever,
      Effect.annotateLogs({ loop: "eventReader" }),
      Effect.forkScoped
    )

    const reader: EventReader = {
      attach,
      attachAtReader,
      detach: (f) => void fed.delete(f),
      wake: () => {
        heard++
        Q.unsafeOffer(woken, undefined)
      },
      heard: () => heard,
      reads: () => reads,
      fed: () => fed.size
    }
    return reader
  })
