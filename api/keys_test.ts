import assert from "node:assert/strict";
import { ApiError } from "./errors.ts";
import { ApiKeys } from "./keys.ts";

const A = "a".repeat(20);
const B = "b".repeat(20);

Deno.test("ApiKeys maps a bearer key to its tenant and refuses others with 401", () => {
  const keys = ApiKeys.parse(JSON.stringify({ [A]: "team-a", [B]: "team-b" }));
  assert.equal(keys.tenantOf(`Bearer ${A}`), "team-a");
  assert.equal(keys.tenantOf(`bearer ${B}`), "team-b");
  for (const header of [undefined, "", A, `Bearer ${A}x`, `Basic ${A}`]) {
    assert.throws(
      () => keys.tenantOf(header),
      (e: unknown) => e instanceof ApiError && e.status === 401,
    );
  }
});

Deno.test("ApiKeys.parse refuses short keys and bad tenants without echoing the key", () => {
  assert.throws(() => ApiKeys.parse(JSON.stringify({ short: "t" })), (e: unknown) => {
    assert.match((e as Error).message, /key number 1 must have 16 to 512 characters/);
    assert.doesNotMatch((e as Error).message, /short/);
    return true;
  });
  assert.throws(
    () => ApiKeys.parse(JSON.stringify({ [A]: "no spaces" })),
    /tenant of key number 1/,
  );
  assert.throws(() => ApiKeys.parse("[]"), /expected an object/);
});
