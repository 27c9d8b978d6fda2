/**
 * The first token reaches the client at the end of prefill, from the prefill worker, before
 * the state moves; and when the handoff then fails and the decode worker recomputes, the
 * colocated continuation goes on after the token already sent, with the same tokens and
 * logits as the handoff would have produced (greedy and seeded sampling); likewise when the
 * prefiller's probe digest differs from the decoder's, unless the decoder claims no bitwise
 * parity (then the digests are not compared and the handoff commits). Two workers in this
 * process on real QUIC, tiny hybrid model.
 */
import assert from "node:assert/strict";
import { testModel } from "../testing/models.ts";
import { type RawConnection, withFaults } from "../transport/mod.ts";
import {
  makeNodes,
  promptOf,
  SAMPLING,
  startInProcess,
  type TestWorker,
  waitForIdle,
  withTimeout,
} from "./_failure_harness.ts";
import { formatTelemetry } from "../core/mod.ts";
import { type HandoffRequest, runHandoff } from "./coordinator.ts";
import type { FirstToken, PrefillOutcome } from "./messages.ts";
import type { Node } from "./node.ts";

const PROMPT = promptOf(30); // about 700 tokens: 11 KV pages of 64 tokens
const SEEDED = { temperature: 0.9, topK: 40, topP: 0.95, seed: 7 };
/** Bounds on waiting for an answer (a hung test is a failed test), not on how fast it is. */
const ANSWER_WAIT_MS = 30_000;

/**
 * Breaks the handoff stream of the first attempt and of every retry (retries max 2) after
 * prefill has ended: a frame of the tail (after the prompt's 11 KV pages) arrives twice, which
 * the decoder rejects as invalid state; after the last retry the prefiller falls back.
 */
function corruptEveryAttempt(raw: RawConnection): RawConnection {
  let wrapped = raw;
  for (const streamIndex of [1, 2, 3]) {
    wrapped = withFaults(wrapped, { streamIndex, duplicateFrameIndex: 14 });
  }
  return wrapped;
}

interface Setup {
  client: Node;
  prefill: TestWorker;
  decode: TestWorker;
  /**
   * On: every handoff stream on the prefill worker's next link is corrupted (each attempt
   * fails). The prefill worker keeps one link per decode worker, so each switch drops it.
   */
  corruptNext(on: boolean): void;
  /** On: the prefill worker sends a wrong probe digest (one hex digit changed). */
  wrongProbe: { on: boolean };
  /**
   * On: the decode worker's reservations claim no bitwise parity, as between two GPU devices of
   * one backend (a test hook: this machine has only a CPU).
   */
  parityNotClaimed: { on: boolean };
  run(over?: Partial<HandoffRequest>): ReturnType<typeof runHandoff>;
}

async function setup(dir: string, nodes: Map<string, Node>): Promise<Setup> {
  const model = await testModel("hybrid");
  const corrupt = { on: false };
  const wrongProbe = { on: false };
  const parityNotClaimed = { on: false };
  const decode = await startInProcess("decode", "decode", `${dir}/decode`, model, {
    decodeHooks: {
      parity: (v) =>
        parityNotClaimed.on
          ? { parity: "not-claimed", differingFields: ["computeDevice"], reason: "test" }
          : v,
    },
  });
  const prefill = await startInProcess("prefill", "prefill", `${dir}/prefill`, model, {
    prefillHooks: {
      probeDigest: (d) => wrongProbe.on ? (d[0] === "0" ? "1" : "0") + d.slice(1) : d,
    },
    faults: {
      connect: (raw: RawConnection) => corrupt.on ? corruptEveryAttempt(raw) : raw,
    },
  });
  const client = nodes.get("client")!;
  const run = (over: Partial<HandoffRequest> = {}) =>
    runHandoff(client, {
      prefill: prefill.peer,
      decode: decode.peer,
      prompt: PROMPT,
      generateTokens: 12,
      sampling: SAMPLING,
      tenantId: "tenant-a",
      probe: true,
      timeoutMs: ANSWER_WAIT_MS,
      ...over,
    });
  const corruptNext = (on: boolean) => {
    corrupt.on = on;
    prefill.worker!.prefill!.links.dropAll("test: the next link is (or is not) faulty");
  };
  return { client, prefill, decode, corruptNext, wrongProbe, parityNotClaimed, run };
}

