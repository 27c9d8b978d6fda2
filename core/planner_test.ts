import assert from "node:assert/strict";
import { UsageError } from "./errors.ts";
import {
  DEFAULT_PLAN_OPTIONS,
  estimate,
  type LinkResidualSample,
  lossLimitedBytesPerS,
  plan,
  type PlanInput,
  stateBytesFor,
} from "./planner.ts";
import { planInput } from "./_test_fixtures.ts";
import { TOKEN_BYTES } from "./schema.ts";

const MIB = 1024 * 1024;

const input = planInput;

function codes(p: ReturnType<typeof plan>): string[] {
  return p.reasons.map((r) => r.code);
}

Deno.test("plan() disaggregates a long prompt over a fast, fresh link to a slower decoder", () => {
  const p = plan(input());
  assert.equal(p.placement, "disaggregated");
  assert.deepEqual(codes(p), ["chosen"]);
  const e = p.estimates!;
  assert.ok(e.benefitMs > 10_000, `benefit ${e.benefitMs}`);
  assert.ok(e.handoffTailMs < 200, `tail ${e.handoffTailMs}`);
  assert.ok(e.overlapFraction! > 0.99);
});

Deno.test("plan() rejects disaggregation when the link is slower than recompute", () => {
  // A fast prefiller cannot help when 1 Gb/s needs longer for the state than the decoder
  // needs to recompute the prompt.
  const slow = input({
    link: { bandwidthBytesPerS: 125e6, rttMs: 0.5, ageMs: 10 },
    prefillerPrefillTokensPerS: 40_000,
    decoderPrefillTokensPerS: 12_000,
  });
  const p = plan(slow);
  assert.equal(p.placement, "colocated");
  assert.ok(codes(p).includes("slower-than-recompute"));
  assert.ok(p.estimates!.disaggregatedMs > p.estimates!.colocatedMs);
});

Deno.test("plan() rejects short prompts even on a perfect link", () => {
  const p = plan(input({ promptTokens: 512 }));
  assert.equal(p.placement, "colocated");
  assert.ok(codes(p).includes("prompt-too-short"));
});

Deno.test("plan() rejects missing and stale link measurements", () => {
  const none = plan(input({ link: null }));
  assert.equal(none.placement, "colocated");
  assert.ok(codes(none).includes("no-link-measurement"));
  assert.equal(none.estimates, null);
  const stale = plan(input({ link: { bandwidthBytesPerS: 5e9, rttMs: 0.3, ageMs: 120_000 } }));
  assert.equal(stale.placement, "colocated");
  assert.match(stale.reasons.find((r) => r.code === "link-stale")!.message, /120\.00 s old/);
});

Deno.test("plan() rejects slow links and high RTT explicitly", () => {
  const p = plan(input({ link: { bandwidthBytesPerS: 50e6, rttMs: 40, ageMs: 10 } }));
  assert.ok(codes(p).includes("link-too-slow"));
  assert.ok(codes(p).includes("rtt-too-high"));
  assert.equal(p.placement, "colocated");
});

Deno.test("plan() names every missing capability, identity and certification", () => {
  const p = plan(input({
    flags: {
      prefillerHasPrefillRole: false,
      decoderHasDecodeRole: false,
      schemaShared: false,
      identityMatch: false,
      familyCertified: false,
    },
  }));
  assert.equal(p.placement, "colocated");
  const c = codes(p);
  assert.equal(c.filter((x) => x === "capability-missing").length, 3);
  assert.ok(c.includes("identity-mismatch") && c.includes("not-certified"));
});

Deno.test("plan() rejects a state that does not fit the decoder's free memory", () => {
  const bytes = stateBytesFor(input().state, 32_768);
  const p = plan(input({ decoderFreeBytes: bytes }));
  assert.ok(codes(p).includes("decoder-memory"));
  assert.equal(p.placement, "colocated");
});

