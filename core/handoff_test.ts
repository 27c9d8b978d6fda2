import assert from "node:assert/strict";
import { Harness, PARAMS, testManifest } from "./_handoff_harness.ts";
import { completeStream } from "./_test_fixtures.ts";
import { newBindingKey } from "./binding.ts";
import { UsageError } from "./errors.ts";
import { leastAdvanced, Phase, resolveHandoffTiming } from "./handoff.ts";
import { canGenerate, createDecoder, decoderStep } from "./handoff_decoder.ts";
import {
  createPrefiller,
  dispositionOf,
  prefillerCanExport,
  prefillerStep,
} from "./handoff_prefiller.ts";

Deno.test("a full handoff commits: CommitAck, then the prefiller erases its retained state", () => {
  const h = new Harness();
  h.runHandoff();
  assert.equal(h.d.phase, Phase.Committed);
  assert.equal(h.p.phase, Phase.Released);
  assert.equal(canGenerate(h.d), true);
  const decoderActions = h.trace.filter((t) => t.role === "decoder").flatMap((t) => t.actions);
  const ack = decoderActions.indexOf("send CommitAck");
  assert.ok(ack >= 0 && decoderActions.indexOf("allow-generate") === ack + 1);
  assert.equal(decoderActions.filter((a) => a === "allow-generate").length, 1);
  assert.deepEqual(h.actionsOf("prefiller", "committed"), [{ type: "committed", position: 2048 }]);
  assert.equal(h.actionsOf("prefiller", "erase-retained").length, 1);
  assert.equal(h.trace.some((t) => t.rejected), false);
});

Deno.test("the decoder passes through every phase in order before it may generate", () => {
  const h = new Harness();
  const seen: Phase[] = [];
  const original = h.feedDecoder.bind(h);
  h.feedDecoder = (e) => {
    original(e);
    if (seen.at(-1) !== h.d.phase) seen.push(h.d.phase);
  };
  h.runHandoff();
  assert.deepEqual(seen, [
    Phase.Reserving,
    Phase.Streaming,
    Phase.Validating,
    Phase.Importing,
    Phase.Probing,
    Phase.Committed,
  ]);
});

Deno.test("the prefiller holds a chunk until credit arrives, then sends it", () => {
  const page = completeStream("hybrid", 2048)[0].payloadBytes;
  const h = new Harness({ creditBytes: page }); // one page of credit at a time
  h.runHandoff();
  assert.equal(h.d.phase, Phase.Committed);
  assert.ok(h.trace.some((t) => t.role === "decoder" && t.actions.includes("send TransferCredit")));
});

Deno.test("the prefiller holds the manifest until the last chunk has left", () => {
  let s = createPrefiller(PARAMS);
  s = prefillerStep(s, { type: "Start" }).state;
  const [page] = completeStream("hybrid", 512);
  s = prefillerStep(s, { type: "ChunkReady", header: page }).state; // arrives while reserving
  assert.equal(prefillerCanExport(s), false);
  const accepted = prefillerStep(s, {
    type: "ReserveAccepted",
    handoffId: PARAMS.handoffId,
    attempt: 0,
    creditBytes: 0,
    bindingKey: newBindingKey(),
  });
  s = accepted.state;
  assert.deepEqual(accepted.actions.map((a) => a.type), ["bind"]);
  const manifest = testManifest(completeStream("hybrid", 512), 512);
  const done = prefillerStep(s, { type: "ExportDone", manifest });
  assert.deepEqual(done.actions, []);
  const credit = prefillerStep(done.state, {
    type: "TransferCredit",
    handoffId: PARAMS.handoffId,
    attempt: 0,
    creditBytes: page.payloadBytes,
  });
  assert.deepEqual(credit.actions.map((a) => a.type === "send" ? a.msg.type : a.type), [
    "StateChunk",
    "FinalManifest",
  ]);
  assert.equal(credit.state.phase, Phase.Validating);
});

