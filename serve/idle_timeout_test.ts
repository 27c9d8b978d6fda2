/**
 * The request timeout is "no progress for timeoutMs": a worker that stays connected but says
 * nothing fails the request with a typed error that says so, while every message for the
 * request pushes the timeout back (IdleTimeout).
 */
import assert from "node:assert/strict";
import { LimitExceededError } from "../core/mod.ts";
import type { PeerConnection } from "../transport/mod.ts";
import { IdleTimeout } from "./_idle_timeout.ts";
import { runHandoff } from "./coordinator.ts";
import { makeTrustingNodes } from "./local_cluster.ts";

Deno.test({
  name: "a connected worker that never answers fails the request as 'no progress', typed",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const dir = await Deno.makeTempDir({ prefix: "skippy-idle-" });
    const nodes = await makeTrustingNodes(dir, ["silent", "client"]);
    const silent = nodes.get("silent")!;
    // Announces both roles but no numerics: never eligible, so the client asks it to
    // generate colocated, and it reads the request and stays quiet.
    const listener = silent.listen("127.0.0.1", 0, { roles: ["prefill+decode"] });
    const held: PeerConnection[] = [];
    const received: string[] = [];
    (async () => {
      for await (const peer of listener) {
        held.push(peer);
        (async () => {
          for await (const msg of peer) received.push(String(msg.header.type));
        })().catch(() => {});
      }
    })().catch(() => {});
    const address = {
      host: "127.0.0.1",
      port: listener.addr.port,
      nodeId: silent.identity.nodeId,
    };
    try {
      const timeoutMs = 300;
      await assert.rejects(
        () =>
          runHandoff(nodes.get("client")!, {
            prefill: address,
            decode: address,
            prompt: "a prompt",
            generateTokens: 4,
            sampling: { temperature: 0, topK: 40, topP: 0.95, seed: 1 },
            tenantId: "t",
            probe: false,
            timeoutMs,
          }),
        (error: Error) => {
          assert.ok(error instanceof LimitExceededError, String(error));
          assert.match(error.message, /made no progress for 300 ms/);
          return true;
        },
      );
      assert.ok(received.includes("GenerateRequest"), received.join(","));
    } finally {
      await Promise.allSettled(held.map((p) => p.close()));
      listener.close();
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  },
});

Deno.test("IdleTimeout expires with a TimeoutError, and stays expired", async () => {
  const idle = new IdleTimeout(60_000);
  assert.equal(idle.signal.aborted, false);
  idle.touch();
  idle.clear();
  // A zero wait expires on the next turn of the event loop, with a TimeoutError reason.
  const quick = new IdleTimeout(0);
  await new Promise((resolve) => quick.signal.addEventListener("abort", resolve, { once: true }));
  assert.equal((quick.signal.reason as DOMException).name, "TimeoutError");
  quick.touch(); // after expiry: no effect, stays aborted
  assert.equal(quick.signal.aborted, true);
  quick.clear();
});