Deno.test("plan() keeps a layer split when it beats recompute but disaggregation is ineligible", () => {
  const p = plan(input({
    flags: { ...input().flags, familyCertified: false },
    layerSplit: { prefillTokensPerS: 3000, hopMsPerToken: 1, outputTokens: 256 },
  }));
  assert.equal(p.placement, "layer-split");
  assert.ok(p.estimates!.layerSplitMs! < p.estimates!.colocatedMs);
  // A layer split predicted to win by less than benefitFractionMin of the recompute is refused
  // like a handoff would be: the decoder (1,500 tokens/s) against a split at 1,560.
  const narrow = plan(input({
    flags: { ...input().flags, familyCertified: false },
    layerSplit: { prefillTokensPerS: 1560, hopMsPerToken: 0, outputTokens: 0 },
  }));
  const e = narrow.estimates!;
  assert.ok(
    e.layerSplitMs! < e.colocatedMs && e.colocatedMs - e.layerSplitMs! < 0.1 * e.colocatedMs,
  );
  assert.equal(narrow.placement, "colocated");
});

Deno.test("plan() throws UsageError on impossible inputs", () => {
  assert.throws(() => plan(input({ promptTokens: 0 })), UsageError);
  assert.throws(() => plan(input({ chunkTokens: NaN })), UsageError);
  assert.throws(() => plan(input({ prefillerCachedTokens: 40_000 })), UsageError);
  assert.throws(() => plan(input({ prefillerLastChunkTokensPerS: -1 })), UsageError);
});

Deno.test("estimate(): with a link faster than prefill only the last page stays uncovered", () => {
  const i = input();
  const e = estimate(i, i.link!);
  const lastPageMs = (2048 * 8192) / 5e6;
  assert.ok(Math.abs(e.uncoveredKvMs - lastPageMs) < 1e-6, `${e.uncoveredKvMs} vs ${lastPageMs}`);
  assert.equal(e.kvBytes, 32_768 * 8192);
});

Deno.test("estimate(): with a link slower than prefill the backlog stays uncovered", () => {
  const i = input({
    link: { bandwidthBytesPerS: 100e6, rttMs: 0.3, ageMs: 1 },
    prefillerPrefillTokensPerS: 100_000,
  });
  const e = estimate(i, i.link!);
  const transferMs = (32_768 * 8192) / 100e3;
  // Everything after the first chunk's compute is on the tail.
  assert.ok(Math.abs(e.uncoveredKvMs - (transferMs + 2048 / 100 - e.prefillerPrefillMs)) < 1e-6);
  assert.ok(e.overlapFraction! < 0.2);
});

Deno.test("lossLimitedBytesPerS() falls with the RTT and the square root of the loss", () => {
  assert.equal(lossLimitedBytesPerS(10, 0, 2000), Infinity);
  assert.equal(lossLimitedBytesPerS(0, 0.001, 2000), Infinity);
  const r = lossLimitedBytesPerS(10, 0.001, 2000);
  assert.ok(Math.abs(r - 2000 / (0.01 * Math.sqrt(0.001))) < 1e-6, `${r}`);
  assert.ok(Math.abs(lossLimitedBytesPerS(20, 0.001, 2000) - r / 2) < 1e-6);
  assert.ok(Math.abs(lossLimitedBytesPerS(10, 0.004, 2000) - r / 2) < 1e-6);
});

Deno.test("estimate(): a lossy link's transfer runs at the loss-limited rate, not the probe's", () => {
  // A probe over 10 ms and 0.1% loss reads the line rate (its bytes fit before the first
  // loss); the state then moves at what the congestion controller holds under that loss.
  const link = { bandwidthBytesPerS: 50e6, rttMs: 10, ageMs: 1 };
  const i = input({ link, prefillerPrefillTokensPerS: 100_000 });
  const clean = estimate(i, link);
  const lossy = estimate(i, { ...link, lossFraction: 0.001 });
  const limit = lossLimitedBytesPerS(10, 0.001, DEFAULT_PLAN_OPTIONS.lossResponseBytes);
  assert.equal(clean.lossLimited, false);
  assert.equal(clean.linkBytesPerS, 50e6);
  assert.equal(lossy.lossLimited, true);
  assert.equal(lossy.linkBytesPerS, limit);
  // Every page leaves after the first chunk's (20.48 ms), and the token history, final before
  // prefill, goes first once the 10 ms reservation round trip is done: the later of the two.
  const bwPerMs = limit / 1000, kvMs = (i.promptTokens * 8192) / bwPerMs;
  const finishMs = Math.max(
    2048 / 100 + kvMs,
    10 + (i.promptTokens * TOKEN_BYTES) / bwPerMs + kvMs,
  );
  assert.ok(Math.abs(lossy.uncoveredKvMs - (finishMs - lossy.prefillerPrefillMs)) < 1e-6);
  assert.ok(lossy.handoffTailMs > 5 * clean.handoffTailMs, `${lossy.handoffTailMs}`);
  // Over 0.2 ms the same loss limits nothing below the probe's rate.
  const near = estimate(i, { ...link, rttMs: 0.2, lossFraction: 0.001 });
  assert.equal(near.lossLimited, false);
  assert.equal(near.linkBytesPerS, 50e6);
});

