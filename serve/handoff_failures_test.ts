/**
 * Issue #4, transfer faults on real QUIC between two workers in this process (a prefill and a
 * decode worker, tiny hybrid model): connection closed before CommitAck, cancellation during
 * transfer, a duplicated frame, a corrupted frame, malformed and oversized control frames.
 * Each case ends in a defined outcome (retry, recompute on the decoder, or a clear error),
 * never generates from partial state, and leaves both workers holding nothing (their counters
 * return to zero). Outcomes are asserted by reason and counters; the only time bounds are on
 * protocol reactions and derive from configured timers (see _failure_harness.ts).
 */
import assert from "node:assert/strict";
import { HandoffAbortedError, PeerError } from "../core/mod.ts";
import { testModel } from "../testing/models.ts";
import {
  CloseCode,
  type FaultPlan,
  type PeerConnection,
  type RawConnection,
  withFaults,
} from "../transport/mod.ts";
import {
  assertWithin,
  COMMITTED_IDLE_MS,
  HANG_MS,
  makeNodes,
  promptOf,
  REFUSAL_BOUND_MS,
  RELEASE_BOUND_MS,
  RUNTIME,
  SAMPLING,
  SCHEDULING_SLACK_MS,
  startInProcess,
  type TestWorker,
  timed,
  waitForIdle,
  waitForStats,
  withTimeout,
} from "./_failure_harness.ts";
import { connectWith } from "./_fake_prefiller.ts";
import { type HandoffRequest, type HandoffResult, runHandoff } from "./coordinator.ts";
import type { Node } from "./node.ts";
import { CONTROL_FRAME_LIMITS } from "./messages.ts";

const PROMPT = promptOf(50); // about 1,150 tokens: 18 KV pages of 64 tokens
/** The cancel cases slow the handoff stream: each write is held this long (a timer). */
const SLOW_WRITE_MS = 200;
/** KV-page frames the prompt makes at the least (writes on the handoff stream). */
const PAGE_FRAMES_MIN = Math.floor(1_100 / RUNTIME.chunkTokens);
/**
 * Acting on a cancel must beat the rest of the slowed transfer: once a page is staged, at
 * least PAGE_FRAMES_MIN - 2 writes of SLOW_WRITE_MS remain, and no machine makes them shorter.
 * Within this bound, the cancel was acted on at once, not when the transfer ended. (Freeing
 * waits for the few writes already in flight, about 3 x SLOW_WRITE_MS: the bound scales with
 * the same timer, so a slower machine does not eat into it.)
 */
const CANCEL_BOUND_MS = (PAGE_FRAMES_MIN - 2) * SLOW_WRITE_MS;

type Wrap = (raw: RawConnection, index: number) => RawConnection;

/** Applies `plan` to the next connection only (a retry's fresh connection is clean). */
function onNextConnection(plan: FaultPlan): Wrap {
  let used = false;
  return (raw) => {
    if (used) return raw;
    used = true;
    return withFaults(raw, plan);
  };
}

/** Applies `plan` to connections until a connection drop fired once. */
function untilDropped(plan: FaultPlan, times = 1): Wrap {
  let fired = 0;
  return (raw) =>
    fired >= times ? raw : withFaults(raw, plan, {
      dropConnection: () => {
        fired++;
        raw.close(CloseCode.faultInjected, "fault: connection dropped");
      },
    });
}

interface Setup {
  client: Node;
  prefill: TestWorker;
  decode: TestWorker;
  faults: { connect: Wrap | null; accept: Wrap | null };
  run(over?: Partial<HandoffRequest>): Promise<HandoffResult>;
}

