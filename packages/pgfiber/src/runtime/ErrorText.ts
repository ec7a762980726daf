/**
 * The text of an error as it is stored with a job (`last_error`, the dead letter's reason, the attempts'
 * history): tenants read it through the API, the dashboard and their pipelines' own records (a call's error),
 * so it must not reveal where the server keeps things. Absolute file-system paths — in a tool's message
 * ("ffprobe cannot read /srv/data/…"), a `file://` URI, a stack frame of a defect — become `…/` plus their
 * last segment; the full text stays in the worker's log, which only operators read.
 */

/** `file:///a/b/c` or `/a/b/c` (two segments or more), not part of a relative key (`orgs/acme/x`) or a URL's path. */
const absolutePath = /(?:file:\/\/|(?<![\w.~:/-]))\/(?:[^\s/:()'"`<>[\]{},;]+\/)+([^\s/:()'"`<>[\]{},;]*)/g

/** `text` with every absolute path shortened to its last segment. */
export const scrubPaths = (text: string): string => text.replace(absolutePath, (_, last: string) => `…/${last}`)