Deno.test("estimate(): a BBR sender moves a lossy link's state at the measured rate, Cubic at the loss-limited one", () => {
  // BBR paces at the bottleneck rate it measures and does not slow for random loss
  // (measured handoffs: FINDINGS section 000000000), so the loss bound does not apply to it.
  const link = { bandwidthBytesPerS: 50e6, rttMs: 10, ageMs: 1, lossFraction: 0.001 };
  const i = input({ link, prefillerPrefillTokensPerS: 100_000 });
  const cubic = estimate({ ...i, congestionControl: "cubic" }, link);
  const bbr = estimate({ ...i, congestionControl: "bbr" }, link);
  assert.equal(cubic.lossLimited, true);
  assert.equal(estimate(i, link).linkBytesPerS, cubic.linkBytesPerS); // absent: Cubic
  assert.equal(bbr.lossLimited, false);
  assert.equal(bbr.linkBytesPerS, 50e6);
  assert.ok(bbr.handoffTailMs < cubic.handoffTailMs / 5, `${bbr.handoffTailMs}`);
  // Without loss the two predict the same.
  const clean = { ...link, lossFraction: 0 };
  assert.equal(
    estimate({ ...i, congestionControl: "bbr" }, clean).handoffTailMs,
    estimate(i, clean).handoffTailMs,
  );
});

Deno.test("estimate(): captured layers released more slowly than the loss-limited rate keep the measured rate", () => {
  // 160 MiB of recurrent state released over the last chunk: over 2048 tokens at 4000 tokens/s
  // (0.5 s) that is 335 MB/s, over the loss-limited 6.3 MB/s, so the link backs up; at 20
  // tokens/s (102 s) it is 1.6 MB/s, and each layer leaves after an idle gap at the measured rate.
  const link = { bandwidthBytesPerS: 50e6, rttMs: 10, ageMs: 1, lossFraction: 0.001 };
  const busy = estimate(input({ link, snapshotDuringLastChunk: true }), link);
  assert.equal(busy.lossLimited, true);
  assert.ok(busy.linkBytesPerS < 7e6, `${busy.linkBytesPerS}`);
  const slow = input({ link, snapshotDuringLastChunk: true, prefillerPrefillTokensPerS: 20 });
  const idle = estimate(slow, link);
  assert.equal(idle.lossLimited, false);
  assert.equal(idle.linkBytesPerS, 50e6);
  // Without capture the snapshot leaves at once, after prefill: the link is busy.
  assert.equal(estimate(input({ link, prefillerPrefillTokensPerS: 20 }), link).lossLimited, true);
});

Deno.test("estimate(): a prefix-cache hit shortens prefill and streams the cached pages at once", () => {
  const cold = estimate(input(), input().link!);
  const warm = estimate(input({ prefillerCachedTokens: 16_384 }), input().link!);
  assert.ok(Math.abs(warm.prefillerPrefillMs - cold.prefillerPrefillMs / 2) < 1e-6);
  assert.equal(warm.kvBytes, cold.kvBytes);
});

