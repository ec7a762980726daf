/**
 * The flat statements the claim, the settle and the enqueue are sent as (FlatSql.ts): the same fragment builders,
 * rendered to one text with numbered parameters. The text and the parameters are checked as values; on a real
 * Postgres, the same statement gives the same rows flat as porsager's nested fragments give, it is sent once
 * however often it is awaited, and a porsager fragment mixed in by mistake is a defect, not a value.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { flat, FlatSqlDefect, render } from "../../packages/pgfiber/src/layers/FlatSql.js"
import type { Sql } from "../../packages/pgfiber/src/layers/Db.js"
import { rawSql } from "../support/pg.js"

// what the statement builders do: nested fragments (one used twice), a list of fragments, identifiers, values
const build = (sql: Sql, ids: ReadonlyArray<string>, label: string) => {
  const column = (name: string) => sql`t.${sql(name)}`
  const extra = [sql`, ${label}::text as label`, sql`, ${ids.length}::int as n`]
  return sql<Array<{ id: string; doubled: number; label: string; n: number }>>`
    select ${column("id")}::text as id, (t.id * ${2}::int) as doubled ${extra}
    from unnest(${ids}::bigint[]) as t(id)
    where ${column("id")} > ${0}::bigint
    order by t.id`
}

describe("flat statements", () => {
  it("render: one text with $1…$n in order, the parameters beside it, identifiers quoted", () => {
    const { text, parameters } = render(build(flat({} as Sql), ["1", "2"], "x") as never)
    expect(text.replace(/\s+/g, " ").trim()).toBe(
      "select t.\"id\"::text as id, (t.id * $1::int) as doubled , $2::text as label , $3::int as n " +
        "from unnest($4::bigint[]) as t(id) where t.\"id\" > $5::bigint order by t.id"
    )
    expect(parameters).toEqual([2, "x", 2, ["1", "2"], 0])
  })

  it("a schema-qualified identifier is quoted per part, as porsager quotes it", () => {
    const sql = flat({} as Sql)
    expect(render(sql`select * from ${sql("a.b\"c")}` as never).text).toBe("select * from \"a\".\"b\"\"c\"")
  })

  it.live("on Postgres: the same rows as the nested fragments give, the statement sent once however often awaited", () =>
    Effect.acquireUseRelease(
      Effect.sync(() => rawSql()),
      (sql) =>
        Effect.promise(async () => {
          const nested = await build(sql, ["3", "1", "2"], "same")
          let sent = 0
          const counting = new Proxy(sql, {
            get: (target, key) =>
              key === "unsafe" ? (...args: Parameters<Sql["unsafe"]>) => (sent++, target.unsafe(...args)) : Reflect.get(target, key)
          })
          const statement = build(flat(counting), ["3", "1", "2"], "same")
          const first = await statement
          const second = await statement
          expect([...first]).toEqual([...nested])
          expect(second).toBe(first)
          expect(sent).toBe(1)
          expect(first.map((r) => r.id)).toEqual(["1", "2", "3"])
        }),
      (sql) => Effect.promise(() => sql.end())
    ))

  it("a porsager fragment inside a flat statement is a defect, never sent as a value", () => {
    const real = rawSql()
    const sql = flat(real)
    expect(() => render(sql`select ${real`1`}` as never)).toThrow(FlatSqlDefect)
    expect(() => render(sql`select ${undefined as never}` as never)).toThrow(FlatSqlDefect)
    return real.end()
  })
})
