import assert from "node:assert/strict";
import { runCliProcess } from "../testing/cli.ts";

const MODELS = new URL("../.cache/test-models", import.meta.url).pathname;
const SMALL = [
  "correctness",
  "state-handoff",
  "--model-dir",
  MODELS,
  "--families",
  "dense,hybrid",
  "--prompt-tokens",
  "600",
  "--page-tokens",
  "256",
  "--steps",
  "4",
];

Deno.test("correctness state-handoff prints a row per case and exits 0 when every case is exact", async () => {
  const r = await runCliProcess(SMALL);
  assert.equal(r.code, 0, r.stderr);
  const lines = r.stdout.trimEnd().split("\n");
  assert.match(lines[1], /^family\s+prompt\s+page\s+pages\s+kv-page B.*max\|diff\|.*verdict$/);
  const rows = lines.filter((l) => /^(dense|hybrid) /.test(l));
  assert.equal(rows.length, 2);
  for (const row of rows) {
    assert.match(row, /\s600\s+256\s+3\s.*\s0\s+exact\s+exact\s+refused\s+refused\s+exact\s+pass$/);
  }
  assert.match(lines.at(-1)!, /^2\/2 cases pass in [\d.]+ s: every continuation bit-exact/);
});

Deno.test("correctness state-handoff --json reports bytes, times and verdicts per variant", async () => {
  const r = await runCliProcess([
    ...SMALL,
    "--families",
    "hybrid",
    "--variants",
    "in-order,flipped-byte",
    "--json",
  ]);
  assert.equal(r.code, 0, r.stderr);
  const { results } = JSON.parse(r.stdout);
  assert.equal(results.length, 1);
  const [c] = results;
  assert.equal(c.ok, true);
  assert.equal(c.pages, 3);
  assert.equal(c.bytes.kvRows, 600 * 512);
  assert.ok(c.bytes.conv > 0 && c.bytes.ssm > 0);
  assert.deepEqual(c.variants.map((v: { verdict: string }) => v.verdict), ["exact", "refused"]);
  assert.equal(c.variants[0].parity.maxAbsDiff, 0);
  assert.match(c.variants[1].detail, /kv-page tokens \[256, 512\).*checksum/);
});

Deno.test("correctness state-handoff rejects bad flags with a one-line error and exit code 2", async () => {
  const cases: [string[], RegExp][] = [
    [["--families", "dense,foo"], /"foo" is not one of dense, iswa/],
    [["--page-tokens", "256,0"], /--page-tokens.*expected an integer from 1 to 8192/],
    [["--variants", "in-order,bogus"], /"bogus" is not one of in-order, shuffled/],
    [["--steps", "two"], /--steps.*expected an integer/],
    [
      ["--families", "dense", "--prompt-tokens", "40000"],
      /40000 prompt tokens plus 16 steps do not fit dense's context of 32768 tokens/,
    ],
  ];
  for (const [args, pattern] of cases) {
    const r = await runCliProcess(["correctness", "state-handoff", "--model-dir", MODELS, ...args]);
    assert.equal(r.code, 2, `${args.join(" ")}: ${r.stderr}`);
    const first = r.stderr.split("\n")[0];
    assert.match(first, /^error: /);
    assert.match(first, pattern);
    assert.equal(r.stdout, "");
  }
});

Deno.test("correctness handoff runs two worker processes and reports each case exact, as JSON", async () => {
  const r = await runCliProcess([
    "correctness",
    "handoff",
    "--model-dir",
    MODELS,
    "--families",
    "hybrid",
    "--prompt-tokens",
    "600",
    "--chunk-tokens",
    "128",
    "--steps",
    "4",
    "--json",
  ]);
  assert.equal(r.code, 0, r.stderr);
  const { results } = JSON.parse(r.stdout);
  assert.equal(results.length, 1);
  const [c] = results;
  assert.equal(c.family, "hybrid");
  assert.equal(c.placement, "disaggregated");
  assert.equal(c.tokensEqual, true);
  assert.equal(c.logitsEqual, true);
  assert.equal(c.chunks, Math.ceil(c.actualPromptTokens / 128));
  assert.equal(c.overlapRequired, c.chunks >= 8);
  assert.equal(c.ok, true, c.detail);
});

Deno.test("correctness handoff refuses a prompt that does not fit the family's context", async () => {
  const r = await runCliProcess([
    "correctness",
    "handoff",
    "--model-dir",
    MODELS,
    "--families",
    "dense",
    "--prompt-tokens",
    "40000",
  ]);
  assert.equal(r.code, 2, r.stderr);
  assert.match(r.stderr.split("\n")[0], /^error: 40000 prompt tokens plus 12 steps do not fit/);
  assert.equal(r.stdout, "");
});
