import assert from "node:assert/strict";
import { HandoffCostRecorder, linkResidualAt, probeMsAt } from "./link_costs.ts";

const MIB = 2 ** 20;

function facts(probeMs: number | null, lastImportMs: number, prefillMs = 1000) {
  return {
    promptTokens: 512,
    totalBytes: 12 * MIB,
    bytesByComponent: { "kv-page": 2 * MIB, conv: MIB, ssm: 9 * MIB },
    probeMs,
    lastImportMs,
    prefillMs,
    uncoveredTailMs: 500,
    commitRoundTripMs: 300,
  };
}

Deno.test("HandoffCostRecorder learns nothing from nothing", () => {
  assert.deepEqual(new HandoffCostRecorder().costs(), { samples: 0 });
});

Deno.test("HandoffCostRecorder keeps the median of the newest samples of each term", () => {
  const r = new HandoffCostRecorder(3);
  r.record(facts(900, 0), 1100); // pushed out by the three below
  r.record(facts(40, 5), 1030);
  r.record(facts(60, 10), 1050);
  r.record(facts(50, 20), 1040);
  const c = r.costs();
  assert.equal(c.samples, 4);
  assert.deepEqual(c.probes, [[512, 40], [512, 60], [512, 50]]); // with the depth each ran at
  assert.equal(c.importMsPerMiB, 1); // 10 ms over the 10 MiB not staged as pages
  assert.equal(c.firstTokenOverheadMs, 40);
  assert.equal(c.prefillerPostMs, undefined); // no predicted link time given: not learned
});

Deno.test("HandoffCostRecorder learns the prefiller's post-prefill work from its measured tail export", () => {
  const r = new HandoffCostRecorder();
  // Prefill end to the manifest took 200 ms, but only 12 ms of it was export work: the rest
  // was the link (flow control, a lost packet) and must not be learned as the prefiller's.
  r.record({ ...facts(40, 0), tailExportMs: 12 }, null, 5);
  r.record({ ...facts(40, 0), tailExportMs: 20 }, null, 5);
  r.record({ ...facts(40, 0), tailExportMs: 16 }, null, 5);
  assert.equal(r.costs().prefillerPostMs, 16);
});

Deno.test("HandoffCostRecorder infers post-prefill work from an older prefiller only on an unshaped link", () => {
  const r = new HandoffCostRecorder();
  r.record(facts(40, 0), null, 20); // shaped: the 200 ms may be the link's; not a sample
  r.record(facts(40, 0), null, 1); // even where the model predicted a short link time
  assert.equal(r.costs().prefillerPostMs, undefined);
  r.record(facts(40, 0), null, 0); // unshaped: 200 ms from prefill end to the manifest
  assert.equal(r.costs().prefillerPostMs, 200);
  r.record({ ...facts(40, 0), uncoveredTailMs: 420 }, null, 0);
  assert.equal(r.costs().prefillerPostMs, 160); // median of 200 and 120
});

Deno.test("HandoffCostRecorder learns the decoder's wait for the prefiller's probe digest", () => {
  const r = new HandoffCostRecorder(3);
  assert.equal(r.costs().probeWaitMs, undefined);
  r.record({ ...facts(40, 0), probeWaitMs: null }); // not measured: no sample
  assert.equal(r.costs().probeWaitMs, undefined);
  for (const wait of [500, 0, 110, 90]) r.record({ ...facts(40, 0), probeWaitMs: wait });
  assert.equal(r.costs().probeWaitMs, 90); // median of the newest three: 0, 110, 90
});

Deno.test("HandoffCostRecorder learns the rest of the decoder's commit: validate and the commit itself", () => {
  const r = new HandoffCostRecorder(3);
  r.record(facts(40, 5)); // the commit not measured: no sample
  assert.equal(r.costs().validateMs, undefined);
  r.record({ ...facts(40, 5), commitMs: 44 }); // 44 < 40 + 5: a clock slip, not a sample
  assert.equal(r.costs().validateMs, undefined);
  // commit = last import + probe + digest wait + validate
  r.record({ ...facts(40, 5), commitMs: 47, probeWaitMs: 0 }); // 2
  r.record({ ...facts(40, 5), commitMs: 66, probeWaitMs: 20 }); // 1
  r.record({ ...facts(30, 2), commitMs: 35.5 }); // 3.5
  assert.equal(r.costs().validateMs, 2);
});

