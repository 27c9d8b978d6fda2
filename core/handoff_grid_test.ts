/**
 * The whole state x event grid of both roles: every pair either transitions as the table
 * says or is rejected as a protocol error; none throws; none lets the decoder generate before
 * validate + import + probe.
 */
import assert from "node:assert/strict";
import { PARAMS, testManifest } from "./_handoff_harness.ts";
import { completeStream } from "./_test_fixtures.ts";
import { newBindingKey } from "./binding.ts";
import {
  EVENT_TYPES,
  type HandoffAction,
  type HandoffEvent,
  type HandoffEventType,
  isTerminal,
  Phase,
  phaseName,
  type StepResult,
} from "./handoff.ts";
import {
  canGenerate,
  createDecoder,
  DECODER_TABLE,
  type DecoderState,
  decoderStep,
} from "./handoff_decoder.ts";
import {
  createPrefiller,
  PREFILLER_TABLE,
  type PrefillerState,
  prefillerStep,
} from "./handoff_prefiller.ts";

const ID = PARAMS.handoffId;
const STREAM = completeStream("hybrid", 1024);
const MANIFEST = testManifest(STREAM, 1024);
/** A manifest whose probe digest follows in a ProbeDigest message. */
const FOLLOWS = testManifest(STREAM, 1024, { logitsSha256: null });

/** One well-formed event of each type, addressed to attempt `attempt`. */
function sampleEvents(attempt: number): HandoffEvent[] {
  const m = { handoffId: ID, attempt };
  const byType: Record<HandoffEventType, HandoffEvent> = {
    ReserveRequest: {
      type: "ReserveRequest",
      ...m,
      tenantId: "t",
      sourceNodeId: "a",
      destNodeId: "b",
      identityDigest: PARAMS.identityDigest,
      schemaVersion: 1,
      family: "hybrid",
      promptTokens: 1024,
      stateBytesEstimate: 1 << 20,
      contextTokensNeeded: 2048,
    },
    ReserveAccepted: {
      type: "ReserveAccepted",
      ...m,
      creditBytes: 1 << 20,
      bindingKey: newBindingKey(),
    },
    TransferCredit: { type: "TransferCredit", ...m, creditBytes: 4096 },
    StateChunk: { type: "StateChunk", ...m, header: STREAM[0] },
    FinalManifest: { type: "FinalManifest", ...m, manifest: MANIFEST },
    CommitAck: { type: "CommitAck", ...m, position: 1024 },
    AbortNotice: { type: "AbortNotice", ...m, reason: "invalid-state" },
    Start: { type: "Start" },
    ChunkReady: { type: "ChunkReady", header: STREAM[1] },
    ExportDone: { type: "ExportDone", manifest: MANIFEST },
    ExportFailed: { type: "ExportFailed" },
    Reserved: { type: "Reserved", creditBytes: 1 << 20, bindingKey: newBindingKey() },
    ReserveFailed: { type: "ReserveFailed", reason: "reserve-rejected" },
    ChunkStaged: { type: "ChunkStaged", creditBytes: 4096 },
    ChunkRejected: { type: "ChunkRejected", reason: "invalid-state" },
    Verified: { type: "Verified" },
    VerifyFailed: { type: "VerifyFailed", reason: "invalid-state" },
    Imported: { type: "Imported" },
    ImportFailed: { type: "ImportFailed", reason: "import-failed" },
    ProbeDone: { type: "ProbeDone", logitsSha256: "ab".repeat(32) },
    ProbeDigest: { type: "ProbeDigest", ...m, logitsSha256: "ab".repeat(32), tag: "cd".repeat(32) },
    ProbeReady: { type: "ProbeReady", logitsSha256: "ab".repeat(32), tag: "cd".repeat(32) },
    ProbeFailed: { type: "ProbeFailed", reason: "probe-failed" },
    SessionEnded: { type: "SessionEnded" },
    ConnectionLost: { type: "ConnectionLost" },
    Cancel: { type: "Cancel" },
    Tick: { type: "Tick", elapsedMs: 1 },
  };
  return EVENT_TYPES.map((t) => byType[t]);
}