Deno.test("a reserve timeout retries with a fresh reservation, then errors to the client", () => {
  const h = new Harness({ timing: { reserveTimeoutMs: 100, retriesMax: 1 } });
  h.deliver = false; // the decoder is unreachable
  h.feedPrefiller({ type: "Start" });
  h.feedPrefiller({ type: "Tick", elapsedMs: 101 });
  assert.equal(h.p.phase, Phase.Reserving);
  assert.equal(h.p.attempt, 1);
  assert.deepEqual(h.trace.at(-1)!.actions, ["send AbortNotice", "retry", "send ReserveRequest"]);
  h.feedPrefiller({ type: "Tick", elapsedMs: 101 });
  assert.equal(h.p.phase, Phase.Failed);
  assert.deepEqual(h.trace.at(-1)!.actions, [
    "send AbortNotice",
    "erase-retained",
    "release",
    "fail",
  ]);
  assert.deepEqual(h.p.outcome, { reason: "reserve-timeout", disposition: "fail" });
});

Deno.test("a decoder checksum failure retries, and falls back to recompute when retries run out", () => {
  const h = new Harness({ timing: { retriesMax: 1 } });
  h.answer = (a) =>
    a.type === "verify" ? { type: "VerifyFailed", reason: "invalid-state" } : undefined;
  h.runHandoff();
  // Attempt 0 failed verification; attempt 1 re-streamed the retained state and failed too.
  assert.equal(h.actionsOf("prefiller", "retry").length, 1);
  assert.equal(h.actionsOf("decoder", "verify").length, 2);
  assert.equal(h.p.attempt, 1);
  assert.equal(h.p.phase, Phase.Failed);
  assert.deepEqual(h.p.outcome, { reason: "invalid-state", disposition: "fallback" });
  assert.deepEqual(h.actionsOf("prefiller", "fallback"), [{
    type: "fallback",
    reason: "invalid-state",
  }]);
  assert.equal(h.actionsOf("decoder", "allow-generate").length, 0);
  assert.equal(h.trace.some((t) => t.rejected), false);
});

Deno.test("a retry after a transient failure commits on the second attempt", () => {
  const h = new Harness();
  let failures = 1;
  h.answer = (a) =>
    a.type === "import" && failures-- > 0
      ? { type: "ImportFailed", reason: "import-failed" }
      : undefined;
  h.runHandoff();
  assert.equal(h.p.phase, Phase.Released);
  assert.equal(h.d.phase, Phase.Committed);
  assert.equal(h.d.attempt, 1);
  assert.deepEqual(h.actionsOf("prefiller", "committed"), [{ type: "committed", position: 2048 }]);
  assert.equal(h.actionsOf("prefiller", "bind").length, 2); // a fresh binding key per reservation
});

Deno.test("a failed probe falls back to recompute without a retry and never allows generation", () => {
  const h = new Harness();
  h.answer = (a) =>
    a.type === "probe" ? { type: "ProbeFailed", reason: "probe-failed" } : undefined;
  h.runHandoff();
  assert.equal(h.d.phase, Phase.Failed);
  assert.equal(h.p.phase, Phase.Failed);
  assert.deepEqual(h.p.outcome, { reason: "probe-failed", disposition: "fallback" });
  assert.equal(h.actionsOf("decoder", "allow-generate").length, 0);
  assert.equal(h.actionsOf("decoder", "release").length, 1);
});

Deno.test("a missing CommitAck times out: error to the client, retained state erased", () => {
  const h = new Harness({ timing: { commitTimeoutMs: 500, leaseMs: 1000 } });
  h.answer = (a) => a.type === "probe" ? null : undefined; // the probe never finishes
  h.runHandoff();
  assert.equal(h.p.phase, Phase.Validating);
  h.feedPrefiller({ type: "Tick", elapsedMs: 400 });
  assert.equal(h.p.phase, Phase.Validating);
  h.feedPrefiller({ type: "Tick", elapsedMs: 200 });
  assert.equal(h.p.phase, Phase.Failed);
  assert.deepEqual(h.p.outcome, { reason: "commit-timeout", disposition: "fail" });
  assert.deepEqual(h.trace.at(-1)!.actions, [
    "send AbortNotice",
    "erase-retained",
    "release",
    "fail",
  ]);
  h.pump(); // the AbortNotice reaches the decoder, which releases its uncommitted session
  assert.equal(h.d.phase, Phase.Failed);
  assert.equal(canGenerate(h.d), false);
});

