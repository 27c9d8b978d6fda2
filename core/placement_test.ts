import assert from "node:assert/strict";
import { emptyCertification, withCertification } from "./certification.ts";
import { LinkEstimator } from "./link_estimates.ts";
import type { NodeRates } from "./node_rates.ts";
import { type PlacementRequest, placeRequest, planInputFor } from "./placement.ts";

const MIB = 1024 * 1024;
const BUILD = "b1234+abc";
const CERT = withCertification(emptyCertification(), {
  family: "hybrid",
  llamaBuild: BUILD,
  gate: "state-handoff",
  cases: 4,
  promptTokens: [1024, 8192],
  certifiedAt: "2026-12-01T00:00:00Z",
});

function rates(nodeId: string, prefillTps: number): NodeRates {
  return {
    nodeId,
    source: "measured",
    prefill: [{ contextTokens: 0, tokensPerS: prefillTps }, {
      contextTokens: 32768,
      tokensPerS: prefillTps * 0.8,
    }],
    decode: [{ contextTokens: 0, tokensPerS: 40 }],
  };
}

function request(o: Partial<PlacementRequest> = {}): PlacementRequest {
  return {
    promptTokens: 32_768,
    prefiller: { nodeId: "p", rates: rates("p", 4000), hasRole: true },
    decoder: { nodeId: "d", rates: rates("d", 1000), hasRole: true, freeBytes: 64 * 1024 * MIB },
    schemaShared: true,
    identityMatch: true,
    family: "hybrid",
    llamaBuild: BUILD,
    state: { kvBytesPerToken: 8192, recurrentBytes: 172_687_360 },
    chunkTokens: 2048,
    ...o,
  };
}

/** A 40 Gbit/s, 0.3 ms link measured at t=1000 (pings and one bulk transfer). */
function fastLinks(): LinkEstimator {
  const links = new LinkEstimator();
  const pair = { from: "p", to: "d" };
  for (let k = 0; k < 5; k++) links.recordRtt(pair, 0.3, 1000 + k);
  links.recordTransfer(pair, 500 * MIB, (500 * MIB) / 5e6, 1000, "handoff");
  return links;
}

function codes(d: { reasons: { code: string }[] }): string[] {
  return d.reasons.map((r) => r.code);
}

const ctx = (links = fastLinks(), certification = CERT) => ({ links, nowMs: 2000, certification });

Deno.test("placeRequest() disaggregates a long prompt over a fresh fast link and predicts TTFT and tail", () => {
  const d = placeRequest(request(), ctx());
  assert.equal(d.placement, "disaggregated", JSON.stringify(d.reasons));
  assert.deepEqual(codes(d), ["chosen"]);
  const p = d.prediction!;
  assert.ok(p.ttftDisaggregatedMs < p.ttftColocatedMs);
  // The tail includes the probe step (one decode step at 40 tokens/s).
  assert.ok(p.commitTailMs >= 25 && p.commitTailMs < 200, `${p.commitTailMs}`);
  assert.equal(d.rateSources.prefiller, "measured");
});

Deno.test("placeRequest() refuses a peer without capabilities (no prefill role, no schema)", () => {
  const d = placeRequest(
    request({
      prefiller: { nodeId: "p", rates: rates("p", 4000), hasRole: false },
      schemaShared: false,
    }),
    ctx(),
  );
  assert.equal(d.placement, "colocated");
  assert.equal(codes(d).filter((c) => c === "capability-missing").length, 2);
});

Deno.test("placeRequest() refuses an identity mismatch", () => {
  const d = placeRequest(request({ identityMatch: false }), ctx());
  assert.equal(d.placement, "colocated");
  assert.ok(codes(d).includes("identity-mismatch"));
});

Deno.test("placeRequest() refuses an uncertified family, another build, and a missing file", () => {
  for (
    const [r, cert] of [
      [request({ family: "dense" }), CERT],
      [request({ llamaBuild: "b9999+def" }), CERT],
      [request(), null],
    ] as const
  ) {
    const d = placeRequest(r, ctx(fastLinks(), cert as typeof CERT));
    assert.equal(d.placement, "colocated");
    assert.ok(codes(d).includes("not-certified"), JSON.stringify(codes(d)));
  }
});

Deno.test("placeRequest() refuses a stale measurement and one never taken", () => {
  const stale = placeRequest(request(), { ...ctx(), nowMs: 1000 + 45_000 });
  assert.equal(stale.placement, "colocated");
  assert.ok(codes(stale).includes("link-stale"), JSON.stringify(codes(stale)));
  const none = placeRequest(request(), ctx(new LinkEstimator()));
  assert.ok(codes(none).includes("no-link-measurement"));
  assert.equal(none.placement, "colocated");
});