/** Malformed and foreign events: wrong ids, wrong attempt, bad numbers, garbage. */
function hostileEvents(attempt: number): unknown[] {
  const good = sampleEvents(attempt);
  const out: unknown[] = [null, undefined, 42, "Start", {}, { type: "Nope" }, {
    type: "Tick",
    elapsedMs: -1,
  }];
  out.push({ type: "Tick", elapsedMs: NaN });
  for (const e of good) {
    out.push({ ...e, handoffId: "h-other" }, { ...e, attempt: attempt + 7 });
    out.push({ ...e, attempt: -1 }, { ...e, handoffId: 17 });
    for (const field of ["creditBytes", "bindingKey", "header", "manifest", "position", "reason"]) {
      if (!(field in e)) continue;
      out.push({ ...e, [field]: field === "bindingKey" ? new Uint8Array(3) : -1 }, {
        ...e,
        [field]: {},
      });
    }
  }
  return out;
}

function drivePrefiller(events: HandoffEvent[]): PrefillerState {
  let s = createPrefiller(PARAMS);
  for (const e of events) s = prefillerStep(s, e).state;
  return s;
}

function driveDecoder(events: HandoffEvent[]): DecoderState {
  let s = createDecoder();
  for (const e of events) s = decoderStep(s, e).state;
  return s;
}

function prefillerStates(): PrefillerState[] {
  const e = Object.fromEntries(sampleEvents(0).map((x) => [x.type, x])) as Record<
    HandoffEventType,
    HandoffEvent
  >;
  const pendingChunk: HandoffEvent = {
    type: "ChunkReady",
    header: { ...STREAM[1], payloadBytes: 1 << 30 },
  };
  return [
    drivePrefiller([]),
    drivePrefiller([e.Start]),
    drivePrefiller([e.Start, e.ChunkReady, e.ExportDone]),
    drivePrefiller([e.Start, e.ReserveAccepted]),
    drivePrefiller([e.Start, e.ReserveAccepted, pendingChunk]),
    drivePrefiller([e.Start, e.ReserveAccepted, e.ExportDone]),
    drivePrefiller([e.Start, e.ReserveAccepted, e.ExportDone, e.CommitAck]),
    drivePrefiller([e.Start, e.ReserveAccepted, pendingChunk, e.ExportDone, e.ProbeReady]),
    drivePrefiller([e.Start, e.ReserveAccepted, e.ExportDone, e.ProbeReady]),
    drivePrefiller([e.Start, e.Cancel]),
  ];
}

function decoderStates(): DecoderState[] {
  const e = Object.fromEntries(sampleEvents(0).map((x) => [x.type, x])) as Record<
    HandoffEventType,
    HandoffEvent
  >;
  const toStreaming = [e.ReserveRequest, e.Reserved];
  const toValidating = [...toStreaming, e.FinalManifest];
  const follows: HandoffEvent = { ...e.FinalManifest, manifest: FOLLOWS } as HandoffEvent;
  return [
    driveDecoder([]),
    driveDecoder([e.ReserveRequest]),
    driveDecoder(toStreaming),
    driveDecoder([...toStreaming, e.StateChunk]),
    driveDecoder([...toStreaming, e.StateChunk, e.FinalManifest]),
    driveDecoder(toValidating),
    driveDecoder([...toValidating, e.Verified]),
    driveDecoder([...toValidating, e.Verified, e.Imported]),
    driveDecoder([...toValidating, e.Verified, e.Imported, e.ProbeDone]),
    driveDecoder([...toValidating, e.Verified, e.Imported, e.ProbeDone, e.SessionEnded]),
    driveDecoder([e.ReserveRequest, e.ReserveFailed]),
    // The probe digest follows the manifest: before, during and after the decoder's probe.
    driveDecoder([...toStreaming, e.StateChunk, follows]),
    driveDecoder([...toStreaming, follows]),
    driveDecoder([...toStreaming, follows, e.ProbeDigest]),
    driveDecoder([...toStreaming, follows, e.Verified, e.Imported]),
    driveDecoder([...toStreaming, follows, e.Verified, e.Imported, e.ProbeDone]),
  ];
}