Deno.test("HandoffCostRecorder learns how long before compute end the last layer was captured", () => {
  const r = new HandoffCostRecorder(3);
  r.record({ ...facts(40, 0), captureLeadMs: null }); // no layer capture: no sample
  assert.equal(r.costs().captureLeadMs, undefined);
  for (const lead of [90, 12, 18, 15]) r.record({ ...facts(40, 0), captureLeadMs: lead });
  assert.equal(r.costs().captureLeadMs, 15); // median of the newest three: 12, 18, 15
});

Deno.test("HandoffCostRecorder keeps the newest capture schedule, as shares of its last chunk and bytes", () => {
  const r = new HandoffCostRecorder();
  r.record({ ...facts(40, 0), captureSchedule: [[900, 1], [100, 3]], lastChunkMs: null });
  assert.equal(r.costs().captureSchedule, undefined); // the chunk was not timed
  r.record({ ...facts(40, 0), captureSchedule: [[900, 1], [100, 3]], lastChunkMs: 1000 });
  assert.deepEqual(r.costs().captureSchedule, [[0.9, 0.25], [0.1, 0.75]]);
  r.record({ ...facts(40, 0), captureSchedule: null, lastChunkMs: 1000 }); // not captured
  assert.deepEqual(r.costs().captureSchedule, [[0.9, 0.25], [0.1, 0.75]]);
  r.record({ ...facts(40, 0), captureSchedule: [[3000, 2], [0, 2]], lastChunkMs: 2000 });
  assert.deepEqual(r.costs().captureSchedule, [[1, 0.5], [0, 0.5]]); // clamped to the chunk
});

Deno.test("HandoffCostRecorder skips a term its record does not carry", () => {
  const r = new HandoffCostRecorder();
  r.record(facts(null, 0, 1000), null);
  r.record({ ...facts(null, 0), prefillMs: null }, 900);
  const c = r.costs();
  assert.equal(c.probes, undefined);
  assert.equal(c.firstTokenOverheadMs, undefined);
  assert.equal(c.importMsPerMiB, 0); // imports all staged on arrival: nothing left at commit
  assert.throws(() => new HandoffCostRecorder(0), /samplesMax/);
});

Deno.test("HandoffCostRecorder keeps the link residual with the RTT, rate and depth it was measured at", () => {
  const r = new HandoffCostRecorder(2);
  // Tail 500 ms = decoder commit 300 + the model's link time 40 + RTT 10 + 150 unexplained.
  r.record({ ...facts(40, 0), commitMs: 300, rttMs: 10, tailExportMs: 5 }, null, 40);
  assert.deepEqual(r.costs().linkResidual, { samples: [[10, 150, null, 512]] });
  // The prefiller's own export, when later than the model's link time, is not residual.
  r.record(
    { ...facts(40, 0), commitMs: 300, rttMs: 10, tailExportMs: 100, bandwidthBytesPerS: 5e7 },
    null,
    40,
  );
  assert.deepEqual(r.costs().linkResidual!.samples[1], [10, 90, 5e7, 512]);
  // No RTT, no decoder commit or no predicted link time: nothing to measure it against.
  r.record({ ...facts(40, 0), commitMs: 300 }, null, 40);
  r.record({ ...facts(40, 0), rttMs: 10 }, null, 40);
  r.record({ ...facts(40, 0), commitMs: 300, rttMs: 10 }, null, null);
  assert.equal(r.costs().linkResidual!.samples.length, 2);
  r.record({ ...facts(40, 0), commitMs: 100, rttMs: 2 }, null, 0); // the oldest leaves
  assert.deepEqual(r.costs().linkResidual!.samples, [[10, 90, 5e7, 512], [2, 398, null, 512]]);
});

