import assert from "node:assert/strict";
import type { CaseResult, VariantResult } from "./matrix.ts";
import { formatNotes, formatSummary, formatTable, maxAbsDiff } from "./report.ts";

function variant(over: Partial<VariantResult>): VariantResult {
  return {
    variant: "in-order",
    verdict: "exact",
    parity: { exact: true, tokensEqual: true, maxAbsDiff: 0, firstDiffStep: null, steps: 4 },
    detail: null,
    generated: 4,
    importPagesUs: 1500,
    importFinalUs: 200,
    ...over,
  };
}

function result(variants: VariantResult[]): CaseResult {
  return {
    family: "hybrid",
    preset: "tiny",
    promptTokens: 1024,
    pageTokens: 256,
    pages: 4,
    bytes: {
      kvRows: 524288,
      kvMeta: 12800,
      conv: 13900,
      ssm: 65584,
      recurrentWhole: 0,
      swa: 0,
      mtpKv: 0,
      mtpHidden: 0,
      firstToken: 4,
      total: 616576,
    },
    prefillMs: 90,
    exportPagesUs: 1100,
    exportFinalUs: 570,
    variants,
    ok: variants.every((v) => ["exact", "refused", "n/a"].includes(v.verdict)),
  };
}

Deno.test("formatTable() aligns one row per case and marks a case that differs as FAIL", () => {
  const good = result([variant({})]);
  const bad = result([
    variant({
      verdict: "differs",
      parity: { exact: false, tokensEqual: true, maxAbsDiff: 4e-3, firstDiffStep: 2, steps: 4 },
    }),
  ]);
  const lines = formatTable([good, bad], ["in-order"]);
  assert.equal(lines.length, 3);
  // The last column (verdict) starts at the same offset on every line.
  assert.equal(new Set(lines.map((l) => l.lastIndexOf(" "))).size, 1);
  assert.match(
    lines[1],
    /hybrid\s+1,024\s+256\s+4\s+537,088\s+13,900\s+65,584\s+-\s+-.*\s0\s+exact\s+pass$/,
  );
  assert.match(lines[2], /4\.00e-3\s+DIFFERS\s+FAIL$/);
  assert.equal(maxAbsDiff(bad), 4e-3);
});

Deno.test("formatSummary() names each failing case and variant; formatNotes() says why", () => {
  const refusedWrongly = variant({
    variant: "flipped-byte",
    verdict: "wrong-refusal",
    parity: null,
    detail: "Cannot stage kv-page tokens [512, 768): K type differs",
    generated: 0,
  });
  const results = [result([variant({})]), result([variant({}), refusedWrongly])];
  assert.match(
    formatSummary(results, 2500),
    /^1\/2 cases pass in 2\.5 s; FAILED: hybrid\/1024\/256 \(flipped-byte: WRONG-ERROR\)$/,
  );
  assert.deepEqual(formatNotes(results), [
    "hybrid/1024/256 flipped-byte: Cannot stage kv-page tokens [512, 768): K type differs",
  ]);
  assert.match(formatSummary([results[0]], 1000), /1\/1 cases pass .*every fault refused$/);
});
