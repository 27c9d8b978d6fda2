import assert from "node:assert/strict";
import { pinToCpu } from "./cpu_pin.ts";

Deno.test("pinToCpu refuses a CPU this machine does not have before running taskset", async () => {
  const cpus = navigator.hardwareConcurrency;
  for (const cpu of [-1, cpus, 1.5, Number.NaN]) {
    await assert.rejects(() => pinToCpu(Deno.pid, cpu), /does not exist here: use 0 to/);
  }
});