async function setup(dir: string, nodes: Map<string, Node>): Promise<Setup> {
  const model = await testModel("hybrid");
  const faults: Setup["faults"] = { connect: null, accept: null };
  const decode = await startInProcess("decode", "decode", `${dir}/decode`, model, {
    faults: { accept: (raw, i) => faults.accept?.(raw, i) ?? raw },
  });
  const prefill = await startInProcess("prefill", "prefill", `${dir}/prefill`, model, {
    faults: { connect: (raw, i) => faults.connect?.(raw, i) ?? raw },
  });
  const client = nodes.get("client")!;
  const run = (over: Partial<HandoffRequest> = {}) =>
    runHandoff(client, {
      prefill: prefill.peer,
      decode: decode.peer,
      prompt: PROMPT,
      generateTokens: 8,
      sampling: SAMPLING,
      tenantId: "tenant-a",
      probe: false,
      timeoutMs: HANG_MS,
      ...over,
    });
  return { client, prefill, decode, faults, run };
}

async function bothIdle(s: Setup): Promise<void> {
  await waitForIdle(s.prefill, RELEASE_BOUND_MS);
  await waitForIdle(s.decode, RELEASE_BOUND_MS);
}

/** Sends a PrefillRequest by hand (the prompt is the frame payload). */
async function sendPrefillRequest(conn: PeerConnection, s: Setup, handoffId: string) {
  await conn.send({
    type: "PrefillRequest",
    handoffId,
    tenantId: "tenant-a",
    prompt: null,
    generateTokens: 8,
    sampling: SAMPLING,
    decode: s.decode.peer,
    probe: false,
  }, new TextEncoder().encode(PROMPT));
}

type Step = (s: Setup, baseline: HandoffResult) => Promise<void>;