Deno.test({
  name: "first token at prefill end; a failed handoff's recompute continues after it",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async (t) => {
    const { dir, nodes } = await makeNodes(["prefill", "decode", "client"]);
    const s = await setup(dir, nodes);
    try {
      const greedy = await s.run();
      assert.equal(greedy.placement, "disaggregated");
      assert.equal(greedy.tokens.length, 12);
      assert.equal(greedy.logitsSha256.length, 12);
      assert.ok(greedy.firstTokenAfterPrefillMs !== null);
      assert.ok(greedy.telemetry.firstTokenAfterPrefillMs !== null);

      await t.step("FirstToken comes before the outcome, and before the manifest", async () => {
        const conn = await s.client.connect(s.prefill.peer);
        const handoffId = crypto.randomUUID();
        await conn.send({
          type: "PrefillRequest",
          handoffId,
          tenantId: "tenant-a",
          prompt: null,
          generateTokens: 12,
          sampling: SAMPLING,
          decode: s.decode.peer,
          probe: true,
        }, new TextEncoder().encode(PROMPT));
        const seen: Record<string, unknown>[] = [];
        while (seen.at(-1)?.type !== "PrefillOutcome") {
          const msg = await withTimeout(conn.receive(), ANSWER_WAIT_MS, "PrefillOutcome");
          const h = msg!.header as Record<string, unknown>;
          if (h.handoffId === handoffId && h.type !== "Progress") seen.push(h);
        }
        await conn.close();
        assert.deepEqual(seen.map((h) => h.type), ["FirstToken", "PrefillOutcome"]);
        const first = seen[0] as unknown as FirstToken;
        const outcome = seen[1] as unknown as PrefillOutcome;
        assert.equal(first.token, greedy.tokens[0]);
        assert.equal(first.logitsSha256, greedy.logitsSha256[0]);
        assert.equal(outcome.outcome, "committed");
        // On the prefiller's clock: the token left before the state's manifest did.
        const p = outcome.telemetry!;
        assert.ok(p.firstTokenMs! < p.manifestSentMs!, JSON.stringify(p));
        assert.ok(p.firstTokenMs! < p.commitAckMs!);
        // Nobody asks for the committed session: the decoder releases it on its own.
        await waitForIdle(s.prefill, ANSWER_WAIT_MS);
      });

      await t.step("handoff fails after the first token: same tokens, greedy", async () => {
        s.corruptNext(true);
        const texts: string[] = [];
        const r = await s.run({ onText: (text) => texts.push(text) });
        s.corruptNext(false);
        assert.equal(r.placement, "colocated");
        // The decoder refuses the duplicated frame: its reason, not a lost decoder, even when
        // the prefiller's next write on the stopped stream fails before that reason is read
        // (transport/handoff_stream_test.ts orders that race by hand).
        assert.match(r.fallbackReason!, /invalid/);
        // The first token came from the prefill worker before the handoff failed.
        assert.ok(r.firstTokenAfterPrefillMs !== null);
        assert.deepEqual(r.tokens, greedy.tokens);
        assert.deepEqual(r.logitsSha256, greedy.logitsSha256);
        assert.equal(r.text, greedy.text);
        assert.equal(texts.join(""), greedy.text);
      });

      await t.step(
        "a probe digest that differs fails the commit; the recompute continues",
        async () => {
          // Both workers on the CPU: bitwise parity is claimed, so the digests must be equal.
          s.wrongProbe.on = true;
          const r = await s.run();
          s.wrongProbe.on = false;
          assert.equal(r.placement, "colocated");
          assert.match(r.fallbackReason!, /continuation probe/);
          assert.ok(r.firstTokenAfterPrefillMs !== null);
          assert.deepEqual(r.tokens, greedy.tokens);
          assert.deepEqual(r.logitsSha256, greedy.logitsSha256);
          assert.equal(greedy.telemetry.parity, "bitwise");
        },
      );

      await t.step(
        "parity not claimed: digests are not compared, the handoff commits",
        async () => {
          // Two devices that may round differently: a differing digest must not fail the handoff,
          // and the record says the digests were not compared.
          s.parityNotClaimed.on = true;
          s.wrongProbe.on = true;
          try {
            for (let i = 0; i < 3; i++) {
              const r = await s.run();
              assert.equal(r.placement, "disaggregated", r.fallbackReason ?? "");
              assert.deepEqual(r.tokens, greedy.tokens);
              assert.deepEqual(r.logitsSha256, greedy.logitsSha256);
              assert.equal(r.telemetry.parity, "not-claimed");
              assert.deepEqual(r.telemetry.parityFields, ["computeDevice"]);
              assert.match(formatTelemetry(r.telemetry), /probe digests not compared/);
            }
          } finally {
            s.parityNotClaimed.on = false;
            s.wrongProbe.on = false;
          }
        },
      );

      await t.step("handoff fails after the first token: same tokens, seeded", async () => {
        const seeded = await s.run({ sampling: SEEDED });
        assert.equal(seeded.placement, "disaggregated");
        assert.notDeepEqual(seeded.tokens, greedy.tokens); // sampling, not argmax
        s.corruptNext(true);
        const r = await s.run({ sampling: SEEDED });
        s.corruptNext(false);
        assert.equal(r.placement, "colocated");
        assert.ok(r.firstTokenAfterPrefillMs !== null);
        assert.deepEqual(r.tokens, seeded.tokens);
        assert.deepEqual(r.logitsSha256, seeded.logitsSha256);
        assert.equal(r.text, seeded.text);
      });

      await waitForIdle(s.prefill, ANSWER_WAIT_MS);
      await waitForIdle(s.decode, ANSWER_WAIT_MS);
    } finally {
      await Promise.allSettled([s.prefill.stop(), s.decode.stop()]);
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  },
});
