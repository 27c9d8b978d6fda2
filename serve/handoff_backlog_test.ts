/**
 * The handoff record's backlog and capture schedule (core/telemetry_summary.ts): over a link
 * slower than the export,
 * chunks wait behind each other's writes, and the record says how many bytes went out behind
 * a backlog and how long they took, the rate live placement learns a long transfer's link
 * from (`handoffTransferSample`). A slowed stream (injected write delay, a transport fault)
 * stands in for the slow link; the workers and the state are real.
 */
import assert from "node:assert/strict";
import { type RawConnection, withFaults } from "../transport/mod.ts";
import { HANG_MS, hybridTrio, promptOf, SAMPLING, startInProcess } from "./_failure_harness.ts";
import { runHandoff } from "./coordinator.ts";
import { handoffTransferSample } from "../core/link_estimates.ts";

const WRITE_DELAY_MS = 30;

Deno.test({
  name:
    "a handoff over a slowed stream records its backlog: bytes written behind earlier writes, at the slowed rate",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const { model, dir, client } = await hybridTrio();
    // Every connection the prefill worker opens: its handoff stream's writes are slowed.
    const slowLink = (raw: RawConnection) =>
      withFaults(raw, { streamIndex: 1, delayMs: WRITE_DELAY_MS });
    const decode = await startInProcess("decode", "decode", `${dir}/decode`, model);
    const prefill = await startInProcess("prefill", "prefill", `${dir}/prefill`, model, {
      faults: { connect: slowLink },
    });
    try {
      const slowed = await runHandoff(client, {
        prefill: prefill.peer,
        decode: decode.peer,
        prompt: promptOf(50),
        generateTokens: 2,
        sampling: SAMPLING,
        tenantId: "tenant-a",
        probe: false,
        timeoutMs: HANG_MS,
      });
      assert.equal(slowed.placement, "disaggregated");
      const t = slowed.telemetry;
      assert.ok(t.backlogBytes! > 0 && t.backlogBytes! <= t.totalBytes, `${t.backlogBytes}`);
      // Each chunk behind the backlog took at least its own write's delay.
      const chunkBytesMax = t.chunkBytesMaxSent!;
      assert.ok(
        t.backlogMs! >= WRITE_DELAY_MS * Math.ceil(t.backlogBytes! / chunkBytesMax),
        `${t.backlogMs} ms for ${t.backlogBytes} bytes`,
      );
      // The capture's schedule, as the planner learns it: every recurrent piece, in capture
      // order, before compute end, the last one `captureLeadMs` before it.
      const schedule = t.captureSchedule!;
      const recurrent = (t.bytesByComponent.conv ?? 0) + (t.bytesByComponent.ssm ?? 0);
      assert.equal(schedule.reduce((a, [, b]) => a + b, 0), recurrent);
      assert.ok(schedule.every(([ms], k) => ms >= 0 && (k === 0 || ms <= schedule[k - 1][0])));
      assert.equal(schedule[schedule.length - 1][0], t.captureLeadMs);
      // What live placement learns the link from: the backlog, where it is big enough.
      assert.deepEqual(handoffTransferSample(t, 0, t.backlogBytes), {
        bytes: t.backlogBytes,
        ms: t.backlogMs,
      });
    } finally {
      await client.close();
      await Promise.allSettled([prefill.stop(), decode.stop()]);
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  },
});
