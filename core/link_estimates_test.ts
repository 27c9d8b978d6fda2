import assert from "node:assert/strict";
import { UsageError } from "./errors.ts";
import { handoffTailSample, handoffTransferSample, LinkEstimator } from "./link_estimates.ts";
import {
  averagePrefillTokensPerS,
  msPerTokenAt,
  parseCalibration,
  prefillMsFor,
  RateRecorder,
} from "./node_rates.ts";
import {
  emptyCertification,
  isCertified,
  parseCertification,
  withCertification,
} from "./certification.ts";

const MIB = 1024 * 1024;
const P = { from: "a", to: "b" };

Deno.test("LinkEstimator keeps medians, age and ping loss per directed pair", () => {
  const l = new LinkEstimator();
  l.recordRtt(P, 1, 0);
  l.recordRtt(P, 3, 10);
  l.recordRtt(P, 2, 20);
  l.recordPingLost(P, 30);
  assert.equal(l.recordTransfer(P, 100 * MIB, 1000, 40, "handoff"), true);
  assert.equal(l.recordTransfer(P, 1000, 1, 40, "handoff"), false, "too small to be a sample");
  const e = l.estimate(P, 100)!;
  assert.equal(e.rttMs, 2);
  assert.equal(e.bandwidthBytesPerS, 100 * MIB);
  assert.equal(e.lossFraction, 0.25);
  assert.equal(e.ageMs, 80); // the newest RTT (t=20) is older than the transfer (t=40)
  assert.equal(e.degraded, null);
  assert.equal(l.estimate({ from: "b", to: "a" }, 100), null, "pairs are directed");
});

Deno.test("LinkEstimator drops samples outside the window and bounds the count", () => {
  const l = new LinkEstimator({ windowMsMax: 1000, samplesMax: 4 });
  for (let k = 0; k < 10; k++) l.recordRtt(P, k, k);
  assert.equal(l.estimate(P, 10)!.rttSamples, 4);
  assert.equal(l.estimate(P, 5000), null);
});

Deno.test("LinkEstimator flags a bandwidth drop and reports the newest rate", () => {
  const l = new LinkEstimator();
  for (let k = 0; k < 3; k++) l.recordTransfer(P, 100 * MIB, 1000, k, "handoff");
  assert.equal(l.estimate(P, 5)!.degraded, null);
  l.recordTransfer(P, 100 * MIB, 4000, 10, "handoff");
  const e = l.estimate(P, 20)!;
  assert.equal(e.degraded?.code, "bandwidth-drop");
  assert.equal(e.bandwidthBytesPerS, 25 * MIB);
});

Deno.test("LinkEstimator flags an RTT rise but not sub-millisecond jitter", () => {
  const l = new LinkEstimator();
  for (let k = 0; k < 5; k++) l.recordRtt(P, 0.2, k);
  for (let k = 0; k < 3; k++) l.recordRtt(P, 0.6, 10 + k); // 3x but +0.4 ms only
  assert.equal(l.estimate(P, 20)!.degraded, null);
  for (let k = 0; k < 3; k++) l.recordRtt(P, 10, 30 + k);
  const e = l.estimate(P, 40)!;
  assert.equal(e.degraded?.code, "rtt-rise");
  assert.equal(e.rttMs, 10);
});

Deno.test("LinkEstimator rejects bad samples and options", () => {
  const l = new LinkEstimator();
  assert.throws(() => l.recordRtt(P, -1, 0), UsageError);
  assert.throws(() => l.recordRtt({ from: "", to: "b" }, 1, 0), UsageError);
  assert.throws(() => new LinkEstimator({ bandwidthDropRatio: 2 }), UsageError);
});

Deno.test("prefillMsFor() integrates time per token between depth points", () => {
  const pts = [{ contextTokens: 0, tokensPerS: 1000 }, { contextTokens: 1000, tokensPerS: 500 }];
  assert.equal(prefillMsFor(pts, 0, 1000), 1500); // 1 ms/token rising to 2 ms/token
  // Beyond the last point it keeps growing along the last two points' slope: 2 to 3 ms/token.
  assert.equal(prefillMsFor(pts, 1000, 2000), 2500);
  assert.ok(Math.abs(averagePrefillTokensPerS(pts, 1000) - 666.67) < 0.01);
});