function checkCommon<S extends { phase: Phase }>(
  before: S,
  e: unknown,
  r: StepResult<S>,
  label: string,
) {
  assert.ok(Object.values(Phase).includes(r.state.phase), label);
  if (r.rejected) {
    const unchanged = r.state === before && r.actions.length === 0;
    const failedClosed = r.state.phase === Phase.Failed &&
      r.actions.some((a) =>
        a.type === "send" && a.msg.type === "AbortNotice" && a.msg.reason === "protocol-error"
      );
    assert.ok(
      unchanged || failedClosed,
      `${label}: a rejection must leave the state alone or fail closed`,
    );
  }
  if (r.rejected && (before.phase === Phase.Idle || before.phase === Phase.Committed)) {
    assert.equal(r.state, before, `${label}: Idle and Committed only reject`);
  }
  if (isTerminal(before.phase)) {
    assert.equal(r.state, before, `${label}: terminal phases never change`);
    assert.deepEqual(r.actions, [], label);
  }
  void e;
}

function assertNoEarlyGenerate(
  before: DecoderState,
  e: unknown,
  r: StepResult<DecoderState>,
  label: string,
) {
  const allow = r.actions.findIndex((a) => a.type === "allow-generate");
  if (allow >= 0) {
    assert.equal(before.phase, Phase.Probing, label);
    const type = (e as HandoffEvent).type;
    // The decoder's own probe result, or the prefiller's digest arriving after it.
    assert.ok(
      type === "ProbeDone" || (type === "ProbeDigest" && before.ownProbe !== null),
      `${label}: commits only on a probe result`,
    );
    const ack = r.actions.findIndex((a: HandoffAction) =>
      a.type === "send" && a.msg.type === "CommitAck"
    );
    assert.ok(ack >= 0 && ack < allow, `${label}: CommitAck goes out before generation starts`);
  }
  if (canGenerate(r.state)) {
    assert.ok(
      before.phase === Phase.Committed || allow >= 0,
      `${label}: reached Committed without the probe`,
    );
  }
}

Deno.test("prefiller: every state x event pair transitions per the table or is rejected, never throws", () => {
  let pairs = 0;
  for (const s of prefillerStates()) {
    for (const e of [...sampleEvents(s.attempt), ...hostileEvents(s.attempt)]) {
      const label = `prefiller ${phaseName(s.phase)} + ${
        JSON.stringify((e as { type?: string })?.type)
      }`;
      const r = prefillerStep(s, e as HandoffEvent);
      checkCommon(s, e, r, label);
      const type = (e as { type?: string } | null)?.type as HandoffEventType;
      const listed = type === "Tick" || PREFILLER_TABLE[phaseName(s.phase)]?.[type] !== undefined;
      if (!listed) assert.ok(r.rejected, `${label}: unlisted pairs are protocol errors`);
      assert.ok(!r.actions.some((a) => a.type === "allow-generate"), label);
      if (!isTerminal(s.phase) && isTerminal(r.state.phase)) {
        const types = r.actions.map((a) => a.type);
        assert.ok(
          types.includes("erase-retained") && types.includes("release"),
          `${label}: retained state is erased`,
        );
      }
      pairs++;
    }
  }
  assert.ok(pairs > 500, `${pairs} pairs`);
});

Deno.test("decoder: every state x event pair transitions per the table or is rejected, never throws", () => {
  for (const s of decoderStates()) {
    for (const e of [...sampleEvents(s.attempt), ...hostileEvents(s.attempt)]) {
      const label = `decoder ${phaseName(s.phase)} + ${
        JSON.stringify((e as { type?: string })?.type)
      }`;
      const r = decoderStep(s, e as HandoffEvent);
      checkCommon(s, e, r, label);
      assertNoEarlyGenerate(s, e, r, label);
      const type = (e as { type?: string } | null)?.type as HandoffEventType;
      const listed = type === "Tick" || DECODER_TABLE[phaseName(s.phase)]?.[type] !== undefined;
      if (!listed) assert.ok(r.rejected, `${label}: unlisted pairs are protocol errors`);
      if (s.phase === Phase.Committed && r.rejected) {
        assert.equal(r.state, s, `${label}: a live session is not disturbed`);
      }
    }
  }
});

