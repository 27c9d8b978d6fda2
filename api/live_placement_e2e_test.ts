/**
 * `auto` placement over live facts, in process, against a real local cluster (the tiny hybrid
 * model): the decision and its reason reach the response's `skippy.placement_reason`, and the
 * handoff record carries the prediction beside the measurement.
 */
import assert from "node:assert/strict";
import { emptyCertification, withCertification } from "../core/certification.ts";
import { RUNTIME_DEFAULTS } from "../serve/engine.ts";
import { startLocalCluster } from "../serve/local_cluster.ts";
import { testModel } from "../testing/models.ts";
import { LivePlacement } from "./live_placement.ts";
import { startClusterApi } from "./_test_server.ts";
import type { ApiServer } from "./server.ts";
/** One completion of `sentences` sentences through the API; its `skippy` fields. */
async function completeVia(server: ApiServer, sentences: number, maxTokens: number) {
  const r = await fetch(`${server.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      model: server.model.id,
      prompt: "the quick brown fox jumps over the lazy dog and ".repeat(sentences),
      max_tokens: maxTokens,
      temperature: 0,
    }),
  });
  assert.equal(r.status, 200);
  return (await r.json()).skippy as Record<string, string>;
}

/** The newest request record (`/v1/handoffs`). */
async function lastRecordOf(server: ApiServer) {
  const body = await (await fetch(`${server.url}/v1/handoffs?limit=1`)).json();
  return (body.data ?? body.handoffs ?? body)[0];
}

Deno.test("auto placement: the live decision reaches skippy.placement_reason and the record carries its prediction", async () => {
  const modelPath = await testModel("hybrid");
  // The prefill worker probes its link after a committed handoff, as `serve` does by default: the
  // tiny model's state leaves during its prefill (layer capture), so no handoff gives a rate.
  const cluster = await startLocalCluster({
    args: ["--model", modelPath, "--link-probe-age-ms", "20000"],
  });
  // Certify what the decode worker announces (family and llama.cpp build), as --certify would.
  const id = (await cluster.client.links.get(cluster.decode.peer)).peerCapabilities
    .numericalIdentity as Record<string, string>;
  // The hybrid prefill worker opened its layer capture and says so; placement reads it.
  const prefillCaps = (await cluster.client.links.get(cluster.prefill.peer)).peerCapabilities;
  assert.equal(prefillCaps.layerCapture, true);
  const certification = withCertification(emptyCertification(), {
    family: id.family as "hybrid",
    llamaBuild: id.llamaBuild,
    gate: "state-handoff",
    cases: 1,
    promptTokens: [16],
    certifiedAt: "",
  });
  const one = (tps: number) => [{ contextTokens: 0, tokensPerS: tps }];
  const live = new LivePlacement({
    localNodeId: cluster.client.identity.nodeId,
    certification,
    certificationSource: "test certification",
    calibration: [
      { nodeId: "prefill", source: "calibration", prefill: one(1e6), decode: one(100) },
      { nodeId: "decode", source: "calibration", prefill: one(10), decode: one(100) },
    ],
    pingIntervalMs: 1_000,
    chunkTokens: RUNTIME_DEFAULTS.chunkTokens,
    promptTokensMin: 1,
  });
  const server = await startClusterApi(cluster, modelPath, {
    placement: "auto",
    keys: null,
    live,
  });
  let requests = 0;
  const complete = () => (requests++, completeVia(server, 8, 4));
  const lastRecord = () => lastRecordOf(server);
  try {
    // Before any handoff: the link is unknown, so the no-link rule disaggregates (named).
    const first = await complete();
    assert.equal(first.placement, "disaggregated");
    assert.match(first.placement_reason, /^no link measurement yet.*no-link rule/);
    const unmeasured = (await lastRecord()).handoff;
    assert.equal(unmeasured.prediction, null);
    assert.equal(unmeasured.bandwidthBytesPerS, null, "no link facts before a measurement");
    // The coordinator's RTT to the decode worker (its pings) stands in for the pair's RTT; the
    // prefill worker's bandwidth probe, reported with a later outcome, is the rate the planner
    // reads (waited for by event, each try one more request, never by a deadline).
    live.monitor.estimator.recordRtt(
      { from: cluster.client.identity.nodeId, to: cluster.decode.peer.nodeId },
      0.2,
      performance.now(),
    );
    let planned = await complete();
    for (let k = 0; k < 400 && !planned.placement_reason.startsWith("planner:"); k++) {
      await new Promise((r) => setTimeout(r, 100));
      planned = await complete();
    }
    assert.match(
      planned.placement_reason,
      /^planner: .*estimated from 1 bandwidth probes of the prefill worker \(no handoff sample yet\)/,
    );
    // Whichever way the costs go (a loopback handoff of a tiny state is latency-bound), the
    // record holds the planner's prediction for the placement it chose.
    const record = await lastRecord();
    assert.equal(record.plannedPlacement, planned.planned_placement);
    assert.equal(record.handoff.prediction.placement, planned.planned_placement);
    assert.ok(record.handoff.prediction.ttftDisaggregatedMs > 0);
    assert.ok(record.handoff.ttftMs > 0, "the measurement sits beside it");
    // The link facts placement used: the pair's estimate (bandwidth from the handoffs' own
    // transfers, RTT from the coordinator's pings to the decode worker).
    assert.ok(record.handoff.bandwidthBytesPerS > 0);
    assert.ok(record.handoff.rttMs > 0);
    // The decode worker's path travels from its GenerateDone into the record and the metrics.
    assert.match(record.handoff.decodePath, /^(batched|per-session)$/);
    const metrics = await (await fetch(`${server.url}/metrics`)).text();
    assert.match(
      metrics,
      new RegExp(
        `skippy:decode_path_requests_total\\{path="${record.handoff.decodePath}"\\} ${requests}`,
      ),
    );
  } finally {
    live.close();
    await server.close();
    await cluster.stop();
  }
});

Deno.test("a link's loss: the prefill worker's datagram probe reaches the handoff record and the coordinator's placement", async () => {
  const modelPath = await testModel("hybrid");
  // The prefill worker measures its link as `serve` does by default (a local cluster turns it off).
  const cluster = await startLocalCluster({
    args: ["--model", modelPath, "--link-probe-age-ms", "20000"],
  });
  const live = new LivePlacement({
    localNodeId: cluster.client.identity.nodeId,
    certification: null,
    certificationSource: "none",
    calibration: null,
    pingIntervalMs: 1_000,
    chunkTokens: RUNTIME_DEFAULTS.chunkTokens,
  });
  // Every request hands off, so every outcome can carry the prefill worker's newest probe.
  const server = await startClusterApi(cluster, modelPath, {
    placement: "disaggregated",
    keys: null,
    live,
  });
  const complete = async () => {
    await completeVia(server, 1, 2);
    return await lastRecordOf(server);
  };
  try {
    const first = await complete();
    assert.equal(first.placement, "disaggregated");
    assert.equal(first.linkLoss, null, "no probe before the first committed handoff");
    // The probe runs in the background after that handoff (pings, 8 MiB, 10,000 datagrams):
    // waited for by event, each try one more handoff, never by a deadline.
    let record = first;
    for (let k = 0; k < 400 && record.linkLoss === null; k++) {
      await new Promise((r) => setTimeout(r, 100));
      record = await complete();
    }
    const loss = record.linkLoss;
    assert.equal(loss.sent, 10_000);
    assert.ok(loss.received <= loss.sent && loss.lossEvents <= loss.sent - loss.received);
    assert.match(
      cluster.prefill.log.join("\n"),
      /link to decode worker \S+: [\d.]+ MB\/s, RTT [\d.]+ ms, \d+ of 10000 datagrams lost/,
    );
    // The next outcome repeats the same probe (the next runs 20 s later at the earliest).
    const again = await complete();
    assert.equal(again.linkLoss?.probe, loss.probe);
    // The coordinator recorded it once, as the pair's loss (what `auto` placement reads).
    const e = live.pairs.estimate(
      { from: cluster.prefill.peer.nodeId, to: cluster.decode.peer.nodeId },
      performance.now(),
    )!;
    assert.equal(e.lossSource, "datagrams");
    assert.equal(e.lossSamples, 10_000);
    assert.equal(e.lossFraction, loss.lossEvents / 10_000);
    // With it, the bandwidth probe sent before it: the pair's rate while no handoff gives one
    // (the tiny model's state leaves during its prefill).
    const b = loss.bandwidthProbe;
    assert.ok(b.bytes > 0 && b.receiveMs > 0, JSON.stringify(b));
    assert.equal(e.bandwidthSource, "probe");
    assert.ok(Math.abs(e.bandwidthBytesPerS! - (b.bytes / b.receiveMs) * 1000) < 1);
    // And /metrics shows it per pair, each probe counted once.
    const metrics = await (await fetch(`${server.url}/metrics`)).text();
    const labels =
      `prefill="${cluster.prefill.peer.nodeId}",decode="${cluster.decode.peer.nodeId}"`;
    assert.ok(
      metrics.includes(`skippy:link_loss_fraction{${labels}} ${loss.lossEvents / 10_000}`),
      metrics,
    );
    assert.ok(metrics.includes(`skippy:link_loss_probe_datagrams_total{${labels}} 10000`));
  } finally {
    live.close();
    await server.close();
    await cluster.stop();
  }
});
