/**
 * Issue #8, no request lost: the fallback paths that need a decode worker to die, each with a
 * real process death (a child `serve` killed by SIGKILL, at an exact step through a named
 * fault point, serve/fault_points.ts). Tokens are compared with local generation in this
 * process (same model and numerics). Compute is never timed; the one bound below is on the
 * protocol's own timers (a failed connect), as _failure_harness.ts describes.
 */
import assert from "node:assert/strict";
import { testModel } from "../testing/models.ts";
import { parsePeerCard, TrustList } from "../transport/mod.ts";
import { NoNodeLeftError, runHandoff } from "./coordinator.ts";
import { Engine, RUNTIME_DEFAULTS } from "./engine.ts";
import { FAULT_ENV } from "./fault_points.ts";
import type { SamplingSpec } from "./messages.ts";
import { Node } from "./node.ts";
import {
  assertWithin,
  HANG_MS,
  makeNodes,
  promptOf,
  RELEASE_BOUND_MS,
  RUNTIME,
  SAMPLING,
  SCHEDULING_SLACK_MS,
  startChild,
  type TestWorker,
  waitForIdle,
} from "./_failure_harness.ts";

const PROMPT = promptOf(12); // about 130 tokens: a few KV pages
const GENERATE = 40; // several token batches (up to 16 tokens each)
const CONNECT_MS = 1_000;

async function localTokens(model: string, sampling: SamplingSpec): Promise<number[]> {
  using engine = await Engine.open({ ...RUNTIME_DEFAULTS, ...RUNTIME, modelPath: model });
  const logits = await engine.prefill(engine.model.vocab.tokenize(PROMPT));
  const { seed, ...params } = sampling;
  const out: number[] = [];
  for await (const s of engine.generate(logits, GENERATE, params, { seed, draws: 0 })) {
    out.push(s.token);
  }
  return out;
}

async function setup(decodeEnv?: Record<string, string>) {
  const model = await testModel("hybrid");
  const { dir } = await makeNodes(["prefill", "decode", "client"]);
  const connects = { n: 0 };
  const client = await Node.open(
    `${dir}/client`,
    {
      peerLinks: { connectTimeoutMs: CONNECT_MS },
    },
    [],
    { connect: (raw) => (connects.n++, raw) },
  );
  const prefill = await startChild("prefill", "prefill", `${dir}/prefill`, model, client);
  const decode = await startChild("decode", "decode", `${dir}/decode`, model, client, decodeEnv);
  const run = (sampling: SamplingSpec) =>
    runHandoff(client, {
      prefill: prefill.peer,
      decode: decode.peer,
      prompt: PROMPT,
      generateTokens: GENERATE,
      sampling,
      tenantId: "tenant-a",
      probe: false,
      timeoutMs: HANG_MS,
    });
  const stop = async () => {
    await client.close();
    await Promise.allSettled([prefill.stop(), decode.stop()]);
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  };
  return { model, client, prefill, decode, run, stop, connects };
}

async function kill(w: TestWorker): Promise<void> {
  try {
    w.child!.process.kill("SIGKILL");
  } catch { /* already gone */ }
  await w.child!.process.status;
}

Deno.test({
  name: "concurrent requests share one authenticated connection per worker, each its own tokens",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const c = await setup();
    try {
      const seeded = { ...SAMPLING, temperature: 0.9, seed: 5 };
      const [greedy, sampled] = await Promise.all([c.run(SAMPLING), c.run(seeded)]);
      const again = await c.run(SAMPLING);
      for (const r of [greedy, sampled, again]) {
        assert.equal(r.placement, "disaggregated");
        assert.deepEqual(r.fallbacks, []);
      }
      assert.deepEqual(greedy.tokens, await localTokens(c.model, SAMPLING));
      assert.deepEqual(sampled.tokens, await localTokens(c.model, seeded));
      assert.deepEqual(again.tokens, greedy.tokens);
      assert.equal(c.connects.n, 2); // one per worker, for all three requests
      assert.deepEqual(c.client.links.all().map((h) => h.state), ["alive", "alive"]);
    } finally {
      await c.stop();
    }
  },
});

