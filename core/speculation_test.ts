import assert from "node:assert/strict";
import { UsageError } from "./errors.ts";
import {
  acceptanceRate,
  acceptGreedy,
  countRound,
  emptyCounters,
  parseSpeculationMode,
  usesMtp,
  usesSuffix,
} from "./speculation.ts";
import { DecoderTelemetry, deriveTelemetry, formatTelemetry } from "./telemetry.ts";

Deno.test("speculation modes parse, and unknown ones are refused naming the valid ones", () => {
  assert.equal(parseSpeculationMode(" mtp+suffix "), "mtp+suffix");
  assert.throws(
    () => parseSpeculationMode("eagle"),
    (e: Error) =>
      e instanceof UsageError && /none, mtp, suffix, mtp\+suffix/.test(String(e.hint ?? e)),
  );
  assert.deepEqual(
    (["none", "mtp", "suffix", "mtp+suffix"] as const).map((m) => [usesMtp(m), usesSuffix(m)]),
    [[false, false], [true, false], [false, true], [true, true]],
  );
});

Deno.test("greedy acceptance takes the longest agreeing prefix", () => {
  assert.equal(acceptGreedy([5, 6, 7, 8], [5, 6, 9]), 2);
  assert.equal(acceptGreedy([5, 6, 7, 8], [5, 6, 7]), 3);
  assert.equal(acceptGreedy([1, 6], [5, 6]), 0, "a later match after a miss does not count");
  assert.equal(acceptGreedy([1], []), 0);
});

Deno.test("a rejected suffix tail never counts against MTP, and the other way round", () => {
  const c = emptyCounters();
  countRound(c, 2, 3, 4); // both MTP drafts and 2 of 3 suffix drafts accepted
  countRound(c, 2, 3, 1); // 1 MTP draft accepted: the whole tail is rejected
  countRound(c, 0, 4, 0);
  assert.deepEqual(c, {
    rounds: 3,
    mtpDrafted: 4,
    mtpAccepted: 3,
    suffixDrafted: 10,
    suffixAccepted: 2,
    rolledBack: 9,
  });
  assert.equal(acceptanceRate(c.mtpAccepted, c.mtpDrafted), 0.75);
  assert.equal(acceptanceRate(0, 0), null);
});

Deno.test("decoder telemetry carries the speculation summary into the record and its line", () => {
  const t = new DecoderTelemetry();
  t.push({ type: "committed", atMs: 1 });
  t.push({
    type: "speculation",
    atMs: 9,
    mode: "mtp+suffix",
    rollback: "native",
    mtpReadiness: "lagging-one",
    fallback: null,
    rounds: 3,
    mtpDrafted: 4,
    mtpAccepted: 3,
    suffixDrafted: 10,
    suffixAccepted: 2,
    rolledBack: 9,
  });
  const summary = t.summary();
  assert.equal(summary.speculation?.suffixAccepted, 2);
  assert.equal(new DecoderTelemetry().summary().speculation, undefined, "absent when none ran");
  const record = deriveTelemetry({ prefiller: [], decoder: summary });
  assert.deepEqual(record.speculation, summary.speculation);
  assert.match(
    formatTelemetry(record),
    /speculation mtp\+suffix: mtp 3\/4, suffix 2\/10 accepted in 3 rounds \(native rollback\)/,
  );
});
