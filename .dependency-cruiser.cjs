/**
 * The folder table of DESIGN.md ("Packages and folders") as rules: imports point down the table only.
 * `npm run lint:deps` checks each package's `src/` (packages/NAME/src); CI runs it right after the typecheck.
 *
 *   App, main, index (the tops)       may import everything
 *   http, dashboard, cli, client      the faces (client: the queue as promises), everything below, never another face
 *   stages                            runtime, queue, layers
 *   auth                              layers
 *   runtime                           queue, layers (never the Db: whose data and its writes are the queue's)
 *   queue                             layers
 *   layers                            nothing above it
 *
 * `src/JobError.ts` (the typed errors a handler fails with) sits beside `layers`: the outside-world clients
 * fail with them, and it imports nothing of ours. Type-only imports count: a type import is still a
 * dependency a reader has to follow.
 */
const faces = ["http", "dashboard", "cli", "client"]
/** Any package's src/: the folder table holds inside each package, and across them. */
const src = "^packages/[^/]+/src/"
const folder = (names) => `${src}(${names.join("|")})/`
const tops = `${src}(App|main|index)\\.ts$`
/**
 * The one face-to-face import left: `Server.layer` mounts the dashboard on the API listener and, by default,
 * makes one from DASHBOARD_* (its `dashboard` option). Moving that mount up to App changes what
 * `pgfiber/http`'s `Server.layer` serves by default, a change of the public API left to its own commit (#26).
 */
const serverMount = { from: `${src}http/Server\\.ts$`, to: `${src}dashboard/Dashboard\\.ts$` }

/**
 * The packages (#31), by folder: `packages/pgfiber` (the core: queue, runtime, the shared layers, JobError, the
 * in-memory testing twin), `packages/media` (the media pipelines and their outside-world clients) and
 * `packages/service` (App, main, the faces, the echo and webhook stages, tracing). The core imports neither of the
 * others; the media pipelines never import the service; a package imports another by its name (`pgfiber/internal/…`),
 * never by a relative path, which would not exist once each is installed on its own.
 */
const media = ["^packages/media/"]
const service = ["^packages/service/"]
const core = "^packages/pgfiber/"

/** @type {import('dependency-cruiser').IConfiguration} */
module.exports = {
  forbidden: [
    {
      name: "no-circular",
      severity: "error",
      comment: "A circle of imports has no bottom: which module is the base of the other is left to load order.",
      from: { path: src },
      to: { circular: true }
    },
    {
      name: "src-not-from-tests",
      severity: "error",
      comment: "Nothing in a package's src/ imports from test/ or bench/: they are not shipped.",
      from: { path: src },
      to: { path: "^(test|bench)/" }
    },
    {
      name: "core-package-alone",
      severity: "error",
      comment: "The core package (pgfiber) imports neither the media pipelines nor the service: a queue installs as a queue.",
      from: { path: core },
      to: { path: [...media, ...service] }
    },
    {
      name: "media-package-not-the-service",
      severity: "error",
      comment: "The media pipelines depend on the core only: the service composes them, not the other way.",
      from: { path: media },
      to: { path: service }
    },
    {
      name: "packages-by-name",
      severity: "error",
      comment: "A package reaches another by its name (pgfiber/internal/…): a relative path across packages/ breaks once installed.",
      from: { path: "^packages/([^/]+)/" },
      to: { path: "^packages/[^/]+/src/", pathNot: "^packages/$1/" }
    },
    {
      name: "queue-only-down",
      severity: "error",
      comment: "The queue knows about layers only: never the runtime, a stage, auth, a face or a top.",
      from: { path: `${src}queue/` },
      to: { path: [folder(["runtime", "stages", "auth", "testing", ...faces]), tops] }
    },
    {
      name: "layers-nothing-above",
      severity: "error",
      comment: "layers/ is the outside world every part shares: it imports nothing above it.",
      from: { path: `${src}layers/` },
      to: { path: [folder(["queue", "runtime", "stages", "auth", "testing", ...faces]), tops] }
    },
    {
      name: "job-error-is-a-leaf",
      severity: "error",
      comment: "JobError.ts sits beside layers/ (its clients fail with it): it imports nothing of ours.",
      from: { path: `${src}JobError\\.ts$` },
      to: { path: src }
    },
    {
      name: "runtime-not-above",
      severity: "error",
      comment: "The runtime knows about the queue and layers: never a stage, auth, a face or a top.",
      from: { path: `${src}runtime/` },
      to: { path: [folder(["stages", "auth", "testing", ...faces]), tops] }
    },
    {
      name: "runtime-no-db",
      severity: "error",
      comment: "The runtime asks the queue (Tenancy for whose data, the queue's stores for its writes), never the Db.",
      from: { path: `${src}runtime/` },
      to: { path: `${src}layers/(Db\\.ts$|db/)` }
    },
    {
      name: "stages-not-above",
      severity: "error",
      comment: "A pipeline knows the runtime, the queue and layers: never auth, a face or a top.",
      from: { path: `${src}stages/` },
      to: { path: [folder(["auth", ...faces]), tops] }
    },
    {
      name: "auth-only-layers",
      severity: "error",
      comment: "auth/ (keys, scopes, tenancy) knows about layers only: the faces use it, not the other way.",
      from: { path: `${src}auth/` },
      to: { path: [folder(["queue", "runtime", "stages", "testing", ...faces]), tops] }
    },
    ...faces.map((face) => ({
      name: `face-${face}-not-another-face`,
      severity: "error",
      comment: "A face never imports another face; a top (App, main, a package's index) composes them.",
      from: { path: `${src}${face}/`, pathNot: [`${src}${face}/index\\.ts$`, ...(face === "http" ? [serverMount.from] : [])] },
      to: { path: folder(faces.filter((f) => f !== face)) }
    })),
    {
      name: "faces-no-sql",
      severity: "error",
      comment:
        "A face runs no SQL: the statements modules (src/queue/*Sql.ts) are the queue's own; a face reads through " +
        "Reads and changes through Queue. (Db.ts stays importable for composition and org scoping: withOrg, forOrg.)",
      from: { path: folder(faces) },
      // a face reaches the core by name, which resolves to its build (options below): both count
      to: { path: "^packages/[^/]+/(src|dist)/(queue|runtime|stages|auth)/[^/]*Sql\\.(ts|js)$" }
    },
    {
      name: "face-http-server-only-the-dashboard-mount",
      severity: "error",
      comment: "The one exception to a face never importing another face, named so that no other grows beside it.",
      from: { path: serverMount.from },
      to: { path: folder(faces.filter((f) => f !== "http")), pathNot: serverMount.to }
    }
  ],
  options: {
    doNotFollow: { path: ["node_modules", "^packages/[^/]+/dist/"] },
    // a package reached by name resolves to its build (node_modules/pgfiber → packages/pgfiber/dist/): counted, not followed
    includeOnly: "^(packages/[^/]+/(src|dist)|test|bench)/",
    tsPreCompilationDeps: true,
    tsConfig: { fileName: "tsconfig.json" },
    enhancedResolveOptions: {
      exportsFields: ["exports"],
      conditionNames: ["import", "require", "node", "default", "types"],
      extensions: [".ts", ".js"]
    },
    reporterOptions: { text: { highlightFocused: true } }
  }
}