Deno.test("msPerTokenAt() holds below the first point, past twice the last, and where it falls", () => {
  const rising = [{ contextTokens: 256, tokensPerS: 1000 }, {
    contextTokens: 1024,
    tokensPerS: 500,
  }];
  assert.equal(msPerTokenAt(rising, 0), 1);
  assert.equal(msPerTokenAt(rising, 640), 1.5);
  assert.equal(msPerTokenAt(rising, 1792), 3);
  const atTwice = msPerTokenAt(rising, 2048); // twice the last point's depth
  assert.ok(Math.abs(atTwice - (2 + 1024 / 768)) < 1e-12);
  assert.equal(msPerTokenAt(rising, 65536), atTwice); // held beyond it
  const falling = [{ contextTokens: 256, tokensPerS: 500 }, {
    contextTokens: 1024,
    tokensPerS: 1000,
  }];
  assert.equal(msPerTokenAt(falling, 4096), 1);
  assert.equal(msPerTokenAt([{ contextTokens: 512, tokensPerS: 250 }], 8192), 4);
});

Deno.test("RateRecorder buckets measurements by depth and reports medians at their depth", () => {
  const r = new RateRecorder("n", 3);
  r.recordPrefill(1000, 1000);
  r.recordPrefill(1000, 2000);
  r.recordPrefill(1000, 500);
  r.recordDecode(10, 100, 4000);
  r.recordDecode(10, 50, 3000);
  const rates = r.rates();
  assert.deepEqual(rates.prefill, [{ contextTokens: 500, tokensPerS: 1000 }]);
  // 3000 and 4000 share the 4096 bucket: the point sits at their mean depth.
  assert.deepEqual(rates.decode, [{ contextTokens: 3500, tokensPerS: 200 }]);
});

Deno.test("RateRecorder learns a handoff's last chunk at its own depth", () => {
  const r = new RateRecorder("n");
  // 4073 tokens in 91.2 s; the last 512 (depth 3561-4073) alone took 13.3 s.
  r.recordHandoffPrefill({
    promptTokens: 4073,
    cachedTokens: 0,
    prefillMs: 91_200,
    lastChunkTokens: 512,
    lastChunkMs: 13_300,
  });
  const rates = r.rates().prefill;
  assert.deepEqual(rates.map((p) => p.contextTokens), [2036.5, 3817]);
  assert.ok(Math.abs(rates[1].tokensPerS - 512 / 13.3) < 1e-9);
  // The planner's last chunk of the next such prompt is that chunk's measured time.
  assert.ok(Math.abs(prefillMsFor(rates, 3561, 4073) - 13_300) < 150);
  // With a cached prefix only the computed tokens count, from where they start.
  const c = new RateRecorder("c");
  c.recordHandoffPrefill({ promptTokens: 3000, cachedTokens: 1000, prefillMs: 20_000 });
  assert.deepEqual(c.rates().prefill, [{ contextTokens: 2000, tokensPerS: 100 }]);
  // A last chunk that is the whole prefill, or untimed, adds nothing.
  const one = new RateRecorder("one");
  one.recordHandoffPrefill({
    promptTokens: 400,
    prefillMs: 4000,
    lastChunkTokens: 400,
    lastChunkMs: 3900,
  });
  one.recordHandoffPrefill({ promptTokens: 400, prefillMs: null, lastChunkMs: null });
  assert.equal(one.rates().prefill.length, 1);
});

Deno.test("parseCalibration() reads nodes and names the first bad field", () => {
  const ok = parseCalibration({
    version: 1,
    nodes: [{
      nodeId: "m3",
      prefill: [{ contextTokens: 0, tokensPerS: 900 }],
      decode: [{ contextTokens: 0, tokensPerS: 30 }],
    }],
  });
  assert.equal(ok[0].source, "calibration");
  assert.throws(() => parseCalibration({ version: 2, nodes: [] }), /version 2 is not 1/);
  assert.throws(
    () =>
      parseCalibration({
        version: 1,
        nodes: [{ nodeId: "x", prefill: [{ contextTokens: 0, tokensPerS: 0 }], decode: [] }],
      }),
    /nodes\[0\]: prefill rate point/,
  );
});

