import assert from "node:assert/strict";
import { argmax, sampleToken, uniform } from "./sampling.ts";

Deno.test("argmax() breaks ties towards the lowest token id", () => {
  assert.equal(argmax(new Float32Array([0.5, 2, 2, -1])), 1);
  assert.equal(argmax(new Float32Array([-3])), 0);
});

Deno.test("greedy sampling consumes no random draws", () => {
  const state = { seed: 7, draws: 0 };
  const token = sampleToken(new Float32Array([0, 3, 1]), { temperature: 0 }, state);
  assert.equal(token, 1);
  assert.equal(state.draws, 0);
});

Deno.test("seeded sampling is reproducible from (seed, draws) alone", () => {
  const logits = new Float32Array(64).map((_, i) => Math.sin(i) * 3);
  const params = { temperature: 0.9, topK: 20, topP: 0.9 };
  const a = { seed: 11, draws: 0 };
  const first = Array.from({ length: 50 }, () => sampleToken(logits, params, a));
  // A sampler resumed at draw 25 on "another machine" continues identically.
  const b = { seed: 11, draws: 25 };
  const resumed = Array.from({ length: 25 }, () => sampleToken(logits, params, b));
  assert.deepEqual(resumed, first.slice(25));
  assert.equal(a.draws, 50);
  // Different seeds give different sequences (not a constant generator).
  const c = { seed: 12, draws: 0 };
  const other = Array.from({ length: 50 }, () => sampleToken(logits, params, c));
  assert.notDeepEqual(other, first);
});

Deno.test("uniform() stays in [0, 1) and is spread out", () => {
  let sum = 0;
  for (let i = 0; i < 10000; i++) {
    const u = uniform(3, i);
    assert.ok(u >= 0 && u < 1);
    sum += u;
  }
  assert.ok(Math.abs(sum / 10000 - 0.5) < 0.02);
});

Deno.test("top-k sampling never picks outside the k best", () => {
  const logits = new Float32Array([5, 4, 3, -10, -10, -10]);
  const state = { seed: 1, draws: 0 };
  for (let i = 0; i < 200; i++) {
    assert.ok(sampleToken(logits, { temperature: 5, topK: 3 }, state) < 3);
  }
});
