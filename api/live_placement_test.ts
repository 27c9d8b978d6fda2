import assert from "node:assert/strict";
import { emptyCertification, withCertification } from "../core/certification.ts";
import type { HandoffTelemetry } from "../core/telemetry.ts";
import type { HandoffResult } from "../serve/coordinator.ts";
import type { PeerLink } from "../serve/peer_links.ts";
import type { Capabilities } from "../transport/mod.ts";
import { LivePlacement, type LivePlacementOptions } from "./live_placement.ts";

// Protocol fakes: a PeerLink is only read for its node id, capabilities and ping support.
const IDENTITY = { family: "hybrid", llamaBuild: "v1+abc", model: "m" };
const caps = (role: "prefill" | "decode"): Capabilities => ({
  protocolVersion: 1,
  roles: [role],
  stateSchemaVersions: [1],
  kvCodecs: ["llama-kv-cells"],
  kvDtypes: ["f16"],
  numericalIdentity: IDENTITY as Capabilities["numericalIdentity"],
});
const fakeLink = (id: string, role: "prefill" | "decode") =>
  ({
    peerNodeId: id,
    peerCapabilities: caps(role),
    conn: { supportsLinkProbe: false },
  }) as unknown as PeerLink;
const CERT = withCertification(emptyCertification(), {
  family: "hybrid",
  llamaBuild: "v1+abc",
  gate: "state-handoff",
  cases: 1,
  promptTokens: [1024],
  certifiedAt: "",
});
const MIB = 1024 * 1024;

function live(o: Partial<LivePlacementOptions> = {}): LivePlacement {
  return new LivePlacement({
    localNodeId: "coord",
    certification: CERT,
    certificationSource: "cert.json",
    calibration: null,
    pingIntervalMs: 1000,
    chunkTokens: 512,
    ...o,
  });
}
const input = (promptTokens = 16_384) => ({
  promptTokens,
  state: { kvBytesPerToken: 8192, recurrentBytes: 1 << 20 },
  family: "hybrid",
  hasPrefillWorker: true,
  prefill: fakeLink("p", "prefill"),
  decode: fakeLink("d", "decode"),
});
/** A completed request as runHandoff reports it (only the fields placement learns from). */
function result(placement: "disaggregated" | "colocated", t: Partial<HandoffTelemetry>) {
  return {
    placement,
    fallbacks: [],
    completedBy: { nodeId: "d", role: "decode" },
    promptTokens: 16_384,
    tokens: [1, 2, 3],
    // The client's first token: the prefiller's prefill plus its trip when handed off; the
    // decoder's own prefill (queue included) when colocated.
    ttftMs: placement === "disaggregated" ? (t.prefillMs ?? 0) + 10 : 4000,
    telemetry: { promptTokens: 16_384, ...t },
  } as unknown as HandoffResult;
}
const handoff = {
  prefillMs: 1000,
  probeMs: 20,
  tpotMs: 20,
  totalBytes: 256 * MIB,
  wireMs: 100,
  uncoveredTailMs: 150,
  commitMs: 10,
  stagedBeforePrefillEndFraction: 0,
  overlapFraction: 0,
};

Deno.test("LivePlacement: an uncertified family is never disaggregated automatically", () => {
  const d = live({ certification: null, certificationSource: "no certification file" })
    .decide(input());
  assert.equal(d.placement, "colocated");
  assert.match(d.reason, /not certified.*never disaggregated automatically/);
});

Deno.test("LivePlacement: without rates or a link sample, the no-link rule decides, named", () => {
  const p = live();
  const first = p.decide(input());
  assert.equal(first.placement, "disaggregated");
  assert.match(first.reason, /no node rates yet for prefill p and decode d.*no-link rule/);
  assert.equal(first.prediction, null);
  // Rates learned (a handoff for the prefiller, a colocated run for the decoder), no RTT yet:
  // the handoff's transfer is no link sample without the RTT it needs.
  p.record(result("disaggregated", handoff), "p", "d");
  p.record(result("colocated", { tpotMs: 20 }), null, "d");
  const second = p.decide(input());
  assert.match(second.reason, /no link measurement yet.*no-link rule/);
  const short = p.decide(input(100));
  assert.equal(short.placement, "colocated");
  assert.match(short.reason, /no link measurement yet.*promptTokensMin/);
});

