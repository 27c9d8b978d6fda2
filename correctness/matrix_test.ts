import assert from "node:assert/strict";
import { expectedStateBytes, FAMILIES, type Family, familySpec } from "../models/mod.ts";
import { testModel } from "../testing/models.ts";
import { type CaseResult, type MatrixOptions, runCase, shuffle, VARIANTS } from "./matrix.ts";

const OPTIONS: MatrixOptions = {
  steps: 16,
  variants: VARIANTS,
  modelFor: (family, preset) => testModel(family, preset),
};
/** The long cases skip `prefix-assisted` (two more prefills each); the 1K cases run it. */
const LONG_OPTIONS: MatrixOptions = {
  ...OPTIONS,
  variants: VARIANTS.filter((v) => v !== "prefix-assisted"),
};

/** The case passed for the right reasons: exact continuations, refusals naming the range. */
function assertCase(r: CaseResult) {
  const by = Object.fromEntries(r.variants.map((v) => [v.variant, v]));
  const spec = familySpec(r.family);
  const expected = expectedStateBytes(spec);
  assert.equal(r.bytes.kvRows, expected.kvBytesPerToken * r.promptTokens);
  assert.equal(r.bytes.mtpHidden, r.family === "hybrid-moe-mtp" ? spec.nEmbd * 4 : 0);
  const inOrder = by["in-order"];
  assert.equal(inOrder.verdict, "exact", JSON.stringify(inOrder.parity));
  assert.equal(inOrder.parity?.maxAbsDiff, 0);
  assert.equal(inOrder.generated, OPTIONS.steps);
  // After a prefix-cache hit on an earlier prompt sharing 75%: still the cold run, bitwise.
  const prefix = by["prefix-assisted"];
  if (r.promptTokens <= 1024) {
    assert.equal(prefix.verdict, "exact", prefix.detail ?? JSON.stringify(prefix.parity));
    assert.match(prefix.detail ?? "", /restored [1-9]\d* of \d+ tokens/);
    assert.equal(prefix.generated, OPTIONS.steps);
  }
  if (r.family === "recurrent") {
    // No KV pages at all: the page variants do not apply, and say so.
    for (const v of ["shuffled", "missing-page", "flipped-byte"]) {
      assert.equal(by[v].verdict, "n/a");
      assert.match(by[v].detail ?? "", /no KV pages/);
    }
    assert.equal(r.bytes.ssm - 12 * expected.layers.recurrent, expected.ssmBytes);
    return assert.ok(r.ok);
  }
  assert.equal(by.shuffled.verdict, r.pages > 1 ? "exact" : "n/a");
  const range = /kv-page tokens \[\d+, \d+\)/;
  assert.equal(by["missing-page"].verdict, "refused");
  assert.match(by["missing-page"].detail ?? "", new RegExp(`${range.source} missing`));
  assert.equal(by["flipped-byte"].verdict, "refused");
  assert.match(by["flipped-byte"].detail ?? "", new RegExp(`${range.source}.*checksum`));
  for (const v of [by["missing-page"], by["flipped-byte"]]) assert.equal(v.generated, 0);
  assert.ok(r.ok);
}

async function check(family: Family, promptTokens: number, pageTokens: number) {
  const options = promptTokens <= 1024 ? OPTIONS : LONG_OPTIONS;
  const r = await runCase({ family, preset: "tiny", promptTokens, pageTokens }, options);
  const chunks = Math.ceil(promptTokens / pageTokens);
  assert.equal(r.pages, family === "recurrent" ? 0 : chunks);
  assertCase(r);
  return r;
}

Deno.test("every family hands off 1K tokens exactly with 256- and 2048-token pages, in order, shuffled and after a prefix-cache hit, and refuses a missing or flipped page", async (t) => {
  for (const family of FAMILIES) {
    for (const page of [256, 2048]) {
      await t.step(`${family}, pages of ${page}`, async () => {
        await check(family, 1024, page);
      });
    }
  }
});

Deno.test("hybrid hands off 8K tokens exactly with 2048-token pages", async () => {
  await check("hybrid", 8192, 2048);
});

Deno.test("hybrid-moe-mtp hands off 8K tokens and 32 draft pages exactly with 256-token pages", async () => {
  const r = await check("hybrid-moe-mtp", 8192, 256);
  assert.equal(r.bytes.mtpKv > 0, true);
});

// 8K, not 32K: the ring (window 128 + one 512-token micro-batch) wraps a dozen times already,
// in a few seconds. The 32K case (~20 s on 2 cores) runs in `correctness state-handoff`.
Deno.test("iswa hands off 8K tokens exactly with 256-token pages while the window ring wraps", async () => {
  const r = await check("iswa", 8192, 256);
  // The window cache travels once, bounded by the ring (window + micro-batch), not the prompt.
  const perToken = expectedStateBytes(familySpec("iswa")).swaKvBytesPerToken;
  assert.ok(r.bytes.swa < 1024 * perToken + 64 * 1024, `swa ${r.bytes.swa} B`);
});

const LONG = Deno.env.get("SKIPPY_CORRECTNESS_LONG") === "1";
Deno.test({
  name: "hybrid hands off 64K tokens exactly with 2048-token pages" +
    (LONG ? "" : " (skipped: ~75 s on 2 cores; set SKIPPY_CORRECTNESS_LONG=1)"),
  ignore: !LONG,
  fn: async () => {
    await check("hybrid", 64000, 2048);
  },
});

Deno.test("shuffle() is a seeded permutation that never keeps the exported order", () => {
  for (const n of [2, 3, 4, 16, 125]) {
    const xs = [...Array(n).keys()];
    const s = shuffle(xs);
    assert.deepEqual([...s].sort((a, b) => a - b), xs);
    assert.notDeepEqual(s, xs);
    assert.deepEqual(shuffle(xs), s);
  }
});