Deno.test({
  name:
    "decode worker killed after the commit, mid-generation: resumed on the prefill worker, the stream continues with the same tokens (seeded)",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    // The decode worker dies right after its second TokenBatch left (the client has the
    // first token and up to two batches: the kill may beat the last bytes out).
    const c = await setup({ [FAULT_ENV]: "token-batch-sent:2" });
    try {
      const seeded = { ...SAMPLING, temperature: 0.9, seed: 11 };
      const r = await c.run(seeded);
      assert.equal(r.placement, "disaggregated"); // the state moved and committed first
      assert.deepEqual(r.fallbacks.map((f) => f.kind), ["resumed"]);
      const resumed = r.fallbacks[0];
      assert.ok(resumed.tokensBefore >= 1, `resumed after ${resumed.tokensBefore} tokens`);
      assert.ok(resumed.tokensBefore < GENERATE);
      assert.equal(resumed.nodeId, c.prefill.peer.nodeId);
      assert.match(r.fallbackReason!, /decode worker was lost after the commit.*recompute/);
      assert.deepEqual(r.completedBy, { nodeId: c.prefill.peer.nodeId, role: "prefill" });
      assert.deepEqual(r.tokens, await localTokens(c.model, seeded));
      await c.decode.child!.process.status; // it really died
      await waitForIdle(c.prefill, RELEASE_BOUND_MS);
    } finally {
      await c.stop();
    }
  },
});

Deno.test({
  name: "decode worker dead before the request: the prefill worker runs it alone, same tokens",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const c = await setup();
    try {
      await kill(c.decode);
      const r = await c.run(SAMPLING); // compute: not timed
      assert.equal(r.placement, "colocated");
      assert.deepEqual(r.fallbacks.map((f) => f.kind), ["colocated-on-prefill"]);
      assert.match(r.fallbackReason!, /decode worker is unreachable/);
      assert.equal(r.completedBy.role, "prefill");
      assert.deepEqual(r.tokens, await localTokens(c.model, SAMPLING));
      await waitForIdle(c.prefill, RELEASE_BOUND_MS);
    } finally {
      await c.stop();
    }
  },
});

Deno.test({
  name:
    "both workers dead: the request fails with NoNodeLeftError naming each, within its deadline",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const c = await setup();
    try {
      await Promise.all([kill(c.prefill), kill(c.decode)]);
      const t0 = performance.now();
      const error = await c.run(SAMPLING).catch((e) => e);
      // Two connects that fail by their bound (run at once), then no candidate left.
      assertWithin(performance.now() - t0, 2 * CONNECT_MS + SCHEDULING_SLACK_MS, "the error");
      assert.ok(error instanceof NoNodeLeftError, String(error));
      assert.match(error.message, /prefill worker .*decode worker/);
      assert.equal(c.client.links.health(c.prefill.peer).state, "dead");
      assert.equal(c.client.links.health(c.decode.peer).state, "dead");
      // Known dead now: the next request fails at once (no connect), with the same clear error.
      const again = await c.run(SAMPLING).catch((e) => e);
      assert.ok(again instanceof NoNodeLeftError);
      assert.match(again.message, /dead since/);
    } finally {
      await c.stop();
    }
  },
});

Deno.test({
  name:
    "decode worker killed mid-generation with another decoder listed: resumed on that decoder, same tokens",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const c = await setup({ [FAULT_ENV]: "token-batch-sent:2" });
    const { dir } = await makeNodes(["spare"]);
    // A second decode worker, trusted by everyone: its identity joins each trust list.
    const spareDir = `${dir}/spare`;
    const spare = await startSpare(c, spareDir);
    try {
      const r = await runHandoff(c.client, {
        prefill: c.prefill.peer,
        decode: c.decode.peer,
        decodeAlternates: [spare.peer],
        prompt: PROMPT,
        generateTokens: GENERATE,
        sampling: SAMPLING,
        tenantId: "tenant-a",
        probe: false,
        timeoutMs: HANG_MS,
      });
      assert.deepEqual(r.fallbacks.map((f) => f.kind), ["resumed"]);
      assert.deepEqual(r.completedBy, { nodeId: spare.peer.nodeId, role: "decode" });
      assert.deepEqual(r.tokens, await localTokens(c.model, SAMPLING));
      await waitForIdle(spare, RELEASE_BOUND_MS);
    } finally {
      await spare.stop();
      await c.stop();
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  },
});

/** A decode worker with a fresh identity that the client trusts (and that trusts the client). */
async function startSpare(c: Awaited<ReturnType<typeof setup>>, stateDir: string) {
  const spareNode = await Node.open(stateDir);
  const card = (n: Node) =>
    parsePeerCard(JSON.stringify({
      publicKey: n.identity.publicKeyText,
      certificateSha256: n.certificate.fingerprint,
    }));
  await c.client.trust.add({ ...card(spareNode), label: "spare" });
  const spareTrust = await TrustList.load(stateDir);
  await spareTrust.add({ ...card(c.client), label: "client" });
  await spareTrust.save();
  return await startChild("spare", "decode", stateDir, c.model, c.client);
}
