/**
 * Issue #4, what a decode worker must refuse, and whom: replayed and duplicated chunks, chunks
 * of another handoff, attempt, model or tenant, reservations and generate requests across
 * tenants, malformed and oversized handoff frames (sent by a hand-written prefiller, see
 * _fake_prefiller.ts), untrusted clients and workers, and an older peer without capabilities.
 * Every refusal is a defined outcome (asserted by its reason), comes before any protocol timer
 * could have ended the case instead (REFUSAL_BOUND_MS), and leaves nothing held. Recomputes
 * after a refusal are compute and are not timed.
 */
import assert from "node:assert/strict";
import { PeerError, type ReserveRequest } from "../core/mod.ts";
import { testModel } from "../testing/models.ts";
import {
  parsePeerCard,
  type PeerConnection,
  type TrustEntry,
  type TrustList,
} from "../transport/mod.ts";
import {
  assertWithin,
  HANG_MS,
  makeNodes,
  promptOf,
  REFUSAL_BOUND_MS,
  RELEASE_BOUND_MS,
  SAMPLING,
  startInProcess,
  type TestWorker,
  timed,
  waitForIdle,
  waitForStats,
  withTimeout,
} from "./_failure_harness.ts";
import { connectWith, FakePrefiller, positionsChunk } from "./_fake_prefiller.ts";
import { type HandoffRequest, type HandoffResult, runHandoff } from "./coordinator.ts";
import { Node } from "./node.ts";

const PROMPT = promptOf(20);
const OTHER_MODEL = "f".repeat(64);

interface Setup {
  client: Node;
  stranger: Node;
  prefill: TestWorker;
  decode: TestWorker;
  old: TestWorker;
  fake(overrides?: Parameters<typeof connectWith>[2]): Promise<FakePrefiller>;
  run(over?: Partial<HandoffRequest>): ReturnType<typeof runHandoff>;
}

async function setup(dir: string, nodes: Map<string, Node>): Promise<Setup> {
  const model = await testModel("hybrid");
  const decode = await startInProcess("decode", "decode", `${dir}/decode`, model);
  const prefill = await startInProcess("prefill", "prefill", `${dir}/prefill`, model);
  const old = await startInProcess("old", "decode", `${dir}/old`, model, {
    announceCapabilities: false,
  });
  const client = nodes.get("client")!;
  // The hand-written prefiller has its own identity, trusted as a prefill worker: the client
  // is trusted only as a coordinator, which may not reserve (serve/authorization.ts).
  const fakePrefill = nodes.get("fakeprefill")!;
  // A node that trusts the workers (it can pin them) but that no worker trusts.
  const stranger = await Node.open(`${dir}/stranger`);
  for (const w of [prefill, decode]) {
    const n = w.worker!.node;
    await stranger.trust.add(parsePeerCard(JSON.stringify({
      publicKey: n.identity.publicKeyText,
      certificateSha256: n.certificate.fingerprint,
    })));
  }
  const identityDigest = decode.worker!.identity.digest;
  const fake = async (overrides = {}) =>
    new FakePrefiller(
      await connectWith(fakePrefill, decode.peer, overrides),
      fakePrefill.identity.nodeId,
      { nodeId: decode.peer.nodeId, identityDigest },
    );
  const run = (over: Partial<HandoffRequest> = {}) =>
    runHandoff(client, {
      prefill: prefill.peer,
      decode: decode.peer,
      prompt: PROMPT,
      generateTokens: 6,
      sampling: SAMPLING,
      tenantId: "tenant-a",
      probe: false,
      timeoutMs: HANG_MS,
      ...over,
    });
  return { client, stranger, prefill, decode, old, fake, run };
}

/** Asks `conn`'s decode worker to generate for committed handoff `handoffId` as `tenantId`. */
async function generateFor(conn: PeerConnection, handoffId: string, tenantId: string) {
  await conn.send({
    type: "GenerateRequest",
    handoffId,
    tenantId,
    generateTokens: 6,
    mode: "committed",
    prompt: null,
    sampling: null,
    probe: false,
  });
  const tokens: number[] = [];
  for (;;) {
    const h = (await withTimeout(conn.receive(), HANG_MS, "GenerateDone"))!.header;
    if (h.type === "TokenBatch") tokens.push(...(h.tokens as number[]));
    if (h.type === "GenerateDone") return { ok: h.ok, message: h.message, tokens };
  }
}