Deno.test("estimate() with layer capture keeps the last layer's send time on the tail", () => {
  // lab-state at 512 tokens: 40 layers of 4.3 MB behind a 1 Gbit/s link, a 7 s chunk hides all
  // but the last layer, which leaves at compute end: about 35 ms, where an even release says 0.
  const state = { kvBytesPerToken: 8192, recurrentBytes: 172_687_360 };
  const base = oneChunk(state, { bandwidthBytesPerS: 125e6, rttMs: 0.5, ageMs: 0 });
  const i = { ...base, prefillerPrefillTokensPerS: 73, snapshotDuringLastChunk: true };
  const even = estimate(i, i.link!);
  const layered = estimate({ ...i, state: { ...state, recurrentLayers: 40 } }, i.link!);
  const lastLayerMs = 172_687_360 / 40 / 125e3;
  assert.ok(even.snapshotTransferMs - (even.snapshotBytes - state.recurrentBytes) / 125e3 < 1e-6);
  assert.ok(
    Math.abs(layered.snapshotTransferMs - even.snapshotTransferMs - lastLayerMs) < 1e-6,
    `${layered.snapshotTransferMs} vs ${even.snapshotTransferMs} + ${lastLayerMs}`,
  );
  assert.throws(
    () => plan({ ...i, state: { ...state, recurrentLayers: 2.5 } }),
    /recurrentLayers 2.5/,
  );
  // Captured 20 ms before compute end, the last layer keeps only the rest of its send time.
  const lead = { ...i, state: { ...state, recurrentLayers: 40 }, costs: { captureLeadMs: 20 } };
  const early = estimate(lead, i.link!);
  assert.ok(
    Math.abs(early.snapshotTransferMs - even.snapshotTransferMs - (lastLayerMs - 20)) < 1e-6,
    `${early.snapshotTransferMs} vs ${even.snapshotTransferMs} + ${lastLayerMs} - 20`,
  );
  assert.throws(
    () => plan({ ...lead, costs: { captureLeadMs: -1 } }),
    /captureLeadMs -1/,
  );
});

/** One 512-token chunk computed in 2 s, with `state` over `link`. */
function oneChunk(state: PlanInput["state"], link: NonNullable<PlanInput["link"]>): PlanInput {
  return input({
    promptTokens: 512,
    chunkTokens: 512,
    prefillerPrefillTokensPerS: 256,
    state,
    link,
  });
}

Deno.test("estimate() hides the recurrent snapshot in the last chunk's compute with layer capture", () => {
  // 10 MiB recurrent, 12.5 MB/s: 0.84 s after prefill without capture; a 2 s last chunk hides it.
  const base = oneChunk(
    { kvBytesPerToken: 512, recurrentBytes: 10 * MIB },
    { bandwidthBytesPerS: 12.5e6, rttMs: 2, ageMs: 0 },
  );
  const after = estimate(base, base.link!);
  const during = estimate({ ...base, snapshotDuringLastChunk: true }, base.link!);
  assert.ok(after.snapshotTransferMs > 800, `${after.snapshotTransferMs}`);
  assert.ok(during.snapshotTransferMs < 5, `${during.snapshotTransferMs}`);
  assert.ok(during.handoffTailMs < after.handoffTailMs - 800);
});

Deno.test("estimate() with layer capture on a hybrid sends the last page before prefill ends: no page import after", () => {
  // 2 s last chunk of 512 tokens x 8 KiB, 10 MiB recurrent, 1 GB/s: everything is hidden.
  const base = oneChunk(
    { kvBytesPerToken: 8192, recurrentBytes: 10 * MIB },
    { bandwidthBytesPerS: 1e9, rttMs: 1, ageMs: 0 },
  );
  const after = estimate(base, base.link!);
  const during = estimate(
    { ...base, snapshotDuringLastChunk: true, lastPageDuringLastChunk: true },
    base.link!,
  );
  const rate = DEFAULT_PLAN_OPTIONS.importBytesPerS / 1000;
  assert.ok(Math.abs(after.importMs - (after.snapshotBytes + 512 * 8192) / rate) < 1e-9);
  assert.ok(Math.abs(during.importMs - during.snapshotBytes / rate) < 1e-9);
  assert.equal(during.uncoveredKvMs, 0);
  assert.ok(after.uncoveredKvMs > 4, `${after.uncoveredKvMs}`); // 4 MiB at 1 GB/s after the end
});

Deno.test("estimate() takes the decoder's measured import cost over the default rate", () => {
  const i = input({ promptTokens: 4096 });
  const byDefault = estimate(i, i.link!);
  const hidden = estimate({ ...i, costs: { importMsPerMiB: 0 } }, i.link!);
  const slow = estimate({ ...i, costs: { importMsPerMiB: 2 } }, i.link!);
  const mib = (byDefault.snapshotBytes + 2048 * 8192) / MIB;
  assert.equal(hidden.importMs, 0);
  assert.ok(Math.abs(slow.importMs - 2 * mib) < 1e-6, `${slow.importMs} vs ${2 * mib}`);
  assert.ok(byDefault.importMs > 0 && byDefault.importMs < slow.importMs);
});