Deno.test("linkResidualAt() takes the median of the samples measured on a similar link", () => {
  assert.equal(linkResidualAt([], 1), 0);
  const samples: [number, number][] = [[0.3, 40], [0.2, 60], [11, 900], [10, 1100]];
  assert.equal(linkResidualAt(samples, 0.25), 50); // 0.3 and 0.2 ms are near 0.25
  assert.equal(linkResidualAt(samples, 12), 1000); // 11 and 10 ms
  assert.equal(linkResidualAt(samples, 3), 480); // none within 2x: all four
  assert.equal(linkResidualAt([[1, -20]], 1), 0); // never below 0
  // At one RTT, a slow (or lossy) link's stalls are not a fast link's: rates within 2x only,
  // a sample without a rate counting as similar, and the RTT's samples where none is alike.
  const rated: [number, number, number | null][] = [
    [2, 40, 1e8],
    [2, 60, 1.5e8],
    [2, 5000, 1e7],
    [2, 3000, 1.2e7],
  ];
  assert.equal(linkResidualAt(rated, 2, 1.2e8), 50);
  assert.equal(linkResidualAt(rated, 2, 1e7), 4000);
  assert.equal(linkResidualAt(rated, 2, 4e8), 1530); // none within 2x: the RTT's four
  assert.equal(linkResidualAt(rated, 2), 1530); // the link's rate unknown: by RTT alone
  assert.equal(linkResidualAt([[2, 70, null], [2, 5000, 1e7]], 2, 1e8), 70);
});

Deno.test("linkResidualAt() prefers, of the similar samples, those from a similar depth", () => {
  // One link, three handoffs of 512 tokens and one of 2K: how the captured layers meet the link
  // over the last chunk depends on the chunk's length, which grows with depth.
  const link: [number, number, number, number | null][] = [
    [2, 90, 1e7, 512],
    [2, 80, 1e7, 512],
    [2, 100, 1e7, 512],
    [2, 30, 1e7, 2048],
  ];
  assert.equal(linkResidualAt(link, 2, 1e7, 2000), 30); // the 2K handoff alone
  assert.equal(linkResidualAt(link, 2, 1e7, 600), 90); // the three at 512
  assert.equal(linkResidualAt(link, 2, 1e7, 8192), 85); // none within 2x: all four
  assert.equal(linkResidualAt(link, 2, 1e7), 85); // depth not given: all four
  // A sample without its depth counts at every depth; depth never outranks the link.
  assert.equal(linkResidualAt([[2, 40, 1e7, null], [2, 80, 1e7, 512]], 2, 1e7, 2048), 40);
  assert.equal(linkResidualAt([[2, 40, 1e8, 2048], [2, 80, 1e7, 512]], 2, 1e7, 2048), 80);
});

Deno.test("probeMsAt() reads the probes at a similar depth, carried by the decoder's depth curve", () => {
  const step = (d: number) => 5 + d / 1000; // the node's decode step at depth d, ms
  const served: [number, number][] = [[512, 8], [512, 9], [2048, 10], [2048, 12]];
  assert.equal(probeMsAt([], 512, step), null); // nothing measured: the caller uses the rates
  // Each depth from its own probes (512: 8 and 9; 2048: 10 and 12), within a factor of 2.
  assert.equal(probeMsAt(served, 512, step), 8.5);
  assert.equal(probeMsAt(served, 2048, step), 11);
  // 1024 is within 2x of both: all four, each carried to 1024 by the step's difference.
  const carried = served.map(([d, ms]) => ms + step(1024) - step(d)).sort((a, b) => a - b);
  assert.ok(Math.abs(probeMsAt(served, 1024, step)! - (carried[1] + carried[2]) / 2) < 1e-9);
  // A 32K prompt on a pair that served only short ones: not the short probe, but the short
  // probe plus the step's growth to 32K (the median of the four carried).
  const deep = probeMsAt(served, 32768, step)!;
  const growth = (d: number) => step(32768) - step(d);
  assert.ok(Math.abs(deep - (9 + growth(512) + 10 + growth(2048)) / 2) < 1e-9, `${deep}`);
  assert.ok(deep > 35); // the short probes themselves are 8-12 ms
  // A curve that falls with depth (a noisy rate) never carries a probe below 0.
  assert.equal(probeMsAt([[512, 5]], 32768, (d) => 100 - d / 1000), 0);
});