/** Removes `nodeId` from `trust` for the duration of `fn`. */
async function untrusted<T>(trust: TrustList, nodeId: string, fn: () => Promise<T>): Promise<T> {
  const entry = trust.remove(nodeId) as TrustEntry;
  try {
    return await fn();
  } finally {
    const card = { publicKey: entry.publicKey, certificateSha256: entry.certificateSha256 };
    await trust.add(parsePeerCard(JSON.stringify(card)), entry.roles);
  }
}

/** What every step works with. */
interface Ctx {
  s: Setup;
  fake: FakePrefiller;
  /** The decode worker's identity digest. */
  digest: string;
  baseline: HandoffResult;
  /** Reserves, runs `send`, and returns the reason of the decoder's AbortNotice. */
  reject(
    handoffId: string,
    send: (r: ReserveRequest, key: Uint8Array) => Promise<void>,
    thenIdle?: boolean,
  ): Promise<string | undefined>;
}

const STEPS: Record<string, (c: Ctx) => Promise<void>> = {
  "control: a valid chunk is staged; the same chunk again is a replay": async (
    { s, fake, digest, reject },
  ) => {
    const reason = await reject("dup", async (r, key) => {
      const stream = await fake.openStream("dup", 0);
      const chunk = await positionsChunk("dup", digest);
      await fake.sendChunk(stream, chunk, fake.binding(r, key));
      await waitForStats(s.decode, (x) => x.stagedBytes > 0, HANG_MS, "the chunk staged");
      await fake.sendChunk(stream, chunk, fake.binding(r, key));
    });
    assert.equal(reason, "invalid-state");
  },

  "a chunk of another handoff, verbatim or relabelled: binding-tag": async (
    { s, fake, digest, reject },
  ) => {
    const other = fake.request("other", 0);
    const o = await fake.reserve(other);
    assert.ok(o.ok);
    const chunk = await positionsChunk("other", digest);
    for (const frame of [{}, { handoffId: "mine" }]) {
      const id = "mine";
      assert.equal(
        await reject(id, async () => {
          const stream = await fake.openStream(id, 0);
          await fake.sendChunk(stream, chunk, fake.binding(other, o.bindingKey), frame);
        }, false),
        "binding-tag",
      );
    }
    await fake.conn.send({
      type: "AbortNotice",
      handoffId: "other",
      attempt: 0,
      reason: "cancelled",
    });
    await waitForIdle(s.decode, RELEASE_BOUND_MS);
  },

  "a chunk replayed from an earlier attempt: binding-tag": async ({ s, fake, digest }) => {
    const r0 = fake.request("retried", 0);
    const k0 = await fake.reserve(r0);
    const r1 = fake.request("retried", 1);
    const k1 = await fake.reserve(r1); // a retry supersedes attempt 0
    assert.ok(k0.ok && k1.ok);
    const stream = await fake.openStream("retried", 1);
    const chunk = await positionsChunk("retried", digest);
    const out = await timed(async () => {
      await fake.sendChunk(stream, chunk, fake.binding(r0, k0.bindingKey), { attempt: 1 });
      return await fake.abortReason("retried", 1, REFUSAL_BOUND_MS);
    });
    assert.equal(out.value, "binding-tag");
    assertWithin(out.ms, REFUSAL_BOUND_MS, "refusing a replayed attempt");
    await waitForIdle(s.decode, RELEASE_BOUND_MS);
  },

  "another model: the reservation, or a chunk under another identity": async (
    { fake, reject },
  ) => {
    const r = fake.request("model", 0, { identityDigest: OTHER_MODEL });
    const out = await timed(() => fake.reserve(r));
    assert.deepEqual(out.value, { ok: false, reason: "identity-mismatch" });
    assertWithin(out.ms, REFUSAL_BOUND_MS, "refusing another model's reservation");
    assert.equal(
      await reject("model2", async (r2, key) => {
        const stream = await fake.openStream("model2", 0);
        const chunk = await positionsChunk("model2", OTHER_MODEL);
        await fake.sendChunk(stream, chunk, fake.binding(r2, key));
      }),
      "identity-mismatch",
    );
  },

  "another tenant's binding: binding-tag": async ({ fake, digest, reject }) => {
    assert.equal(
      await reject("tenant", async (r, key) => {
        const stream = await fake.openStream("tenant", 0);
        const chunk = await positionsChunk("tenant", digest);
        await fake.sendChunk(stream, chunk, { ...fake.binding(r, key), tenantId: "tenant-b" });
      }),
      "binding-tag",
    );
  },

  "a reservation across tenants, a spoofed source, a malformed one: refused": async (
    { s, fake },
  ) => {
    const mine = fake.request("held", 0);
    assert.ok((await fake.reserve(mine)).ok);
    const cases = [
      fake.request("held", 1, { tenantId: "tenant-b" }), // someone else's handoff id
      fake.request("spoof", 0, { sourceNodeId: s.prefill.peer.nodeId }),
      fake.request("bad", 0, { promptTokens: -5 }),
    ];
    for (const r of cases) {
      const out = await timed(() => fake.reserve(r));
      assert.deepEqual(out.value, { ok: false, reason: "reserve-rejected" }, r.handoffId);
      assertWithin(out.ms, REFUSAL_BOUND_MS, `refusing reservation ${r.handoffId}`);
    }
    assert.equal((await s.decode.stats()).decodeAttempts, 1); // the tenant's own is intact
    await fake.conn.send({
      type: "AbortNotice",
      handoffId: "held",
      attempt: 0,
      reason: "cancelled",
    });
    await waitForIdle(s.decode, RELEASE_BOUND_MS);
  },

  "a malformed chunk header and an oversized handoff frame": async (
    { s, fake, digest, reject },
  ) => {
    assert.equal(
      await reject("malformed", async (r, key) => {
        const stream = await fake.openStream("malformed", 0);
        const chunk = await positionsChunk("malformed", digest);
        const header = { ...chunk.header, kind: "bogus" } as unknown as typeof chunk.header;
        await fake.sendChunk(stream, { ...chunk, header }, fake.binding(r, key));
      }),
      "invalid-state",
    );
    const big = await s.fake({
      handoff: { frameLimits: { headerBytesMax: 65_536, payloadBytesMax: 32 << 20 } },
    });
    const r = big.request("oversized", 0);
    const res = await big.reserve(r);
    assert.ok(res.ok);
    const out = await timed(async () => {
      const stream = await big.openStream("oversized", 0);
      const chunk = await positionsChunk("oversized", digest);
      stream.send({
        type: "StateChunk",
        handoffId: "oversized",
        attempt: 0,
        header: chunk.header,
        tag: "",
      }, new Uint8Array(17 << 20)).catch(() => {});
      return await big.abortReason("oversized", 0, REFUSAL_BOUND_MS);
    });
    await big.conn.close();
    assert.equal(out.value, "protocol-error");
    assertWithin(out.ms, REFUSAL_BOUND_MS, "refusing an oversized handoff frame");
    await waitForIdle(s.decode, RELEASE_BOUND_MS);
  },

  "a generate request across tenants: refused; the owner still generates": async (
    { s, baseline },
  ) => {
    const handoffId = crypto.randomUUID();
    const toPrefill = await s.client.connect(s.prefill.peer);
    await toPrefill.send({
      type: "PrefillRequest",
      handoffId,
      tenantId: "tenant-a",
      prompt: null,
      generateTokens: 6,
      sampling: SAMPLING,
      decode: s.decode.peer,
      probe: false,
    }, new TextEncoder().encode(PROMPT));
    // The first token comes first (FirstToken, and Progress while the state moves), then
    // the outcome.
    let outcome = await withTimeout(toPrefill.receive(), HANG_MS, "PrefillOutcome"); // compute
    while (outcome && outcome.header.type !== "PrefillOutcome") {
      outcome = await withTimeout(toPrefill.receive(), HANG_MS, "PrefillOutcome");
    }
    assert.equal(outcome!.header.outcome, "committed");
    await toPrefill.close();
    const toDecode = await s.client.connect(s.decode.peer);
    const generate = (tenantId: string) => generateFor(toDecode, handoffId, tenantId);
    const other = await timed(() => generate("tenant-b"));
    assert.equal(other.value!.ok, false);
    assert.deepEqual(other.value!.tokens, []);
    assertWithin(other.ms, REFUSAL_BOUND_MS, "refusing another tenant's generate");
    // It reveals nothing: the very answer an id nobody holds gets.
    const unknown = await generateFor(toDecode, crypto.randomUUID(), "tenant-b");
    assert.equal(unknown.ok, false);
    assert.equal(other.value!.message, unknown.message);
    const own = await generate("tenant-a");
    assert.equal(own.ok, true);
    assert.deepEqual(own.tokens, baseline.tokens);
    await toDecode.close();
    await waitForIdle(s.decode, RELEASE_BOUND_MS);
  },

  "an untrusted client: both workers refuse the connection": async ({ s }) => {
    for (const w of [s.prefill, s.decode]) {
      const out = await timed(() => s.stranger.connect(w.peer));
      assert.ok(out.error instanceof PeerError, String(out.error));
      assert.match(out.error.message, /refused this node/);
      assertWithin(out.ms, REFUSAL_BOUND_MS, `${w.name} refusing an untrusted client`);
    }
  },

  "an untrusted worker on either side: never a handoff, the decoder recomputes": async (
    { s, baseline },
  ) => {
    const before = (await s.decode.stats()).reservationsTotal;
    const cases = [
      {
        trust: s.decode.worker!.node.trust,
        who: s.prefill.peer.nodeId,
        why: /refused this node/,
      },
      {
        trust: s.prefill.worker!.node.trust,
        who: s.decode.peer.nodeId,
        why: /not in the trust list/,
      },
    ];
    for (const c of cases) {
      // A worker checks trust as a connection opens: the prefill worker's link made before
      // is dropped so this handoff connects while the entry is missing.
      s.prefill.worker!.prefill!.links.dropAll("test: connect afresh");
      const out = await timed(() => untrusted(c.trust, c.who, () => s.run()));
      assert.ifError(out.error);
      assert.equal(out.value!.placement, "colocated");
      assert.match(out.value!.fallbackReason!, c.why);
      assert.deepEqual(out.value!.tokens, baseline.tokens);
    }
    assert.equal((await s.decode.stats()).reservationsTotal, before);
    await waitForIdle(s.prefill, RELEASE_BOUND_MS);
    await waitForIdle(s.decode, RELEASE_BOUND_MS);
  },

  "an older peer without capabilities: never chosen, colocated, and said so": async (
    { s, baseline },
  ) => {
    const out = await timed(() => s.run({ decode: s.old.peer }));
    assert.ifError(out.error);
    assert.equal(out.value!.placement, "colocated");
    assert.match(out.value!.fallbackReason!, /not eligible.*older peer/);
    assert.deepEqual(out.value!.tokens, baseline.tokens);
    // Asked directly, the prefill worker refuses to hand off to it as well.
    const conn = await s.client.connect(s.prefill.peer);
    await conn.send({
      type: "PrefillRequest",
      handoffId: "to-old",
      tenantId: "tenant-a",
      prompt: null,
      generateTokens: 6,
      sampling: SAMPLING,
      decode: s.old.peer,
      probe: false,
    }, new TextEncoder().encode(PROMPT));
    const h = (await withTimeout(conn.receive(), REFUSAL_BOUND_MS, "PrefillOutcome"))!.header;
    await conn.close();
    assert.equal(h.outcome, "fallback");
    assert.equal(h.reason, "capability-missing");
    assert.match(String(h.message), /older peer/);
    assert.equal((await s.old.stats()).reservationsTotal, 0);
    await waitForIdle(s.old, RELEASE_BOUND_MS);
    await waitForIdle(s.prefill, RELEASE_BOUND_MS);
  },
};

