/**
 * `--congestion-control auto` in a prefill worker (in this process, real QUIC on loopback, tiny
 * hybrid model): after a committed handoff its loss probe of the decode worker's link sets the
 * link's controller; a change replaces the link, the next handoff commits over the new one with
 * the same tokens, and its outcome reports the controller. Loopback loses nothing, so the bound
 * is set to 0 here (every probe reads as lossy); which loss makes a link BBR is
 * congestion_choice_test.ts's.
 */
import assert from "node:assert/strict";
import { HANG_MS, hybridTrio, promptOf, SAMPLING, startInProcess } from "./_failure_harness.ts";
import { runHandoff } from "./coordinator.ts";

Deno.test({
  name:
    "auto: the decoder link's loss probe switches its controller, and the next handoff commits over the new link",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const { model, dir, client } = await hybridTrio();
    const lines: string[] = [];
    // The prefill worker's outgoing connections, counted by the test hook (nothing altered).
    let connects = 0;
    const prefill = await startInProcess("prefill", "prefill", `${dir}/prefill`, model, {
      linkProbeAgeMs: 60_000,
      link: { congestionControl: "auto", bbrLossFractionMin: 0 },
      log: (line) => lines.push(line),
      faults: {
        connect: (raw, index) => {
          connects = index + 1;
          return raw;
        },
      },
    });
    const decode = await startInProcess("decode", "decode", `${dir}/decode`, model);
    const handoff = () =>
      runHandoff(client, {
        prefill: prefill.peer,
        decode: decode.peer,
        prompt: promptOf(12),
        generateTokens: 8,
        sampling: SAMPLING,
        tenantId: "tenant-a",
        probe: true,
        timeoutMs: HANG_MS,
      });
    try {
      const first = await handoff();
      assert.equal(first.placement, "disaggregated", first.fallbackReason ?? "");
      assert.equal(first.linkLoss, null, "no probe before the first handoff");
      assert.equal(connects, 1);
      // The probe runs in the background after the commit; its switch is logged.
      const switched = /new handoffs go over a BBR connection/;
      const t0 = performance.now();
      while (!lines.some((l) => switched.test(l)) && performance.now() - t0 < HANG_MS) {
        await new Promise((r) => setTimeout(r, 20));
      }
      assert.ok(lines.some((l) => switched.test(l)), lines.join("\n"));
      const second = await handoff();
      assert.equal(second.placement, "disaggregated", second.fallbackReason ?? "");
      assert.deepEqual(second.tokens, first.tokens);
      assert.equal(second.linkLoss?.congestionControl, "bbr");
      assert.equal(connects, 2, "the second handoff went over a new connection");
    } finally {
      await Promise.allSettled([prefill.stop(), decode.stop()]);
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  },
});