Deno.test("certification file: parse, lookup by family and build, replace on rewrite", () => {
  const entry = {
    family: "hybrid" as const,
    llamaBuild: "b1+x",
    gate: "state-handoff" as const,
    cases: 2,
    promptTokens: [1024],
    certifiedAt: "t",
  };
  const cert = parseCertification(
    JSON.parse(JSON.stringify(withCertification(emptyCertification(), entry))),
  );
  assert.equal(isCertified(cert, "hybrid", "b1+x"), true);
  assert.equal(isCertified(cert, "hybrid", "b2+x"), false);
  assert.equal(isCertified(cert, "dense", "b1+x"), false);
  assert.equal(withCertification(cert, { ...entry, cases: 5 }).entries.length, 1);
  assert.throws(
    () => parseCertification({ version: 1, entries: [{ ...entry, family: "gpt" }] }),
    /family "gpt" is unknown/,
  );
});

Deno.test("handoffTransferSample() uses delivery time, not write-acceptance time, for small transfers", () => {
  const t = {
    totalBytes: 2 * MIB,
    wireMs: 500, // writes accepted early: 4 MB/s, faster than the link
    uncoveredTailMs: 2100,
    commitMs: 80,
    stagedBeforePrefillEndFraction: null,
    overlapFraction: null,
  };
  assert.deepEqual(handoffTransferSample(t, 40), { bytes: 2 * MIB, ms: 2000 });
  assert.equal(handoffTransferSample({ ...t, stagedBeforePrefillEndFraction: 0.5 }, 40), null);
  // Layers captured during the last chunk left before prefill ended: the tail is not their time.
  assert.equal(handoffTransferSample({ ...t, captureLeadMs: 3 }, 40), null);
  assert.deepEqual(handoffTransferSample({ ...t, captureLeadMs: null }, 40), {
    bytes: 2 * MIB,
    ms: 2000,
  });
  assert.deepEqual(handoffTransferSample({ ...t, totalBytes: 64 * MIB }, 40), {
    bytes: 64 * MIB,
    ms: 500,
  });
});

Deno.test("handoffTransferSample() prefers the backlog's rate where 32 MiB or more were written behind one", () => {
  // 200 MB written; pages to an idle link returned early (wireMs short), 96 MiB of recurrent
  // layers queued behind each other at the link's rate.
  const t = {
    totalBytes: 200e6,
    wireMs: 15_000,
    backlogBytes: 96 * MIB,
    backlogMs: 9_300,
    uncoveredTailMs: 1300,
    commitMs: 80,
    stagedBeforePrefillEndFraction: 0.2,
    overlapFraction: 0.2,
  };
  assert.deepEqual(handoffTransferSample(t, 1), { bytes: 96 * MIB, ms: 9_300 });
  // Too little behind a backlog to say: the summed write time.
  assert.deepEqual(handoffTransferSample({ ...t, backlogBytes: 16 * MIB }, 1), {
    bytes: 200e6,
    ms: 15_000,
  });
});

Deno.test("LinkEstimator: datagram loss probes, where any are fresh, decide the loss, not pings", () => {
  const links = new LinkEstimator({ windowMsMax: 10_000 });
  const pair = { from: "p", to: "d" };
  for (let k = 0; k < 10; k++) links.recordRtt(pair, 2, k); // ten answered pings: 0%
  let e = links.estimate(pair, 10)!;
  assert.deepEqual([e.lossFraction, e.lossSource, e.lossSamples], [0, "pings", 10]);
  links.recordLossProbe(pair, 10_000, 11, 100);
  links.recordLossProbe(pair, 5_000, 2, 200);
  e = links.estimate(pair, 300)!;
  assert.equal(e.lossSource, "datagrams");
  assert.equal(e.lossSamples, 15_000);
  assert.ok(Math.abs(e.lossFraction! - 13 / 15_000) < 1e-15, `${e.lossFraction}`);
  assert.equal(links.lossProbeAgeMs(pair, 300), 100);
  // Out of the window, the pings decide again (those still in it).
  links.recordRtt(pair, 2, 20_000);
  e = links.estimate(pair, 20_100)!;
  assert.deepEqual([e.lossSource, e.lossFraction], ["pings", 0]);
  assert.equal(links.lossProbeAgeMs(pair, 20_100), null);
  assert.throws(() => links.recordLossProbe(pair, 10, 11, 0), /11 loss events in 10 sent/);
  assert.throws(() => links.recordLossProbe(pair, 0, 0, 0), /sent positive/);
});

