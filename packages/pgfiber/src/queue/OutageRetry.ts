/**
 * How the runtime retries queue work that failed because the database is away (a `QueueError` marked
 * `unavailable`: a claim, a settle): exponential from `first`, at most a second apart, so it is back at full speed
 * within a second of the database's return. The schedule is the Db's own (LISTEN reconnects by it too), named here
 * so that the runtime asks the queue, not the Db. Callers that must give up add their own limit (`Schedule.upTo`).
 */
import * as Db from "../layers/Db.js"

export const outageRetry: typeof Db.outageRetry = Db.outageRetry
