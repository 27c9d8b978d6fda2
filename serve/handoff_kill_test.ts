/**
 * Issues #4 and #8, a worker process killed (SIGKILL) while pages stream: the survivor notices
 * through the QUIC idle timeout, frees everything it held for the handoff, and the request
 * completes on the survivor with the same tokens (the prefill worker from the state it kept,
 * or the decode worker by recompute). The victim runs as a child process (a real
 * death); the survivor runs in this process, where a slowed link makes sure the kill lands
 * mid-transfer and its counters can be read directly.
 */
import assert from "node:assert/strict";
import { testModel } from "../testing/models.ts";
import { type RawConnection, withFaults } from "../transport/mod.ts";
import {
  HANG_MS,
  hybridTrio,
  IDLE_MS,
  makeNodes,
  promptOf,
  REFUSAL_BOUND_MS,
  RELEASE_BOUND_MS,
  SAMPLING,
  SCHEDULING_SLACK_MS,
  startChild,
  startInProcess,
  type TestWorker,
  timed,
  waitForIdle,
  waitForStats,
  withTimeout,
} from "./_failure_harness.ts";
import { type HandoffRequest, runHandoff } from "./coordinator.ts";
import { Node } from "./node.ts";

const PROMPT = promptOf(50); // about 1,150 tokens: 18 KV pages
/**
 * The survivor notices a silent peer after IDLE_MS (a timer); what follows does no compute
 * but may take a retry's connect, which fails by the same idle timeout. Bound: those timers
 * plus scheduling slack, so a slow machine cannot fail it; without a working idle timeout
 * the case would end only by the request's hang watchdog. What the survivor computes after
 * (recompute, or the rest of the generation) is compute and is not bounded.
 */
const NOTICE_BOUND_MS = 2 * IDLE_MS + SCHEDULING_SLACK_MS;

function request(client: Node, prefill: TestWorker, decode: TestWorker) {
  return (over: Partial<HandoffRequest> = {}) =>
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
}

/** Slows the stream at `streamIndex` of the wrapped connections while `slow.on` is set. */
function slowLink(slow: { on: boolean }, streamIndex: number, delayMs: number) {
  return (raw: RawConnection) => slow.on ? withFaults(raw, { streamIndex, delayMs }) : raw;
}

function kill(w: TestWorker): void {
  w.child!.process.kill("SIGKILL");
}

Deno.test({
  name:
    "decode worker killed mid-transfer: the prefill worker completes the request from its state, same tokens",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const { model, dir, client } = await hybridTrio();
    const slow = { on: false };
    const decode = await startChild("decode", "decode", `${dir}/decode`, model, client);
    const prefill = await startInProcess("prefill", "prefill", `${dir}/prefill`, model, {
      faults: { connect: slowLink(slow, 1, 30) }, // the handoff stream's writes
    });
    try {
      // Seeded sampling: the prefill worker continues the sampler from the first token's draw.
      const run = request(client, prefill, decode);
      const seeded = { ...SAMPLING, temperature: 0.8, seed: 7 };
      const baseline = await run({ sampling: seeded, generateTokens: 12 });
      assert.equal(baseline.placement, "disaggregated");
      assert.deepEqual(baseline.fallbacks, []);
      slow.on = true;
      const running = timed(() => run({ sampling: seeded, generateTokens: 12 }));
      await waitForStats(decode, (s) => s.stagedBytes > 0, HANG_MS, "pages staged");
      kill(decode);
      const r = await running; // the rest of the generation is compute: not timed
      assert.ifError(r.error);
      assert.equal(r.value!.placement, "colocated");
      assert.deepEqual(r.value!.fallbacks.map((f) => f.kind), ["completed-on-prefill"]);
      assert.match(
        r.value!.fallbackReason!,
        /decoder lost before commit.*completed on the prefill worker/,
      );
      assert.equal(r.value!.completedBy.nodeId, prefill.peer.nodeId);
      assert.deepEqual(r.value!.telemetry.fallbacks, r.value!.fallbacks);
      assert.deepEqual(r.value!.tokens, baseline.tokens);
      assert.equal(r.value!.text, baseline.text);
      await waitForIdle(prefill, RELEASE_BOUND_MS); // nothing retained once it is done
    } finally {
      await client.close();
      await Promise.allSettled([prefill.stop(), decode.stop()]);
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  },
});