const STEPS: Record<string, Step> = {
  "connection closed before CommitAck: the retry supersedes the unacked commit": async (
    s,
    baseline,
  ) => {
    s.faults.accept = untilDropped({
      streamIndex: 0,
      dropConnectionBeforeFrameType: "CommitAck",
    });
    const before = await s.decode.stats();
    const r = await timed(() => s.run());
    assert.ifError(r.error);
    assert.equal(r.value!.placement, "disaggregated");
    assert.deepEqual(r.value!.telemetry.retryReasons, ["connection-lost"]);
    assert.deepEqual(r.value!.tokens, baseline.tokens);
    const after = await s.decode.stats();
    assert.equal(after.commitsTotal - before.commitsTotal, 2); // unacked, then retried
    await bothIdle(s);
  },

  "connection closed after the last chunk, before the manifest: retry": async (s, baseline) => {
    s.faults.accept = null;
    s.faults.connect = untilDropped({
      streamIndex: 1,
      dropConnectionBeforeFrameType: "FinalManifest",
    });
    const before = await s.decode.stats();
    const r = await timed(() => s.run());
    assert.ifError(r.error);
    assert.deepEqual(r.value!.telemetry.retryReasons, ["connection-lost"]);
    assert.deepEqual(r.value!.tokens, baseline.tokens);
    // The decoder counts the cut attempt's abort when it notices the lost connection, which
    // may come after the retry committed: wait for the count, then check it.
    await waitForStats(s.decode, (x) => x.abortsTotal > before.abortsTotal, HANG_MS, "the abort");
    const after = await s.decode.stats();
    assert.equal(after.commitsTotal - before.commitsTotal, 1); // the cut attempt never committed
    assert.equal(after.abortsTotal - before.abortsTotal, 1);
    await bothIdle(s);
  },

  "connection closed after the manifest, before the probe digest: retry, never a commit without it":
    async (s, baseline) => {
      s.faults.accept = null;
      s.faults.connect = untilDropped({
        streamIndex: 1,
        dropConnectionBeforeFrameType: "ProbeDigest",
      });
      const before = await s.decode.stats();
      const r = await timed(() => s.run());
      assert.ifError(r.error);
      assert.deepEqual(r.value!.telemetry.retryReasons, ["connection-lost"]);
      assert.deepEqual(r.value!.tokens, baseline.tokens);
      await waitForStats(s.decode, (x) => x.abortsTotal > before.abortsTotal, HANG_MS, "the abort");
      const after = await s.decode.stats();
      // The cut attempt had its manifest (and maybe its own probe) but never the digest.
      assert.equal(after.commitsTotal - before.commitsTotal, 1);
      assert.equal(after.abortsTotal - before.abortsTotal, 1);
      await bothIdle(s);
    },

  "connection dropped mid-transfer: one retry on a fresh connection": async (s, baseline) => {
    s.faults.connect = untilDropped({ streamIndex: 1, dropConnectionAfterBytes: 100_000 });
    const before = await s.decode.stats();
    const r = await timed(() => s.run());
    s.faults.connect = null;
    assert.ifError(r.error);
    assert.deepEqual(r.value!.telemetry.retryReasons, ["connection-lost"]);
    assert.deepEqual(r.value!.tokens, baseline.tokens);
    const after = await s.decode.stats();
    assert.equal(after.commitsTotal - before.commitsTotal, 1);
    await bothIdle(s);
  },

  "CommitAck lost on every attempt: the prefill worker completes from its state, and the orphaned commit is released":
    async (s, baseline) => {
      s.faults.connect = null;
      s.faults.accept = untilDropped({
        streamIndex: 0,
        dropConnectionBeforeFrameType: "CommitAck",
      }, 99);
      const r = await timed(() => s.run());
      s.faults.accept = null;
      assert.ifError(r.error);
      assert.deepEqual(r.value!.fallbacks.map((f) => f.kind), ["completed-on-prefill"]);
      assert.match(r.value!.fallbackReason!, /decoder lost before commit/);
      assert.deepEqual(r.value!.tokens, baseline.tokens);
      await waitForIdle(s.prefill, RELEASE_BOUND_MS);
      // The decoder committed the last attempt without knowing the ack was lost: it holds
      // that session until committedIdleMs, then releases it (that timer, plus slack).
      await waitForIdle(s.decode, COMMITTED_IDLE_MS + SCHEDULING_SLACK_MS);
    },

  "cancellation by the client during transfer: a clear error at once": async (s) => {
    s.faults.connect = onNextConnection({ streamIndex: 1, delayMs: SLOW_WRITE_MS }); // slow link
    const before = await s.decode.stats();
    const controller = new AbortController();
    const running = timed(() => s.run({ signal: controller.signal }));
    await waitForStats(s.decode, (x) => x.stagedBytes > 0, HANG_MS, "pages staged");
    const cancelledAt = performance.now();
    controller.abort();
    const r = await running;
    assert.ok(
      r.error instanceof HandoffAbortedError && r.error.reason === "cancelled",
      String(r.error),
    );
    assertWithin(
      performance.now() - cancelledAt,
      CANCEL_BOUND_MS,
      "the client's error after cancel",
    );
    // Both workers act on the cancel at once, not after the rest of the transfer.
    await waitForIdle(s.prefill, CANCEL_BOUND_MS);
    await waitForIdle(s.decode, CANCEL_BOUND_MS);
    assertWithin(performance.now() - cancelledAt, CANCEL_BOUND_MS, "freeing after cancel");
    assert.equal((await s.decode.stats()).commitsTotal, before.commitsTotal);
  },

  "the client connection closes during transfer: both workers drop the handoff": async (
    s,
  ) => {
    s.faults.connect = onNextConnection({ streamIndex: 1, delayMs: SLOW_WRITE_MS });
    const before = await s.decode.stats();
    const conn = await s.client.connect(s.prefill.peer);
    await sendPrefillRequest(conn, s, crypto.randomUUID());
    await waitForStats(s.decode, (x) => x.stagedBytes > 0, HANG_MS, "pages staged");
    const closedAt = performance.now();
    await conn.close();
    await waitForIdle(s.prefill, CANCEL_BOUND_MS);
    await waitForIdle(s.decode, CANCEL_BOUND_MS);
    assertWithin(performance.now() - closedAt, CANCEL_BOUND_MS, "dropping the handoff");
    assert.equal((await s.decode.stats()).commitsTotal, before.commitsTotal);
  },

  "a duplicated frame on the handoff stream: rejected, then a clean retry": async (s, baseline) => {
    s.faults.connect = onNextConnection({ streamIndex: 1, duplicateFrameIndex: 3 });
    const r = await timed(() => s.run());
    assert.ifError(r.error);
    assert.deepEqual(r.value!.telemetry.retryReasons, ["invalid-state"]);
    assert.deepEqual(r.value!.tokens, baseline.tokens);
    await bothIdle(s);
  },

  "a corrupted frame on the handoff stream: checksum fails, then a clean retry": async (
    s,
    baseline,
  ) => {
    s.faults.connect = onNextConnection({ streamIndex: 1, corruptByteAt: 5_000 });
    const r = await timed(() => s.run());
    assert.ifError(r.error);
    assert.deepEqual(r.value!.telemetry.retryReasons, ["invalid-state"]);
    assert.deepEqual(r.value!.tokens, baseline.tokens);
    await bothIdle(s);
  },

  "a malformed control message: the client gets an error naming the field": async (s) => {
    const conn = await s.client.connect(s.prefill.peer);
    const handoffId = crypto.randomUUID();
    const r = await timed(async () => {
      const header = { type: "PrefillRequest", handoffId, tenantId: "t", generateTokens: -1 };
      await conn.send(header, new TextEncoder().encode("a prompt"));
      return await withTimeout(conn.receive(), REFUSAL_BOUND_MS, "PrefillOutcome");
    });
    await conn.close();
    const h = r.value!.header as Record<string, unknown>;
    assert.equal(h.type, "PrefillOutcome");
    assert.equal(h.outcome, "failed");
    assert.match(String(h.message), /field "generateTokens"/);
    assertWithin(r.ms, REFUSAL_BOUND_MS, "answering a malformed request");
    await bothIdle(s);
  },

  "an oversized control frame: the worker closes that connection and keeps serving": async (
    s,
    baseline,
  ) => {
    const limit = CONTROL_FRAME_LIMITS.payloadBytesMax;
    const big = { headerBytesMax: 64 * 1024, payloadBytesMax: 2 * limit };
    const conn = await connectWith(s.client, s.prefill.peer, { controlFrameLimits: big });
    const r = await timed(async () => {
      await conn.send(
        { type: "PrefillRequest", handoffId: "x" },
        new Uint8Array(limit + 1),
      );
      return await withTimeout(conn.receive(), REFUSAL_BOUND_MS, "the worker's answer");
    });
    assert.ok(r.error instanceof PeerError, String(r.error));
    assert.match(r.error.message, /payload/);
    assertWithin(r.ms, REFUSAL_BOUND_MS, "refusing an oversized frame");
    const again = await s.run();
    assert.deepEqual(again.tokens, baseline.tokens);
    await bothIdle(s);
  },
};

Deno.test({
  name:
    "handoff failures: every transfer fault ends in retry, recompute or a clear error, and frees all state",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async (t) => {
    const { dir, nodes } = await makeNodes(["prefill", "decode", "client"]);
    const s = await setup(dir, nodes);
    try {
      const baseline = await s.run();
      assert.equal(baseline.placement, "disaggregated");
      await bothIdle(s);

      for (const [name, step] of Object.entries(STEPS)) {
        // The prefill worker keeps one link per decode peer; the faults wrap a connection as
        // it opens, so each case starts the prefill worker on a fresh one.
        s.prefill.worker!.prefill!.links.dropAll("test: a fresh connection per case");
        await t.step(name, () => step(s, baseline));
      }
    } finally {
      await Promise.allSettled([s.prefill.stop(), s.decode.stop()]);
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  },
});