Deno.test("placeRequest() refuses a short prompt", () => {
  const d = placeRequest(request({ promptTokens: 512 }), ctx());
  assert.equal(d.placement, "colocated");
  assert.ok(codes(d).includes("prompt-too-short"));
});

Deno.test("placeRequest() refuses a slow link (100 Mbit/s) on rate and on economics", () => {
  const links = new LinkEstimator();
  const pair = { from: "p", to: "d" };
  links.recordRtt(pair, 0.3, 1000);
  links.recordTransfer(pair, 64 * MIB, (64 * MIB) / 12_500, 1000, "probe");
  // The decoder recomputes 32K tokens in ~18 s; the state alone needs ~35 s at 12.5 MB/s.
  const r = request({
    decoder: { nodeId: "d", rates: rates("d", 2000), hasRole: true, freeBytes: 1e12 },
  });
  const d = placeRequest(r, ctx(links));
  assert.equal(d.placement, "colocated");
  assert.ok(codes(d).includes("link-too-slow"));
  assert.ok(codes(d).includes("slower-than-recompute"));
});

Deno.test("placeRequest() refuses a lossy link (lost pings)", () => {
  const links = fastLinks();
  const pair = { from: "p", to: "d" };
  for (let k = 0; k < 44; k++) links.recordRtt(pair, 0.3, 1500 + k);
  links.recordPingLost(pair, 1600);
  const d = placeRequest(request(), ctx(links));
  assert.equal(d.placement, "colocated");
  assert.match(d.reasons.find((r) => r.code === "link-lossy")!.message, /2\.00% of pings/);
});

Deno.test("placeRequest() refuses a link whose loss probe lost 0.11% of its datagrams, though no ping was lost", () => {
  const links = fastLinks(); // five answered pings
  const pair = { from: "p", to: "d" };
  assert.equal(placeRequest(request(), ctx(links)).placement, "disaggregated");
  links.recordLossProbe(pair, 10_000, 11, 1500); // measured through the relay at 0.1% loss
  const d = placeRequest(request(), ctx(links));
  assert.equal(d.placement, "colocated");
  assert.match(
    d.reasons.find((r) => r.code === "link-lossy")!.message,
    /0\.11% of the loss probe's datagrams, over lossFractionMax 0\.05%/,
  );
  // A clean probe: the same link is accepted again.
  const clean = fastLinks();
  clean.recordLossProbe(pair, 10_000, 0, 1500);
  assert.equal(placeRequest(request(), ctx(clean)).placement, "disaggregated");
});

Deno.test("placeRequest() refuses a degraded link for new requests", () => {
  const links = fastLinks();
  links.recordTransfer({ from: "p", to: "d" }, 500 * MIB, (500 * MIB) / 1e6, 1500, "handoff");
  const d = placeRequest(request(), ctx(links));
  assert.equal(d.placement, "colocated");
  assert.ok(codes(d).includes("link-degraded"));
});

Deno.test("placeRequest() refuses a decoder without room and a node without rates", () => {
  const full = placeRequest(
    request({
      decoder: { nodeId: "d", rates: rates("d", 1000), hasRole: true, freeBytes: 100 * MIB },
    }),
    ctx(),
  );
  assert.ok(codes(full).includes("decoder-memory"));
  const noRates = placeRequest(
    request({ decoder: { nodeId: "d", rates: null, hasRole: true, freeBytes: 1e12 } }),
    ctx(),
  );
  assert.equal(noRates.placement, "colocated");
  assert.deepEqual(codes(noRates), ["no-node-rates", "chosen"]);
});

Deno.test("a handoff record carries the prediction beside the measured tail", async () => {
  const { formatTelemetry } = await import("./telemetry.ts");
  const { deriveTelemetry } = await import("./telemetry.ts");
  const d = placeRequest(request(), ctx());
  const t = {
    ...deriveTelemetry({ prefiller: [], decoder: [] }),
    prediction: { placement: d.placement, ...d.prediction! },
  };
  assert.match(formatTelemetry(t), /predicted tail \d/);
});