Deno.test("the lease bounds retention across retries", () => {
  const h = new Harness({ timing: { commitTimeoutMs: 100, leaseMs: 150, retriesMax: 5 } });
  h.answer = (a) => a.type === "probe" ? null : undefined;
  h.runHandoff();
  // The decoder goes away; the retry waits for a reservation but the lease runs out first.
  h.feedPrefiller({ type: "ConnectionLost" });
  assert.equal(h.p.phase, Phase.Reserving);
  h.deliver = false;
  h.feedPrefiller({ type: "Tick", elapsedMs: 160 });
  assert.equal(h.p.phase, Phase.Failed);
  assert.deepEqual(h.p.outcome, { reason: "lease-expired", disposition: "fail" });
});

Deno.test("cancellation during transfer notifies the decoder and erases the prefiller's state", () => {
  const h = new Harness();
  h.feedPrefiller({ type: "Start" });
  h.pump();
  h.feedPrefiller({ type: "ChunkReady", header: completeStream("hybrid", 1024)[0] });
  h.pump();
  assert.equal(h.d.phase, Phase.Streaming);
  h.feedPrefiller({ type: "Cancel" });
  h.pump();
  assert.deepEqual(h.p.outcome, { reason: "cancelled", disposition: "fail" });
  assert.equal(h.d.phase, Phase.Failed);
  assert.deepEqual(h.d.outcome, { reason: "cancelled" });
});

Deno.test("messages from an earlier attempt are ignored by the prefiller", () => {
  const h = new Harness({ timing: { reserveTimeoutMs: 10 } });
  h.deliver = false;
  h.feedPrefiller({ type: "Start" });
  h.feedPrefiller({ type: "Tick", elapsedMs: 11 });
  assert.equal(h.p.attempt, 1);
  const before = h.p;
  const r = prefillerStep(h.p, {
    type: "ReserveAccepted",
    handoffId: PARAMS.handoffId,
    attempt: 0,
    creditBytes: 10,
    bindingKey: newBindingKey(),
  });
  assert.equal(r.state, before);
  assert.match(r.rejected!.message, /stray message/);
});

Deno.test("the decoder waits for in-flight stages before verifying the manifest", () => {
  let d = createDecoder();
  const id = PARAMS.handoffId;
  d = decoderStep(d, { type: "ReserveRequest", handoffId: id, attempt: 0 } as never).state;
  d = decoderStep(d, { type: "Reserved", creditBytes: 100, bindingKey: newBindingKey() }).state;
  const [page] = completeStream("hybrid", 512);
  d = decoderStep(d, { type: "StateChunk", handoffId: id, attempt: 0, header: page }).state;
  const m = decoderStep(d, {
    type: "FinalManifest",
    handoffId: id,
    attempt: 0,
    manifest: testManifest(completeStream("hybrid", 512), 512),
  });
  assert.deepEqual(m.actions, []);
  assert.equal(m.state.phase, Phase.Streaming);
  const staged = decoderStep(m.state, { type: "ChunkStaged", creditBytes: 5 });
  assert.deepEqual(staged.actions.map((a) => a.type), ["verify"]); // no credit after the manifest
  assert.equal(staged.state.phase, Phase.Validating);
});

Deno.test("a decoder reservation expires when the handoff never commits", () => {
  const h = new Harness({ timing: { reservationMs: 1000 } });
  h.answer = (a) => a.type === "verify" ? null : undefined;
  h.runHandoff();
  assert.equal(h.d.phase, Phase.Validating);
  h.feedDecoder({ type: "Tick", elapsedMs: 1001 });
  assert.equal(h.d.phase, Phase.Failed);
  assert.deepEqual(h.trace.at(-1)!.actions, ["send AbortNotice", "release"]);
  h.pump();
  assert.deepEqual(h.p.outcome, { reason: "reservation-expired", disposition: "fallback" });
});