Deno.test("LinkEstimator: a stated loss is read as given and named stated", () => {
  const links = new LinkEstimator();
  const pair = { from: "p", to: "d" };
  for (let k = 0; k < 100; k++) links.recordRtt(pair, 2, 0);
  links.recordStatedLoss(pair, 0.001, 0);
  const e = links.estimate(pair, 0)!;
  assert.deepEqual([e.lossFraction, e.lossSource], [0.001, "stated"]);
  assert.throws(() => links.recordStatedLoss(pair, 1.5, 0), /a fraction from 0 to 1/);
  assert.throws(() => links.recordStatedLoss(pair, Number.NaN, 0), /a fraction from 0 to 1/);
});

Deno.test("LinkEstimator: the handoffs' own transfers, where any is fresh, decide the bandwidth; a probe only stands in", () => {
  const links = new LinkEstimator({ windowMsMax: 10_000 });
  const pair = { from: "p", to: "d" };
  links.recordTransfer(pair, 8 * MIB, 655, 0, "probe"); // ~12.8 MB/s
  let e = links.estimate(pair, 100)!;
  assert.deepEqual([e.bandwidthSource, e.bandwidthSamples], ["probe", 1]);
  links.recordTransfer(pair, 100e6, 9_260, 200, "handoff"); // 10.8 MB/s
  links.recordTransfer(pair, 8 * MIB, 650, 300, "probe"); // a newer probe does not outvote it
  e = links.estimate(pair, 400)!;
  assert.deepEqual([e.bandwidthSource, e.bandwidthSamples], ["handoff", 1]);
  assert.ok(Math.abs(e.bandwidthBytesPerS! - 100e6 / 9.26) < 1, `${e.bandwidthBytesPerS}`);
  // Once the handoff sample leaves the window, the fresh probe stands in again.
  e = links.estimate(pair, 10_250)!;
  assert.deepEqual([e.bandwidthSource, e.bandwidthSamples], ["probe", 1]);
});

Deno.test("handoffTailSample() and the estimator's tail rate: the decoder's timing of the last large frame", () => {
  const facts = {
    totalBytes: 200 * MIB,
    wireMs: 5000,
    uncoveredTailMs: 120,
    commitMs: 60,
    stagedBeforePrefillEndFraction: 1,
    overlapFraction: 1,
  };
  assert.equal(handoffTailSample(facts), null, "an older decoder: no sample");
  assert.equal(handoffTailSample({ ...facts, tailArrivalBytes: 4e6, tailArrivalMs: 0 }), null);
  const s = handoffTailSample({ ...facts, tailArrivalBytes: 4e6, tailArrivalMs: 64 })!;
  assert.deepEqual(s, { bytes: 4e6, ms: 64 });
  const links = new LinkEstimator({ windowMsMax: 10_000 });
  links.recordTransfer(P, 100e6, 2_500, 0, "handoff"); // 40 MB/s over the whole transfer
  assert.equal(links.estimate(P, 0)!.tailBytesPerS, null);
  for (const [ms, at] of [[64, 0], [80, 10], [50, 20]]) links.recordTailTransfer(P, 4e6, ms, at);
  const e = links.estimate(P, 30)!;
  assert.equal(e.bandwidthBytesPerS, 40e6, "tail samples leave the transfer rate alone");
  assert.equal(e.tailBytesPerS, 62.5e6);
  links.recordRtt(P, 0.3, 10_000);
  assert.equal(links.estimate(P, 10_015)!.tailBytesPerS, 80e6, "only the fresh ones count");
  assert.throws(() => links.recordTailTransfer(P, 4e6, 0, 40), UsageError);
});
