import assert from "node:assert/strict";
import { tokenLogprob, TOP_LOGPROBS_MAX } from "./logprobs.ts";

Deno.test("tokenLogprob() is the log-softmax of the chosen token, and the k best in order", () => {
  const logits = new Float32Array([1, 3, 2, 3, -1]);
  const z = Math.log([1, 3, 2, 3, -1].reduce((s, x) => s + Math.exp(x), 0));
  const lp = tokenLogprob(logits, 2, 3);
  assert.ok(Math.abs(lp.logprob - (2 - z)) < 1e-6);
  assert.deepEqual(lp.top.map(([t]) => t), [1, 3, 2]); // a tie (1 and 3): lower id first
  for (const [t, v] of lp.top) assert.ok(Math.abs(v - (logits[t] - z)) < 1e-6);
  const probs = [...logits].map((x) => Math.exp(x - z));
  assert.ok(Math.abs(probs.reduce((a, b) => a + b) - 1) < 1e-9);
  assert.deepEqual(tokenLogprob(logits, 0, 0).top, []);
});

Deno.test("tokenLogprob() stays finite for large logits and refuses bad k or token by name", () => {
  const big = new Float32Array([1000, 999]);
  const lp = tokenLogprob(big, 1, 2);
  assert.ok(Number.isFinite(lp.logprob) && lp.logprob < 0);
  assert.throws(() => tokenLogprob(big, 0, TOP_LOGPROBS_MAX + 1), /top logprobs/);
  assert.throws(() => tokenLogprob(big, 2, 1), /outside the 2-token vocabulary/);
});