Deno.test({
  name:
    "prefill worker killed mid-transfer: the decoder wipes its uncommitted session and recomputes",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const { model, dir, client } = await hybridTrio();
    const slow = { on: false };
    // A small credit window whose grants come late: the prefiller can only trickle pages.
    const decode = await startInProcess("decode", "decode", `${dir}/decode`, model, {
      link: { inflightBytesMax: 256 * 1024 },
      faults: { accept: slowLink(slow, 1, 100) },
    });
    const prefill = await startChild("prefill", "prefill", `${dir}/prefill`, model, client);
    try {
      const run = request(client, prefill, decode);
      const baseline = await run();
      assert.equal(baseline.placement, "disaggregated");
      const before = await decode.stats();
      slow.on = true;
      const handoffId = crypto.randomUUID();
      const running = timed(() => run({ handoffId }));
      await waitForStats(decode, (s) => s.stagedBytes > 0, HANG_MS, "pages staged");
      kill(prefill);
      await waitForIdle(decode, NOTICE_BOUND_MS); // wiping the uncommitted session
      const r = await running; // the recompute is compute: not timed
      assert.ifError(r.error);
      assert.equal(r.value!.placement, "colocated");
      assert.match(r.value!.fallbackReason!, /prefill worker was lost/);
      assert.deepEqual(r.value!.tokens, baseline.tokens);
      const after = await decode.stats();
      assert.equal(after.commitsTotal, before.commitsTotal); // nothing partial ever committed
      assert.equal(after.abortsTotal - before.abortsTotal, 1);
      // The partial state is gone: asking to continue it is refused.
      const conn = await client.connect(decode.peer);
      await conn.send({
        type: "GenerateRequest",
        handoffId,
        tenantId: "tenant-a",
        generateTokens: 4,
        mode: "committed",
        prompt: null,
        sampling: null,
        probe: false,
      });
      const done = (await withTimeout(conn.receive(), REFUSAL_BOUND_MS, "GenerateDone"))!.header;
      await conn.close();
      assert.equal(done.ok, false);
      assert.match(String(done.message), /No committed session/);
      await waitForIdle(decode, NOTICE_BOUND_MS);
    } finally {
      await Promise.allSettled([prefill.stop(), decode.stop()]);
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  },
});

Deno.test({
  name: "prefill worker already dead when a request starts: it runs colocated, same tokens",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const model = await testModel("hybrid");
    const { dir } = await makeNodes(["prefill", "decode", "client"]);
    // A backoff longer than the test: once known dead, the prefill worker is not tried again.
    const client = await Node.open(`${dir}/client`, {
      peerLinks: { reconnectBackoffMs: HANG_MS, reconnectBackoffMsMax: HANG_MS },
    });
    const decode = await startInProcess("decode", "decode", `${dir}/decode`, model);
    const prefill = await startChild("prefill", "prefill", `${dir}/prefill`, model, client);
    try {
      const run = request(client, prefill, decode);
      const baseline = await run();
      assert.equal(baseline.placement, "disaggregated");
      kill(prefill);
      await prefill.child!.process.status;
      // The shared link to it notices the death (idle timeout) during this request, or the
      // reconnect fails: either way the request runs colocated.
      const r = await run(); // the recompute is compute: not timed
      assert.equal(r.placement, "colocated");
      assert.deepEqual(r.fallbacks.map((f) => f.kind), ["colocated-on-decoder"]);
      assert.match(r.fallbackReason!, /prefill worker (is unreachable|was lost)/);
      assert.deepEqual(r.tokens, baseline.tokens);
      // Now it is known dead: the next request does not wait for it at all.
      assert.equal(client.links.health(prefill.peer).state, "dead");
      const again = await run();
      assert.match(again.fallbackReason!, /prefill worker is unreachable .*dead since/);
      assert.deepEqual(again.tokens, baseline.tokens);
      await waitForIdle(decode, NOTICE_BOUND_MS);
    } finally {
      await client.close();
      await Promise.allSettled([prefill.stop(), decode.stop()]);
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  },
});