Deno.test("well-formed listed pairs are accepted in every representative state", () => {
  for (const s of decoderStates()) {
    for (const e of sampleEvents(s.attempt)) {
      const handler = DECODER_TABLE[phaseName(s.phase)]?.[e.type];
      if (!handler) continue;
      const r = decoderStep(s, e);
      // Context rules the table cannot express: a stage result needs a stage in flight, a
      // chunk or manifest cannot follow the manifest.
      const contextual = (e.type === "ChunkStaged" && s.stagesInFlight === 0) ||
        ((e.type === "StateChunk" || e.type === "FinalManifest") && s.manifest !== null) ||
        (e.type === "ProbeDigest" &&
          (s.manifest?.probe?.logitsSha256 !== null || s.peerProbe !== null)) ||
        (e.type === "ProbeDone" && s.ownProbe !== null);
      assert.equal(
        r.rejected !== undefined,
        contextual,
        `decoder ${phaseName(s.phase)} + ${e.type}`,
      );
    }
  }
  for (const s of prefillerStates()) {
    for (const e of sampleEvents(s.attempt)) {
      if (!PREFILLER_TABLE[phaseName(s.phase)]?.[e.type]) continue;
      const r = prefillerStep(s, e);
      const contextual = (e.type === "ChunkReady" && s.pending !== null) ||
        (e.type === "ExportDone" && s.manifest !== null) ||
        (e.type === "ProbeReady" && (s.probe !== null || s.probeSent));
      assert.equal(
        r.rejected !== undefined,
        contextual,
        `prefiller ${phaseName(s.phase)} + ${e.type}`,
      );
    }
  }
});

function prng(seed: number): () => number {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

Deno.test("random event sequences never let the decoder generate before verify, import and probe", () => {
  const random = prng(20261130);
  const events = sampleEvents(0);
  // Bias towards the happy path so that many walks get deep.
  const happy = [
    "ReserveRequest",
    "Reserved",
    "StateChunk",
    "ChunkStaged",
    "FinalManifest",
    "Verified",
    "Imported",
    "ProbeDone",
  ];
  let committed = 0;
  for (let walk = 0; walk < 3000; walk++) {
    let s = createDecoder();
    const seen: string[] = [];
    for (let i = 0; i < 24; i++) {
      const e = random() < 0.6
        ? events.find((x) =>
          x.type === happy[Math.min(seen.filter((t) => happy.includes(t)).length, happy.length - 1)]
        )!
        : events[Math.floor(random() * events.length)];
      const r = decoderStep(s, e);
      if (!r.rejected) seen.push(e.type);
      if (canGenerate(r.state) && !canGenerate(s)) {
        committed++;
        const order = [
          "ReserveRequest",
          "Reserved",
          "FinalManifest",
          "Verified",
          "Imported",
          "ProbeDone",
        ].map((t) => seen.indexOf(t));
        assert.ok(order.every((x, k) => x >= 0 && (k === 0 || x > order[k - 1])), seen.join(" > "));
      }
      s = r.state;
    }
  }
  assert.ok(committed > 10, `only ${committed} walks committed`);
});

Deno.test("random walks mixing hostile events never throw in either role", () => {
  const random = prng(7);
  const pool = [...sampleEvents(0), ...hostileEvents(0), ...sampleEvents(1)] as HandoffEvent[];
  for (let walk = 0; walk < 2000; walk++) {
    let d = createDecoder();
    let p = createPrefiller(PARAMS);
    for (let i = 0; i < 20; i++) {
      const e = pool[Math.floor(random() * pool.length)];
      const rd = decoderStep(d, e);
      assertNoEarlyGenerate(d, e, rd, `walk ${walk} step ${i}`);
      d = rd.state;
      p = prefillerStep(p, e).state;
    }
  }
});