Deno.test("LivePlacement: a handoff's own transfer feeds the planner, which predicts", () => {
  const p = live();
  p.record(result("colocated", { tpotMs: 20 }), null, "d");
  // The coordinator's own RTT to the decode worker (what its pings record).
  p.monitor.estimator.recordRtt({ from: "coord", to: "d" }, 0.3, performance.now());
  p.record(result("disaggregated", handoff), "p", "d");
  const d = p.decide(input());
  assert.match(d.reason, /^planner: .*estimated from 1 handoff transfers/);
  assert.match(d.reason, /rates: prefill measured, decode measured/);
  assert.ok(d.prediction, "a planned decision carries its prediction");
  // Prefiller 16384 tok/s, decoder ~4096 tok/s (its TTFT): disaggregating wins on TTFT.
  assert.equal(d.placement, "disaggregated");
  assert.ok(d.prediction!.ttftDisaggregatedMs < d.prediction!.ttftColocatedMs);
});

Deno.test("LivePlacement: the prefill worker's bandwidth probe stands in until a handoff gives a rate", () => {
  const p = live();
  p.record(result("colocated", { tpotMs: 20 }), null, "d");
  p.monitor.estimator.recordRtt({ from: "coord", to: "d" }, 0.3, performance.now());
  // A handoff whose state left during its prefill (layer capture): rates and RTT, no link rate.
  p.record(
    result("disaggregated", { ...handoff, totalBytes: 8 * MIB, captureLeadMs: 4 }),
    "p",
    "d",
  );
  assert.match(p.decide(input()).reason, /^no link measurement yet/);
  const probe = { bytes: 8 * MIB, receiveMs: 80 }; // ~105 MB/s
  p.recordLinkLoss({ from: "p", to: "d" }, {
    probe: 7,
    sent: 10_000,
    received: 10_000,
    lossEvents: 0,
    ageMs: 5,
    bandwidthProbe: probe,
  });
  let d = p.decide(input());
  assert.match(d.reason, /estimated from 1 bandwidth probes of the prefill worker/);
  assert.ok(d.prediction);
  // A handoff with a rate of its own (256 MiB in 100 ms of writes): it alone decides now.
  p.record(result("disaggregated", handoff), "p", "d");
  d = p.decide(input());
  assert.match(d.reason, /estimated from 1 handoff transfers, 21475 Mbit\/s/);
});

Deno.test("LivePlacement: calibration rates by role name stand for unknown node ids", () => {
  const one = (tps: number) => [{ contextTokens: 0, tokensPerS: tps }];
  const p = live({
    calibration: [
      { nodeId: "prefill", source: "calibration", prefill: one(8000), decode: one(50) },
      { nodeId: "decode", source: "calibration", prefill: one(100), decode: one(50) },
    ],
  });
  const d = p.decide(input());
  assert.match(d.reason, /^no link measurement yet/);
});

Deno.test("LivePlacement: the pair's measured tail costs and the announced layer capture reach the prediction", () => {
  // Coordinators learn the same link and rates; their pairs served handoffs that differ only
  // in the decoder's probe, and their prefill workers in whether they announce layer capture.
  const recurrent = 160 * MIB;
  const pages = 96 * MIB;
  const served = (probeMs: number) => ({
    ...handoff,
    probeMs,
    lastImportMs: 5,
    commitRoundTripMs: 2,
    uncoveredTailMs: 2,
    tailExportMs: 1,
    totalBytes: pages + recurrent,
    bytesByComponent: { "kv-page": pages, ssm: recurrent },
    stagedBeforePrefillEndFraction: pages / (pages + recurrent),
  });
  const learn = (probeMs: number, layerCapture: boolean) => {
    const p = live();
    p.record(result("colocated", { tpotMs: 20 }), null, "d");
    p.monitor.estimator.recordRtt({ from: "coord", to: "d" }, 0.3, performance.now());
    p.record(result("disaggregated", served(probeMs)), "p", "d");
    const prefill = {
      ...fakeLink("p", "prefill"),
      peerCapabilities: { ...caps("prefill"), layerCapture },
    } as unknown as PeerLink;
    return p.decide({
      ...input(),
      prefill,
      state: { kvBytesPerToken: 8192, recurrentBytes: recurrent },
    }).prediction!;
  };
  const fastProbe = learn(20, false), slowProbe = learn(900, false), captured = learn(20, true);
  // The decoder's measured probe is part of the tail.
  assert.ok(
    slowProbe.commitTailMs - fastProbe.commitTailMs > 800,
    `${slowProbe.commitTailMs} vs ${fastProbe.commitTailMs}`,
  );
  // A prefill worker announcing capture sends the recurrent state during the last chunk.
  assert.ok(
    captured.commitTailMs < fastProbe.commitTailMs,
    `${captured.commitTailMs} vs ${fastProbe.commitTailMs}`,
  );
});