Deno.test("estimate() waits for the later of the link and the prefiller's own post-prefill work", () => {
  const i = input({ promptTokens: 4096, snapshotDuringLastChunk: true });
  const base = estimate(i, i.link!);
  const linkMs = base.uncoveredKvMs + base.snapshotTransferMs;
  const slowSender = estimate({ ...i, costs: { prefillerPostMs: linkMs + 300 } }, i.link!);
  assert.ok(Math.abs(slowSender.handoffTailMs - (base.handoffTailMs + 300)) < 1e-6);
  assert.ok(Math.abs(slowSender.manifestWaitMs! - 300) < 1e-6);
  const hidden = estimate({ ...i, costs: { prefillerPostMs: linkMs / 2 } }, i.link!);
  assert.equal(hidden.handoffTailMs, base.handoffTailMs);
  assert.equal(hidden.manifestWaitMs, 0);
});

Deno.test("estimate() adds the measured link residual to the tail", () => {
  const i = input(); // RTT 0.3 ms
  const base = estimate(i, i.link!);
  const costs = { linkResidual: { samples: [[0.2, 35], [10, 800]] as [number, number][] } };
  const withResidual = estimate({ ...i, costs }, i.link!);
  assert.equal(base.linkResidualMs, 0);
  assert.equal(withResidual.linkResidualMs, 35); // the sample at a similar RTT
  assert.ok(Math.abs(withResidual.handoffTailMs - base.handoffTailMs - 35) < 1e-9);
  // On one link, the residual of handoffs at the request's own depth, where there are any.
  const byDepth = {
    linkResidual: {
      samples: [[0.2, 35, null, 512], [0.2, 90, null, i.promptTokens]] as LinkResidualSample[],
    },
  };
  assert.equal(estimate({ ...i, costs: byDepth }, i.link!).linkResidualMs, 90);
});

Deno.test("estimate() adds the decoder's measured costs: validate beside the import, the digest wait after the probe", () => {
  const i = input({ probeMs: 40 });
  const base = estimate(i, i.link!);
  const measured = estimate({ ...i, costs: { validateMs: 1.5, probeWaitMs: 120 } }, i.link!);
  assert.equal(base.validateMs, 0);
  assert.equal(base.probeWaitMs, 0);
  assert.equal(measured.validateMs, 1.5);
  assert.equal(measured.probeWaitMs, 120);
  assert.equal(measured.importMs, base.importMs);
  // validate is in the handoff tail; the wait only in the commit tail, after the probe.
  assert.ok(Math.abs(measured.handoffTailMs - base.handoffTailMs - 1.5) < 1e-9);
  assert.ok(Math.abs(measured.commitTailMs! - (measured.handoffTailMs + 40 + 120)) < 1e-9);
  // The decoder's part, as its telemetry's commitMs measures it.
  assert.ok(Math.abs(measured.decoderCommitMs - (base.importMs + 1.5 + 40 + 120)) < 1e-9);
});

Deno.test("plan() refuses a predicted win smaller than benefitFractionMin of the recompute", () => {
  // A decoder 5% slower at prefill than the prefiller: the handoff is predicted to win by a
  // few percent, which measured rates on a loaded machine cannot tell from a tie.
  const i = input({ prefillerPrefillTokensPerS: 4000, decoderPrefillTokensPerS: 3800 });
  const e = estimate(i, i.link!);
  const win = e.benefitMs / e.colocatedMs;
  assert.ok(win > 0 && win < 0.1, `predicted win ${win}`);
  const refused = plan(i);
  assert.equal(refused.placement, "colocated");
  assert.ok(codes(refused).includes("slower-than-recompute"));
  assert.match(
    refused.reasons.find((r) => r.code === "slower-than-recompute")!.message,
    /benefitFractionMin 0\.1/,
  );
  assert.equal(plan(i, { benefitFractionMin: 0 }).placement, "disaggregated");
  // A clear win passes: the decoder at half the prefiller's rate.
  assert.equal(plan(input({ decoderPrefillTokensPerS: 2000 })).placement, "disaggregated");
});
