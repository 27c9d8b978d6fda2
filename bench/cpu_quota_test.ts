import assert from "node:assert/strict";
import { limitCpu } from "./cpu_quota.ts";

Deno.test("limitCpu refuses a quota outside (0, 1] of a core before touching any cgroup", async () => {
  for (const fraction of [0, -0.5, 1.5, Number.NaN]) {
    await assert.rejects(() => limitCpu(Deno.pid, fraction), /out of range: use a fraction/);
  }
});