Deno.test("a committed decoder ignores connection loss but drops the session on AbortNotice", () => {
  const h = new Harness();
  h.runHandoff();
  const committed = h.d;
  const lost = decoderStep(committed, { type: "ConnectionLost" });
  assert.equal(lost.state, committed);
  assert.deepEqual(lost.actions, []);
  const abort = decoderStep(committed, {
    type: "AbortNotice",
    handoffId: PARAMS.handoffId,
    attempt: 0,
    reason: "commit-timeout",
  });
  assert.equal(abort.state.phase, Phase.Released);
  assert.deepEqual(abort.actions.map((a) => a.type), ["stop-generate", "release"]);
  const replay = decoderStep(committed, {
    type: "StateChunk",
    handoffId: PARAMS.handoffId,
    attempt: 0,
    header: completeStream("hybrid", 512)[0],
  });
  assert.equal(replay.state, committed);
  assert.ok(replay.rejected);
});

Deno.test("dispositionOf() retries transient failures only while retries and lease remain", () => {
  const s = createPrefiller(PARAMS, resolveHandoffTiming({ retriesMax: 1 }));
  assert.equal(dispositionOf(s, "connection-lost"), "retry");
  assert.equal(dispositionOf({ ...s, attempt: 1 }, "connection-lost"), "fail");
  assert.equal(dispositionOf({ ...s, retainedMs: 1e9 }, "invalid-state"), "fallback");
  assert.equal(dispositionOf(s, "identity-mismatch"), "fallback");
  assert.equal(dispositionOf(s, "cancelled"), "fail");
  assert.equal(dispositionOf(s, "reserve-rejected"), "fail");
});

Deno.test("resolveHandoffTiming() refuses a lease shorter than the commit wait", () => {
  assert.throws(() => resolveHandoffTiming({ leaseMs: 100, commitTimeoutMs: 200 }), UsageError);
  assert.throws(() => resolveHandoffTiming({ reserveTimeoutMs: 0 }), UsageError);
  assert.equal(resolveHandoffTiming({ retriesMax: 0 }).retriesMax, 0);
});

Deno.test("leastAdvanced() is the minimum phase, Failed lowest", () => {
  assert.equal(leastAdvanced([Phase.Committed, Phase.Streaming, Phase.Released]), Phase.Streaming);
  assert.equal(leastAdvanced([Phase.Committed, Phase.Failed]), Phase.Failed);
  assert.ok(
    Phase.Failed < Phase.Reserving && Phase.Probing < Phase.Committed &&
      Phase.Committed < Phase.Released,
  );
});

Deno.test("each staged chunk renews the decoder's reservation; a stall still expires it", () => {
  const id = PARAMS.handoffId;
  let d = createDecoder(resolveHandoffTiming({ reservationMs: 1000 }));
  d = decoderStep(d, { type: "ReserveRequest", handoffId: id, attempt: 0 } as never).state;
  d = decoderStep(d, { type: "Reserved", creditBytes: 1 << 30, bindingKey: newBindingKey() }).state;
  const pages = completeStream("hybrid", 4096).filter((h) => h.kind === "kv-page");
  // A long prefill: 800 ms between pages, 6.4 s in all, far past reservationMs.
  for (const page of pages) {
    d = decoderStep(d, { type: "Tick", elapsedMs: 800 }).state;
    d = decoderStep(d, { type: "StateChunk", handoffId: id, attempt: 0, header: page }).state;
    d = decoderStep(d, { type: "ChunkStaged", creditBytes: 0 }).state;
    assert.equal(d.phase, Phase.Streaming);
  }
  // A stall: no chunk for longer than reservationMs.
  const stalled = decoderStep(d, { type: "Tick", elapsedMs: 1001 });
  assert.equal(stalled.state.phase, Phase.Failed);
  assert.equal(stalled.state.outcome?.reason, "reservation-expired");
});
