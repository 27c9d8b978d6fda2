/**
 * The continuation probe in both tables: the digest inline in the manifest, or following it in
 * its own ProbeDigest message so the prefiller's probe decode is off the manifest's path. In
 * every order the decoder commits only once its own digest equals the prefiller's.
 */
import assert from "node:assert/strict";
import { Harness, PARAMS, PREFILLER_PROBE, testManifest } from "./_handoff_harness.ts";
import { completeStream } from "./_test_fixtures.ts";
import { newBindingKey } from "./binding.ts";
import { type HandoffEvent, Phase } from "./handoff.ts";
import { canGenerate, createDecoder, type DecoderState, decoderStep } from "./handoff_decoder.ts";
import { createPrefiller, prefillerStep } from "./handoff_prefiller.ts";

const ID = PARAMS.handoffId;
const OTHER = "cd".repeat(32);
const STREAM = completeStream("hybrid", 2048);
const m = { handoffId: ID, attempt: 0 };

function decoderAt(
  manifestProbe: { logitsSha256: string | null } | undefined,
  parity?: "bitwise" | "not-claimed",
) {
  const manifest = testManifest(STREAM, 2048, manifestProbe);
  let d = createDecoder();
  const events: HandoffEvent[] = [
    { ...m, type: "ReserveRequest" } as HandoffEvent,
    {
      type: "Reserved",
      creditBytes: 1 << 30,
      bindingKey: newBindingKey(),
      ...(parity ? { parity } : {}),
    },
    { ...m, type: "FinalManifest", manifest },
  ];
  for (const e of events) d = decoderStep(d, e).state;
  return d;
}

function feed(d: DecoderState, events: HandoffEvent[]) {
  const actions: string[] = [];
  for (const e of events) {
    const r = decoderStep(d, e);
    assert.equal(r.rejected, undefined, `${e.type}: ${r.rejected?.message}`);
    d = r.state;
    actions.push(...r.actions.map((a) => (a.type === "send" ? `send ${a.msg.type}` : a.type)));
  }
  return { d, actions };
}

const digest = (logitsSha256: string): HandoffEvent => ({
  ...m,
  type: "ProbeDigest",
  logitsSha256,
  tag: OTHER,
});
const own = (logitsSha256: string): HandoffEvent => ({ type: "ProbeDone", logitsSha256 });
const toProbe: HandoffEvent[] = [{ type: "Verified" }, { type: "Imported" }];

Deno.test("a following probe digest: the manifest leaves first, the digest after it, and the handoff commits", () => {
  const h = new Harness();
  h.runHandoff(2048, "follows");
  assert.equal(h.d.phase, Phase.Committed);
  assert.equal(h.p.phase, Phase.Released);
  const sent = h.trace.filter((t) => t.role === "prefiller").flatMap((t) => t.actions);
  const manifest = sent.indexOf("send FinalManifest");
  assert.ok(manifest >= 0 && sent.indexOf("send ProbeDigest") > manifest);
  assert.equal(sent.filter((a) => a === "send ProbeDigest").length, 1);
  assert.equal(h.trace.some((t) => t.rejected), false);
});

Deno.test("the decoder's probe done before the digest arrives waits, then commits on a matching digest", () => {
  const waiting = feed(decoderAt({ logitsSha256: null }), [...toProbe, own(PREFILLER_PROBE)]);
  assert.equal(waiting.d.phase, Phase.Probing);
  assert.equal(canGenerate(waiting.d), false);
  assert.ok(!waiting.actions.includes("allow-generate"));
  const done = feed(waiting.d, [digest(PREFILLER_PROBE)]);
  assert.equal(done.d.phase, Phase.Committed);
  assert.deepEqual(done.actions, ["send CommitAck", "allow-generate"]);
});

Deno.test("a digest arriving before the decoder's own probe is held; the probe result commits", () => {
  const early = feed(decoderAt({ logitsSha256: null }), [digest(PREFILLER_PROBE), ...toProbe]);
  assert.equal(early.d.phase, Phase.Probing);
  assert.equal(early.d.peerProbe, PREFILLER_PROBE);
  const done = feed(early.d, [own(PREFILLER_PROBE)]);
  assert.deepEqual(done.actions, ["send CommitAck", "allow-generate"]);
});

