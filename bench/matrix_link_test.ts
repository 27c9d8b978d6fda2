import assert from "node:assert/strict";
import {
  earlierLossProbes,
  plannerLinks,
  type PointSamples,
  pointTransfers,
  recordPointTransfer,
  TRANSFERS_PER_POINT,
} from "./_matrix_link.ts";

const MIB = 1024 * 1024;
const P = { rateBitsPerS: 100e6, rttMs: 2, lossFraction: 0 };
const PAIR = { from: "p", to: "d" };

/** A handoff record's transfer fields: `mbPerS` over a 64 MiB backlog. */
function handoff(mbPerS: number) {
  return {
    totalBytes: 200 * MIB,
    wireMs: 10_000,
    backlogBytes: 64 * MIB,
    backlogMs: (64 * MIB) / (mbPerS * 1e3),
    uncoveredTailMs: 1200,
    commitMs: 50,
    stagedBeforePrefillEndFraction: 0.5,
    overlapFraction: 0.5,
    captureLeadMs: 3,
  };
}

Deno.test("plannerLinks(): a point's first row plans from its probe, later ones from its handoffs", () => {
  const byPoint = new Map<string, PointSamples>();
  const probe = { rttMs: 2.1, bandwidthBytesPerS: 12.2e6, lossFraction: 0 };
  let e = plannerLinks(PAIR, probe, pointTransfers(byPoint, P), [], 5).estimate(PAIR, 5)!;
  assert.deepEqual([e.bandwidthBytesPerS, e.bandwidthSource, e.rttMs], [12.2e6, "probe", 2.1]);
  assert.equal(e.tailBytesPerS, null);
  recordPointTransfer(byPoint, P, handoff(10.8), 2.1);
  recordPointTransfer(byPoint, { ...P, rttMs: 10 }, handoff(5), 10); // another point
  recordPointTransfer(byPoint, P, { ...handoff(1), backlogBytes: 0, totalBytes: MIB }, 2.1);
  e = plannerLinks(PAIR, probe, pointTransfers(byPoint, P), [], 5).estimate(PAIR, 5)!;
  assert.equal(e.bandwidthSource, "handoff");
  assert.ok(Math.abs(e.bandwidthBytesPerS! - 10.8e6) < 1, `${e.bandwidthBytesPerS}`);
  for (const r of [11, 11.5, 12]) recordPointTransfer(byPoint, P, handoff(r), 2.1);
  const kept = pointTransfers(byPoint, P).transfers.map((x) => Math.round(x / 1e5) / 10);
  assert.deepEqual(kept, [11, 11.5, 12].slice(-TRANSFERS_PER_POINT));
  assert.deepEqual(pointTransfers(byPoint, P).tails, [], "no decoder timing: no tail sample");
});

Deno.test("plannerLinks(): the point's tail samples are read apart from its transfers", () => {
  const byPoint = new Map<string, PointSamples>();
  const probe = { rttMs: 2.1, bandwidthBytesPerS: 12.2e6, lossFraction: 0 };
  // The last large frame's 4 MiB arrived over 0.4 s, then 0.3 s, then 0.35 s: 10.5, 14, 12 MB/s.
  for (const ms of [400, 300, 350]) {
    recordPointTransfer(
      byPoint,
      P,
      { ...handoff(10), tailArrivalBytes: 4.2e6, tailArrivalMs: ms },
      2,
    );
  }
  const e = plannerLinks(PAIR, probe, pointTransfers(byPoint, P), [], 5).estimate(PAIR, 5)!;
  assert.ok(Math.abs(e.bandwidthBytesPerS! - 10e6) < 1, `${e.bandwidthBytesPerS}`);
  assert.ok(Math.abs(e.tailBytesPerS! - 12e6) < 1, `${e.tailBytesPerS}`);
});

Deno.test("plannerLinks(): the point's earlier loss probes are read with the row's own", () => {
  const lossByPoint = new Map<string, number[]>();
  const probe = (lossFraction: number) => ({ rttMs: 2, bandwidthBytesPerS: 12e6, lossFraction });
  for (const f of [0.002, 0]) earlierLossProbes(lossByPoint, P, f);
  const earlier = earlierLossProbes(lossByPoint, P, 0.001);
  const none = { transfers: [], tails: [] };
  const e = plannerLinks(PAIR, probe(0.001), none, earlier, 0).estimate(PAIR, 0)!;
  assert.ok(Math.abs(e.lossFraction! - 0.001) < 1e-9, `${e.lossFraction}`);
  assert.equal(e.lossSamples, 3e6);
});
