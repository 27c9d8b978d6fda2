import assert from "node:assert/strict";
import { emptyCertification, withCertification } from "../core/certification.ts";
import { LinkEstimator } from "../core/link_estimates.ts";
import type { NodeRates } from "../core/node_rates.ts";
import type { Capabilities } from "../transport/mod.ts";
import { type PeerPlacementInput, placeOverPeers } from "./link_placement.ts";

const MIB = 1024 * 1024;
const IDENTITY = { family: "hybrid", llamaBuild: "v1+abc", model: "m" };
const caps = (role: "prefill" | "decode", identity: unknown = IDENTITY): Capabilities => ({
  protocolVersion: 1,
  roles: [role],
  stateSchemaVersions: [1],
  kvCodecs: ["llama-kv-cells"],
  kvDtypes: ["f16"],
  numericalIdentity: identity as Capabilities["numericalIdentity"],
});
const rates = (id: string, tps: number): NodeRates => ({
  nodeId: id,
  source: "measured",
  prefill: [{ contextTokens: 0, tokensPerS: tps }],
  decode: [{ contextTokens: 0, tokensPerS: 50 }],
});

function input(o: Partial<PeerPlacementInput> = {}): PeerPlacementInput {
  const links = new LinkEstimator();
  links.recordRtt({ from: "p", to: "d" }, 0.3, 0);
  links.recordTransfer({ from: "p", to: "d" }, 256 * MIB, 50, 0, "handoff");
  return {
    promptTokens: 16_384,
    prefill: { peerNodeId: "p", peerCapabilities: caps("prefill") },
    decode: { peerNodeId: "d", peerCapabilities: caps("decode") },
    prefillRates: rates("p", 4000),
    decodeRates: rates("d", 1000),
    decodeFreeBytes: 64 * 1024 * MIB,
    state: { kvBytesPerToken: 8192, recurrentBytes: 172_687_360 },
    chunkTokens: 2048,
    links,
    nowMs: 100,
    certification: withCertification(emptyCertification(), {
      family: "hybrid",
      llamaBuild: "v1+abc",
      gate: "state-handoff",
      cases: 1,
      promptTokens: [1024],
      certifiedAt: "",
    }),
    ...o,
  };
}

const codes = (d: { reasons: { code: string }[] }) => d.reasons.map((r) => r.code);

Deno.test("placeOverPeers() disaggregates between capable, identical, certified peers over a measured link", () => {
  const d = placeOverPeers(input());
  assert.equal(d.placement, "disaggregated", JSON.stringify(d.reasons));
  assert.ok(d.prediction!.ttftDisaggregatedMs < d.prediction!.ttftColocatedMs);
});

Deno.test("placeOverPeers() refuses a peer that announced no capabilities", () => {
  const d = placeOverPeers(input({ decode: { peerNodeId: "d", peerCapabilities: {} } }));
  assert.equal(d.placement, "colocated");
  assert.ok(codes(d).includes("capability-missing"));
  assert.ok(codes(d).includes("identity-mismatch"));
  assert.ok(codes(d).includes("not-certified"), "no identity: no family to look up");
});

Deno.test("placeOverPeers() refuses peers whose identities differ", () => {
  const d = placeOverPeers(input({
    prefill: {
      peerNodeId: "p",
      peerCapabilities: caps("prefill", { ...IDENTITY, model: "other" }),
    },
  }));
  assert.equal(d.placement, "colocated");
  assert.deepEqual(codes(d), ["identity-mismatch", "chosen"]);
});

Deno.test("placeOverPeers() refuses a pair with no link estimate", () => {
  const d = placeOverPeers(input({ links: new LinkEstimator() }));
  assert.ok(codes(d).includes("no-link-measurement"));
});

Deno.test("placeOverPeers() predicts a lossy link by the controller the prefill worker announces", () => {
  const lossy = (prefill: Capabilities) => {
    const i = input({
      prefill: { peerNodeId: "p", peerCapabilities: prefill },
      options: { lossFractionMax: 0.01 },
    });
    i.links.recordRtt({ from: "p", to: "d" }, 10, 0);
    i.links.recordLossProbe({ from: "p", to: "d" }, 10_000, 10, 0);
    return placeOverPeers(i).estimates!;
  };
  const silent = lossy(caps("prefill"));
  const cubic = lossy({ ...caps("prefill"), congestionControl: "cubic" });
  const bbr = lossy({ ...caps("prefill"), congestionControl: "bbr" });
  // Announcing nothing is Cubic: the state moves at the loss-limited rate.
  assert.equal(silent.lossLimited, true);
  assert.equal(silent.linkBytesPerS, cubic.linkBytesPerS);
  assert.equal(bbr.lossLimited, false);
  assert.ok(bbr.linkBytesPerS > 10 * cubic.linkBytesPerS, `${bbr.linkBytesPerS}`);
});