Deno.test("differing digests fail the probe in either order and never allow generation", () => {
  for (
    const order of [[own(OTHER), digest(PREFILLER_PROBE)], [digest(PREFILLER_PROBE), own(OTHER)]]
  ) {
    const r = feed(decoderAt({ logitsSha256: null }), [...toProbe, ...order]);
    assert.equal(r.d.phase, Phase.Failed);
    assert.deepEqual(r.d.outcome, { reason: "probe-failed" });
    assert.deepEqual(r.actions.slice(-2), ["send AbortNotice", "release"]);
    assert.ok(!r.actions.includes("allow-generate"));
  }
  // Inline digests are compared by the table too.
  const inline = feed(decoderAt({ logitsSha256: PREFILLER_PROBE }), [...toProbe, own(OTHER)]);
  assert.deepEqual(inline.d.outcome, { reason: "probe-failed" });
  // Through both tables: the prefiller falls back to recompute.
  const h = new Harness();
  h.probeDigest = OTHER;
  h.runHandoff(2048, "follows");
  assert.deepEqual(h.p.outcome, { reason: "probe-failed", disposition: "fallback" });
  assert.equal(h.actionsOf("decoder", "allow-generate").length, 0);
});

Deno.test("a digest that never comes leaves the decoder uncommitted until its reservation expires", () => {
  const timing = { ...createDecoder().timing, reservationMs: 1_000 };
  let d = decoderAt({ logitsSha256: null });
  d = { ...d, timing };
  d = feed(d, [...toProbe, own(PREFILLER_PROBE)]).d;
  const r = feed(d, [{ type: "Tick", elapsedMs: 1_001 }]);
  assert.deepEqual(r.d.outcome, { reason: "reservation-expired" });
  assert.equal(canGenerate(r.d), false);
});

Deno.test("a probe digest the manifest did not announce, a second one, or one before the manifest is a protocol error", () => {
  const cases: [string, DecoderState, HandoffEvent[]][] = [
    ["inline manifest", decoderAt({ logitsSha256: PREFILLER_PROBE }), [digest(PREFILLER_PROBE)]],
    ["no probe", decoderAt(undefined), [digest(PREFILLER_PROBE)]],
    ["second", decoderAt({ logitsSha256: null }), [
      digest(PREFILLER_PROBE),
      digest(PREFILLER_PROBE),
    ]],
  ];
  let early = createDecoder();
  early = decoderStep(early, { ...m, type: "ReserveRequest" } as HandoffEvent).state;
  early = decoderStep(early, { type: "Reserved", creditBytes: 1, bindingKey: newBindingKey() })
    .state;
  cases.push(["before the manifest", early, [digest(PREFILLER_PROBE)]]);
  for (const [label, start, events] of cases) {
    let d = start;
    let last;
    for (const e of events) {
      last = decoderStep(d, e);
      d = last.state;
    }
    assert.ok(last!.rejected, label);
    assert.deepEqual(d.outcome, { reason: "protocol-error" }, label);
  }
});

Deno.test("a retry re-sends the probe digest under the new attempt", () => {
  const h = new Harness();
  let first = true;
  // Attempt 0's import stays pending until the digest has gone out, then fails (transient).
  h.answer = (a) => (a.type === "import" && first ? null : undefined);
  h.runHandoff(2048, "follows");
  assert.equal(h.d.phase, Phase.Importing);
  first = false;
  h.local.push({ role: "decoder", event: { type: "ImportFailed", reason: "import-failed" } });
  h.pump();
  assert.equal(h.d.phase, Phase.Committed);
  assert.equal(h.d.attempt, 1);
  const digests = h.actions.filter((a) =>
    a.role === "prefiller" && a.action.type === "send" && a.action.msg.type === "ProbeDigest"
  );
  assert.deepEqual(digests.map((a) => a.action.type === "send" && a.action.msg.attempt), [0, 1]);
});

Deno.test("the probe decode failing after the manifest left falls back and tells the decoder", () => {
  let s = createPrefiller(PARAMS);
  s = prefillerStep(s, { type: "Start" }).state;
  s = prefillerStep(s, {
    ...m,
    type: "ReserveAccepted",
    creditBytes: 1 << 30,
    bindingKey: newBindingKey(),
  }).state;
  const manifest = testManifest(STREAM, 2048, { logitsSha256: null });
  s = prefillerStep(s, { type: "ExportDone", manifest }).state;
  assert.equal(s.phase, Phase.Validating);
  const r = prefillerStep(s, { type: "ExportFailed" });
  assert.deepEqual(r.state.outcome, { reason: "export-failed", disposition: "fallback" });
  assert.ok(r.actions.some((a) => a.type === "send" && a.msg.type === "AbortNotice"));
  assert.ok(r.actions.some((a) => a.type === "erase-retained"));
  // A malformed digest is refused.
  const bad = prefillerStep(s, { type: "ProbeReady", logitsSha256: "x", tag: OTHER });
  assert.ok(bad.rejected);
});