Deno.test("LivePlacement: the link residual is learned against the link time predicted for that handoff", () => {
  // The same served handoff (link part 400 ms after prefill end) taught to three coordinators:
  // one that predicted 300 ms of link for it learns a residual 300 ms smaller than one that
  // predicted 0, and one without a prediction learns none (the model's own terms stand).
  const tailFor = (predictedLinkMs: number | null) => {
    const p = live();
    p.record(result("colocated", { tpotMs: 20 }), null, "d");
    p.monitor.estimator.recordRtt({ from: "coord", to: "d" }, 0.3, performance.now());
    const served = { ...handoff, uncoveredTailMs: 400, commitMs: 10, tailExportMs: 0 };
    p.record(result("disaggregated", served), "p", "d", predictedLinkMs);
    return p.decide(input()).prediction!.commitTailMs;
  };
  const none = tailFor(null), zero = tailFor(0), most = tailFor(300);
  assert.ok(Math.abs(zero - most - 300) < 1e-6, `${zero} vs ${most}`);
  assert.ok(zero - none > 300, `${zero} vs ${none}`);
});

Deno.test("LivePlacement: the prefill worker's loss probe decides the pair's loss", () => {
  const p = live();
  p.record(result("colocated", { tpotMs: 20 }), null, "d");
  p.monitor.estimator.recordRtt({ from: "coord", to: "d" }, 0.3, performance.now());
  p.record(result("disaggregated", handoff), "p", "d");
  let d = p.decide(input());
  assert.equal(d.placement, "disaggregated");
  assert.match(d.reason, /loss not probed yet/);
  // 0.11% of 10,000 datagrams lost (what the relay's 0.1% loss gave): over lossFractionMax.
  const lossy = { probe: 7, sent: 10_000, received: 9_989, lossEvents: 11, ageMs: 5 };
  p.recordLinkLoss({ from: "p", to: "d" }, lossy);
  assert.equal(p.pairs.estimate({ from: "p", to: "d" }, performance.now())!.lossSamples, 10_000);
  d = p.decide(input());
  assert.equal(d.placement, "colocated");
  assert.match(d.reason, /loses 0\.11% of the loss probe's datagrams/);
  assert.match(d.reason, /loss 0\.11% of the prefill worker's 10000 probe datagrams/);
});

Deno.test("LivePlacement: the controller the prefill worker reports with its loss probe sets the lossy link's rate", () => {
  const linkMsWith = (congestionControl?: "cubic" | "bbr") => {
    const p = live();
    p.record(result("colocated", { tpotMs: 20 }), null, "d");
    p.monitor.estimator.recordRtt({ from: "coord", to: "d" }, 10, performance.now());
    p.record(result("disaggregated", handoff), "p", "d");
    const lossy = { probe: 7, sent: 10_000, received: 9_989, lossEvents: 11, ageMs: 5 };
    p.recordLinkLoss({ from: "p", to: "d" }, { ...lossy, congestionControl });
    return p.decide(input()).prediction!.linkMs;
  };
  const silent = linkMsWith(), cubic = linkMsWith("cubic"), bbr = linkMsWith("bbr");
  // Cubic (and a report without a controller) moves the state at the loss-limited rate.
  assert.equal(silent, cubic);
  assert.ok(bbr < cubic / 2, `${bbr} vs ${cubic}`);
});

Deno.test("LivePlacement: a pair's probes at one depth predict another's by the decoder's calibrated depth curve", () => {
  // The decode worker's calibrated step: 10 ms at 512 tokens, 40 ms at 32K.
  const step = (contextTokens: number, ms: number) => ({ contextTokens, tokensPerS: 1000 / ms });
  const calibration = [
    {
      nodeId: "p",
      source: "calibration" as const,
      prefill: [step(0, 0.05)],
      decode: [step(0, 10)],
    },
    {
      nodeId: "d",
      source: "calibration" as const,
      prefill: [step(0, 0.25)],
      decode: [step(512, 10), step(32_768, 40)],
    },
  ];
  // Two coordinators whose pairs served one handoff each, at 512 tokens or at 32K.
  const tailAt32k = (servedTokens: number, probeMs: number) => {
    const p = live({ calibration });
    p.monitor.estimator.recordRtt({ from: "coord", to: "d" }, 0.3, performance.now());
    p.record(
      result("disaggregated", { ...handoff, promptTokens: servedTokens, probeMs }),
      "p",
      "d",
    );
    return p.decide(input(32_768)).prediction!.commitTailMs;
  };
  // A 30 ms probe at 512 tokens predicts 60 ms at 32K (30 plus the step's 30 ms growth): the
  // same tail as a pair that measured 60 ms at 32K, and 30 ms longer than one that measured 30
  // there (one median over the depths served would have said 30 for both).
  const shallow = tailAt32k(512, 30);
  assert.ok(Math.abs(shallow - tailAt32k(32_768, 60)) < 1e-6, `${shallow}`);
  assert.ok(Math.abs(shallow - tailAt32k(32_768, 30) - 30) < 1e-6, `${shallow}`);
});
