import assert from "node:assert/strict";
import { decidePlacement } from "./placement.ts";

const state = { kvBytesPerToken: 8192, recurrentBytes: 1 << 20 };
const base = { state, family: "hybrid", hasPrefillWorker: true, mode: "auto" as const };

Deno.test("auto placement disaggregates an eligible long prompt by the no-link rule", () => {
  const d = decidePlacement({ ...base, promptTokens: 4096 });
  assert.equal(d.placement, "disaggregated");
  assert.match(d.reason, /no link measurement/);
});

Deno.test("auto placement runs a short prompt colocated, naming the planner's reason", () => {
  const d = decidePlacement({ ...base, promptTokens: 100 });
  assert.equal(d.placement, "colocated");
  assert.match(d.reason, /prompt of 100 tokens is under promptTokensMin 2048/);
  assert.equal(
    decidePlacement({ ...base, promptTokens: 100, promptTokensMin: 50 }).placement,
    "disaggregated",
  );
  const uncertified = decidePlacement({ ...base, promptTokens: 4096, family: "other" });
  assert.match(uncertified.reason, /certification/);
});

Deno.test("--placement overrides the planner; without a prefill worker it is colocated", () => {
  assert.equal(
    decidePlacement({ ...base, promptTokens: 1, mode: "disaggregated" }).placement,
    "disaggregated",
  );
  assert.equal(
    decidePlacement({ ...base, promptTokens: 1e5, mode: "colocated" }).placement,
    "colocated",
  );
  const none = decidePlacement({
    ...base,
    promptTokens: 1e5,
    mode: "disaggregated",
    hasPrefillWorker: false,
  });
  assert.deepEqual(none, { placement: "colocated", reason: "no prefill worker in the peers file" });
});
