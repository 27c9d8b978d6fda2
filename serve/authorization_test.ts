/**
 * Authorization by role (issue #9): each worker takes each message only from a peer whose
 * trusted roles permit it. Real workers in this process on real QUIC, each node trusted in
 * exactly its role (LOCAL_ROLES); the peers that misbehave are the workers' own identities
 * (a decode worker's node asking a prefill worker to prefill, and so on). Refusals need no
 * timer, so each must come before any protocol timer could have ended the case instead.
 */
import assert from "node:assert/strict";
import { testModel } from "../testing/models.ts";
import { TrustList } from "../transport/mod.ts";
import {
  HANG_MS,
  promptOf,
  REFUSAL_BOUND_MS,
  RELEASE_BOUND_MS,
  SAMPLING,
  startInProcess,
  type TestWorker,
  waitForIdle,
  withTimeout,
} from "./_failure_harness.ts";
import { PeerAuthorization, roleNeededFor } from "./authorization.ts";
import { runHandoff } from "./coordinator.ts";
import { makeTrustingNodes } from "./local_cluster.ts";
import type { PeerConnection } from "../transport/mod.ts";
import { queryStats } from "./stats.ts";

const PROMPT = promptOf(12);

Deno.test("roleNeededFor() and PeerAuthorization: who may send what, refusals name the role", async () => {
  assert.equal(roleNeededFor("PrefillRequest"), "coordinator");
  assert.equal(roleNeededFor("GenerateRequest"), "coordinator");
  assert.equal(roleNeededFor("CancelRequest"), "coordinator");
  assert.equal(roleNeededFor("ReserveRequest"), "prefill");
  assert.equal(roleNeededFor("AbortNotice"), "prefill");
  assert.equal(roleNeededFor("StatsRequest"), null);
  const list = TrustList.inMemory();
  const { publicKey } = await (await import("../transport/mod.ts")).createEphemeralNodeIdentity();
  const { entry } = await list.add({ publicKey }, ["decode"]);
  const auth = new PeerAuthorization(entry.nodeId, entry);
  assert.equal(auth.refusalFor("StatsRequest"), null);
  const refusal = auth.refusalFor("PrefillRequest")!;
  assert.match(
    refusal,
    /not trusted as "coordinator".*its roles: decode.*--roles decode,coordinator/,
  );
  assert.equal(new PeerAuthorization("x", undefined).may("prefill"), false);
  const legacy = { ...entry, roles: undefined };
  assert.equal(new PeerAuthorization(entry.nodeId, legacy).refusalFor("ReserveRequest"), null);
});

/** Sends `header` (with `prompt` as the payload) and returns the first answer of `types`. */
async function ask(
  conn: PeerConnection,
  header: Record<string, unknown>,
  types: string[],
  prompt?: string,
): Promise<Record<string, unknown>> {
  await conn.send(header, prompt === undefined ? undefined : new TextEncoder().encode(prompt));
  for (;;) {
    const msg = await withTimeout(conn.receive(), REFUSAL_BOUND_MS, types.join(" or "));
    assert.ok(msg, "the worker closed the connection");
    if (types.includes(String(msg.header.type))) return msg.header as Record<string, unknown>;
  }
}