Deno.test({
  name:
    "handoff isolation: replays, cross-handoff/model/tenant state and untrusted or older peers are refused",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async (t) => {
    const { dir, nodes } = await makeNodes(["prefill", "decode", "old", "client", "fakeprefill"], {
      old: ["decode"],
      fakeprefill: ["prefill"],
    });
    const s = await setup(dir, nodes);
    let fake: FakePrefiller | null = null;
    try {
      const digest = s.decode.worker!.identity.digest;
      const baseline = await s.run();
      assert.equal(baseline.placement, "disaggregated");
      fake = await s.fake();
      const f = fake;
      /** Reserves, sends one chunk (as `send` says) and returns the decoder's abort reason. */
      const reject = async (
        handoffId: string,
        send: (r: ReserveRequest, key: Uint8Array) => Promise<void>,
        thenIdle = true,
      ) => {
        const r = f.request(handoffId, 0);
        const res = await f.reserve(r);
        assert.ok(res.ok, "reservation");
        const out = await timed(async () => {
          await send(r, res.bindingKey);
          return await f.abortReason(handoffId, 0, REFUSAL_BOUND_MS);
        });
        assert.ifError(out.error);
        assertWithin(out.ms, REFUSAL_BOUND_MS, `refusing handoff ${handoffId}`);
        if (thenIdle) await waitForIdle(s.decode, RELEASE_BOUND_MS);
        return out.value;
      };
      const c: Ctx = { s, fake: f, digest, baseline, reject };
      for (const [name, step] of Object.entries(STEPS)) await t.step(name, () => step(c));
    } finally {
      await fake?.conn.close().catch(() => {});
      await Promise.allSettled([s.prefill.stop(), s.decode.stop(), s.old.stop()]);
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  },
});