Deno.test("placeRequest() predicts with the pair's measured costs: probe, import, first-token overhead", () => {
  const plain = placeRequest(request(), ctx());
  const measured = placeRequest(
    request({
      snapshotDuringLastChunk: true,
      costs: { samples: 4, probes: [[32_768, 300]], importMsPerMiB: 0, firstTokenOverheadMs: 25 },
    }),
    ctx(),
  );
  const p = plain.estimates!, m = measured.estimates!;
  assert.equal(m.probeMs, 300); // the measured probe, not the decode rate's 25 ms step
  assert.equal(p.probeMs, 25);
  assert.equal(m.importMs, 0);
  assert.ok(
    m.snapshotTransferMs < p.snapshotTransferMs,
    "recurrent state sent during the last chunk",
  );
  assert.equal(
    measured.prediction!.ttftDisaggregatedMs,
    plain.prediction!.ttftDisaggregatedMs + 25,
  );
  assert.equal(measured.prediction!.commitTailMs, m.handoffTailMs + 300);
});

Deno.test("placeRequest() carries a pair's probes to a deeper prompt by the decoder's depth curve", () => {
  // The decoder's step: 25 ms at depth 0, 50 ms at 32K (twice the attention work).
  const decode = [{ contextTokens: 0, tokensPerS: 40 }, { contextTokens: 32_768, tokensPerS: 20 }];
  const decoder = { ...request().decoder, rates: { ...rates("d", 1000), decode } };
  const at = (promptTokens: number, probes: [number, number][]) =>
    placeRequest(request({ promptTokens, decoder, costs: { samples: 2, probes } }), ctx())
      .estimates!.probeMs!;
  // Served only 2K prompts (probes 60 and 64 ms, the step there 26.56 ms): a 32K prompt's probe
  // is theirs plus the step's growth to 32K (23.44 ms), not 62.
  const step2k = 1000 / 40 + (2048 / 32_768) * (50 - 25);
  assert.ok(Math.abs(at(32_768, [[2048, 60], [2048, 64]]) - (62 + 50 - step2k)) < 1e-9);
  // At the depth it served, the pair's own median.
  assert.equal(at(2048, [[2048, 60], [2048, 64]]), 62);
  // Probes at both depths: each prompt reads its own.
  assert.equal(at(32_768, [[2048, 60], [32_768, 110], [32_768, 120]]), 115);
});

Deno.test("placeRequest() passes every measured cost term to the plan: capture lead, probe wait, validate", () => {
  // A 5 Gbit/s link keeps up with the 0.5 s last chunk but for the last 4.3 MB layer (6.9 ms).
  const links = new LinkEstimator();
  const pair = { from: "p", to: "d" };
  for (let k = 0; k < 5; k++) links.recordRtt(pair, 0.3, 1000 + k);
  links.recordTransfer(pair, 100 * MIB, (100 * MIB) / 625e3, 1000, "handoff");
  const base = request({
    snapshotDuringLastChunk: true,
    lastPageDuringLastChunk: true,
    state: { kvBytesPerToken: 8192, recurrentBytes: 172_687_360, recurrentLayers: 40 },
  });
  const without = placeRequest({ ...base, costs: { samples: 4 } }, ctx(links)).estimates!;
  const withCosts = placeRequest(
    { ...base, costs: { samples: 4, captureLeadMs: 5, probeWaitMs: 7, validateMs: 2 } },
    ctx(links),
  ).estimates!;
  // The last layer leaves 5 ms before compute end: 5 ms less of it on the tail.
  assert.ok(
    Math.abs(without.snapshotTransferMs - withCosts.snapshotTransferMs - 5) < 1e-6,
    `${without.snapshotTransferMs} vs ${withCosts.snapshotTransferMs}`,
  );
  assert.equal(withCosts.probeWaitMs, 7);
  assert.equal(without.probeWaitMs, 0);
  assert.equal(withCosts.validateMs, 2);
  assert.equal(without.validateMs, 0);
});

Deno.test("planInputFor() gives the last chunk its own rate where deeper tokens are slower", () => {
  const input = planInputFor(request({ promptTokens: 8192 }), null, CERT);
  // 4000 tokens/s at depth 0 falling to 3200 at 32768: the last 2048 tokens run below the average.
  assert.ok(input.prefillerLastChunkTokensPerS! < input.prefillerPrefillTokensPerS);
  assert.ok(input.prefillerLastChunkTokensPerS! > 3200);
  const cachedAll = planInputFor(
    request({ promptTokens: 8192, prefillerCachedTokens: 8192 }),
    null,
    CERT,
  );
  assert.equal(cachedAll.prefillerLastChunkTokensPerS, undefined);
});