Deno.test({
  name: "workers refuse messages from peers whose trusted roles do not permit them",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async (t) => {
    const dir = await Deno.makeTempDir({ prefix: "skippy-authz-" });
    // `rogue` is a real decode worker that everyone trusts only as a coordinator.
    const nodes = await makeTrustingNodes(dir, ["prefill", "decode", "rogue", "client"], {
      rogue: ["coordinator"],
    });
    const model = await testModel("hybrid");
    const workers: TestWorker[] = [];
    const opened: PeerConnection[] = [];
    try {
      const [decode, prefill, rogue] = await Promise.all([
        startInProcess("decode", "decode", `${dir}/decode`, model),
        startInProcess("prefill", "prefill", `${dir}/prefill`, model),
        startInProcess("rogue", "decode", `${dir}/rogue`, model),
      ]);
      workers.push(decode, prefill, rogue);
      const client = nodes.get("client")!;
      const connect = async (from: TestWorker, to: TestWorker) => {
        const conn = await from.worker!.node.connect(to.peer);
        opened.push(conn);
        return conn;
      };
      const request = (handoffId: string) => ({
        handoffId,
        tenantId: "tenant-a",
        prompt: null,
        generateTokens: 4,
        sampling: SAMPLING,
        probe: false,
      });
      const baseline = await runHandoff(client, {
        prefill: prefill.peer,
        decode: decode.peer,
        prompt: PROMPT,
        generateTokens: 4,
        sampling: SAMPLING,
        tenantId: "tenant-a",
        probe: false,
        timeoutMs: HANG_MS,
      });
      assert.equal(baseline.placement, "disaggregated", "the coordinator is allowed");

      await t.step(
        "a peer trusted only as decode cannot make a prefill worker prefill",
        async () => {
          const conn = await connect(decode, prefill);
          const h = await ask(
            conn,
            { type: "PrefillRequest", ...request("by-decoder"), decode: decode.peer },
            ["PrefillOutcome"],
            PROMPT,
          );
          assert.equal(h.outcome, "failed");
          assert.match(String(h.message), /not trusted as "coordinator".*its roles: decode/);
          // Stats are counts only: any trusted peer may ask.
          assert.equal((await queryStats(conn)).prefillActive, 0);
          assert.equal((await decode.stats()).reservationsTotal, 1, "only the baseline reserved");
        },
      );

      await t.step("a prefill peer cannot send a GenerateRequest", async () => {
        const conn = await connect(prefill, decode);
        const h = await ask(
          conn,
          {
            type: "GenerateRequest",
            ...request("by-prefiller"),
            mode: "local",
          },
          ["GenerateDone"],
          PROMPT,
        );
        assert.equal(h.ok, false);
        assert.match(String(h.message), /not trusted as "coordinator".*its roles: prefill/);
        assert.equal((await decode.stats()).generating, 0);
      });

      await t.step(
        "a coordinator cannot reserve on, or open a handoff stream to, a decoder",
        async () => {
          const conn = await client.connect(decode.peer);
          opened.push(conn);
          const h = await ask(conn, {
            type: "ReserveRequest",
            handoffId: "by-coordinator",
            attempt: 0,
            tenantId: "tenant-a",
          }, ["AbortNotice", "ReserveAccepted"]);
          assert.equal(h.type, "AbortNotice");
          assert.equal(h.reason, "reserve-rejected");
          const stream = await conn.openHandoffStream({ handoffId: "by-coordinator", attempt: 0 });
          await assert.rejects(
            withTimeout(
              stream.send({ type: "StateChunk" }, new Uint8Array(8)),
              REFUSAL_BOUND_MS,
              "the refusal",
            ),
            /refused the handoff stream: Refused: .*not trusted as "prefill"/,
          );
          const s = await decode.stats();
          assert.equal(s.reservationsTotal, 1);
          assert.equal(s.decodeAttempts, 0);
        },
      );

      await t.step("a prefill worker hands state only to a peer trusted as decode", async () => {
        const out = await runHandoff(client, {
          prefill: prefill.peer,
          decode: rogue.peer,
          prompt: PROMPT,
          generateTokens: 4,
          sampling: SAMPLING,
          tenantId: "tenant-a",
          probe: false,
          timeoutMs: HANG_MS,
        });
        assert.equal(out.placement, "colocated");
        assert.match(out.fallbackReason!, /trusted on the prefill worker, but not as "decode"/);
        assert.deepEqual(out.tokens, baseline.tokens);
        assert.equal((await rogue.stats()).reservationsTotal, 0);
      });
      for (const w of workers) await waitForIdle(w, RELEASE_BOUND_MS);
    } finally {
      await Promise.allSettled(opened.map((c) => c.close()));
      await Promise.allSettled(workers.map((w) => w.stop()));
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  },
});
