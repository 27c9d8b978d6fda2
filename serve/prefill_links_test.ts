/**
 * Issue #9: the prefill worker keeps one authenticated link per decode worker, shared by its
 * handoffs (serve/peer_links.ts, serve/decoder_channel.ts), instead of a connection per
 * handoff. Real QUIC between two in-process workers (tiny hybrid model); connections are
 * counted where they open. A link cut under no request makes the decode worker known dead
 * for the backoff (a request then falls back at once, named), after which it reconnects. The
 * only waits are on the links' own backoff timer, never on compute.
 */
import assert from "node:assert/strict";
import { CloseCode, type RawConnection } from "../transport/mod.ts";
import { type HandoffRequest, runHandoff } from "./coordinator.ts";
import {
  HANG_MS,
  hybridTrio,
  promptOf,
  RELEASE_BOUND_MS,
  SAMPLING,
  startInProcess,
  waitForIdle,
} from "./_failure_harness.ts";

const PROMPT = promptOf(12); // about 130 tokens: a few KV pages
const BACKOFF_MS = 300;

Deno.test({
  name:
    "the prefill worker shares one link per decode worker across handoffs, and reconnects after a loss",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const { model, dir, client } = await hybridTrio();
    const outgoing: RawConnection[] = [];
    const decode = await startInProcess("decode", "decode", `${dir}/decode`, model);
    const prefill = await startInProcess("prefill", "prefill", `${dir}/prefill`, model, {
      faults: { connect: (raw) => (outgoing.push(raw), raw) },
      link: { peerLinks: { reconnectBackoffMs: BACKOFF_MS, reconnectBackoffMsMax: BACKOFF_MS } },
    });
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
    const links = prefill.worker!.prefill!.links;
    try {
      const [a, b, c] = await Promise.all([run(), run(), run()]);
      const d = await run();
      for (const r of [a, b, c, d]) {
        assert.equal(r.placement, "disaggregated");
        assert.deepEqual(r.fallbacks, []);
        assert.deepEqual(r.tokens, a.tokens);
      }
      assert.equal(outgoing.length, 1, "one connection from the prefill worker for 4 handoffs");
      assert.deepEqual(links.all().map((h) => h.state), ["alive"]);
      await waitForIdle(prefill, RELEASE_BOUND_MS);
      await waitForIdle(decode, RELEASE_BOUND_MS);

      // The link is cut with no handoff on it: the decode worker is known dead for the backoff.
      outgoing[0].close(CloseCode.faultInjected, "test: link cut");
      await waitFor(() => links.health(decode.peer).state === "dead");
      const during = await run();
      assert.equal(during.placement, "colocated");
      assert.match(during.fallbackReason!, /decode worker is unreachable \(.*dead since/);
      assert.deepEqual(during.tokens, a.tokens);
      assert.equal(outgoing.length, 1, "no connect while the decode worker is known dead");

      // After the backoff, the next handoff reconnects and disaggregates again.
      await new Promise((r) => setTimeout(r, BACKOFF_MS));
      const after = await run();
      assert.equal(after.placement, "disaggregated");
      assert.deepEqual(after.tokens, a.tokens);
      assert.equal(outgoing.length, 2);
      assert.equal(links.health(decode.peer).state, "alive");
      await waitForIdle(prefill, RELEASE_BOUND_MS);
      await waitForIdle(decode, RELEASE_BOUND_MS);
    } finally {
      await client.close();
      await Promise.allSettled([prefill.stop(), decode.stop()]);
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  },
});

/** Polls a condition the links' own reader sets; HANG_MS is only the test's hang guard. */
async function waitFor(ok: () => boolean): Promise<void> {
  const t0 = performance.now();
  while (!ok()) {
    if (performance.now() - t0 > HANG_MS) throw new Error("condition not reached");
    await new Promise((r) => setTimeout(r, 10));
  }
}