Deno.test("the commit wait counts from the probe digest; a probe that never ends still times out from the manifest", () => {
  const timing = { ...createPrefiller(PARAMS).timing, commitTimeoutMs: 1_000, leaseMs: 5_000 };
  let s = createPrefiller(PARAMS, timing);
  s = prefillerStep(s, { type: "Start" }).state;
  s = prefillerStep(s, {
    ...m,
    type: "ReserveAccepted",
    creditBytes: 1 << 30,
    bindingKey: newBindingKey(),
  }).state;
  const manifest = testManifest(STREAM, 2048, { logitsSha256: null });
  s = prefillerStep(s, { type: "ExportDone", manifest }).state;
  // The prefiller's own probe takes 900 ms; the decoder then has the full commit wait.
  s = prefillerStep(s, { type: "Tick", elapsedMs: 900 }).state;
  s = prefillerStep(s, { type: "ProbeReady", logitsSha256: PREFILLER_PROBE, tag: OTHER }).state;
  s = prefillerStep(s, { type: "Tick", elapsedMs: 900 }).state;
  assert.equal(s.phase, Phase.Validating);
  const late = prefillerStep(s, { type: "Tick", elapsedMs: 200 });
  assert.deepEqual(late.state.outcome, { reason: "commit-timeout", disposition: "fail" });
  // A probe that never finishes: the commit wait, running since the manifest left, ends it.
  let hung = createPrefiller(PARAMS, timing);
  hung = prefillerStep(hung, { type: "Start" }).state;
  hung = prefillerStep(hung, {
    ...m,
    type: "ReserveAccepted",
    creditBytes: 1 << 30,
    bindingKey: newBindingKey(),
  }).state;
  hung = prefillerStep(hung, { type: "ExportDone", manifest }).state;
  const timedOut = prefillerStep(hung, { type: "Tick", elapsedMs: 1_001 });
  assert.deepEqual(timedOut.state.outcome, { reason: "commit-timeout", disposition: "fail" });
});

Deno.test("where bitwise parity is not claimed, the decoder commits on its own probe and ignores the digest", () => {
  // Another device of the same backend may round differently: the handoff was accepted on the
  // must-match fields, so differing digests must not fail it, and nothing waits for the digest.
  const follows = feed(decoderAt({ logitsSha256: null }, "not-claimed"), [...toProbe, own(OTHER)]);
  assert.equal(follows.d.phase, Phase.Committed);
  assert.deepEqual(follows.actions.slice(-2), ["send CommitAck", "allow-generate"]);
  const late = feed(follows.d, [digest(PREFILLER_PROBE)]); // arrives after the commit
  assert.equal(late.d.phase, Phase.Committed);
  assert.deepEqual(late.actions, []);
  assert.match(
    decoderStep(late.d, digest(PREFILLER_PROBE)).rejected?.message ?? "",
    /after commit/,
  );
  const inline = feed(decoderAt({ logitsSha256: PREFILLER_PROBE }, "not-claimed"), [
    ...toProbe,
    own(OTHER),
  ]);
  assert.equal(inline.d.phase, Phase.Committed);
  // Claimed parity (explicit or absent) still compares, and a digest after commit is refused.
  for (const parity of ["bitwise", undefined] as const) {
    const r = feed(decoderAt({ logitsSha256: PREFILLER_PROBE }, parity), [...toProbe, own(OTHER)]);
    assert.deepEqual(r.d.outcome, { reason: "probe-failed" });
  }
  const claimed = feed(decoderAt({ logitsSha256: PREFILLER_PROBE }, "bitwise"), [
    ...toProbe,
    own(PREFILLER_PROBE),
  ]);
  assert.ok(decoderStep(claimed.d, digest(PREFILLER_PROBE)).rejected);
});

Deno.test("a reservation result with an unknown parity verdict is a protocol error", () => {
  let d = createDecoder();
  d = decoderStep(d, { ...m, type: "ReserveRequest" } as HandoffEvent).state;
  const r = decoderStep(d, {
    type: "Reserved",
    creditBytes: 1,
    bindingKey: newBindingKey(),
    parity: "maybe",
  } as unknown as HandoffEvent);
  assert.deepEqual(r.state.outcome, { reason: "protocol-error" });
  assert.ok(!r.actions.some((a) => a.type === "send" && a.msg.type === "ReserveAccepted"));
});
