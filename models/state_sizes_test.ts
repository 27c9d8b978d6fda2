import assert from "node:assert/strict";
import { familySpec } from "./families.ts";
import { expectedStateBytes, kvRowBytes } from "./state_sizes.ts";

Deno.test("expectedStateBytes() of the tiny hybrid follows llama.cpp's formulas", () => {
  // 2 attention layers x (K + V) x 2 KV heads x head dim 32 x 2 bytes (f16).
  // Per Mamba layer: conv (4 - 1) x (256 + 2 x 1 x 16) x 4 B, SSM 16 x 256 x 4 B; 4 layers.
  const s = expectedStateBytes(familySpec("hybrid", "tiny"), "f16");
  assert.equal(s.kvBytesPerToken, 2 * 2 * 2 * 32 * 2);
  assert.equal(s.convBytes, 4 * 3 * 288 * 4);
  assert.equal(s.ssmBytes, 4 * 16 * 256 * 4);
  assert.equal(s.recurrentBytes, s.convBytes + s.ssmBytes);
  assert.equal(s.mtpKvBytesPerToken, 0);
  assert.deepEqual(s.layers, { attention: 2, slidingWindow: 0, recurrent: 4, mtp: 0 });
});

Deno.test("expectedStateBytes() keeps recurrent state f32 whatever the KV type", () => {
  const spec = familySpec("hybrid-moe-mtp", "super-mini");
  const f16 = expectedStateBytes(spec, "f16");
  const f32 = expectedStateBytes(spec, "f32");
  const q8 = expectedStateBytes(spec, "q8_0");
  assert.equal(f32.kvBytesPerToken, 2 * f16.kvBytesPerToken);
  assert.equal(q8.kvBytesPerToken, 2 * 2 * (64 / 32) * 34); // 2 layers, K+V, 64-wide rows
  assert.equal(f32.recurrentBytes, f16.recurrentBytes);
  assert.equal(f16.mtpKvBytesPerToken, 2 * 2 * 32 * 2);
  assert.equal(expectedStateBytes(spec, { k: "f16", v: "f32" }).mtpKvBytesPerToken, 128 + 256);
});

Deno.test("expectedStateBytes() splits ISWA models into global and sliding-window KV", () => {
  const s = expectedStateBytes(familySpec("iswa", "tiny"));
  assert.deepEqual(s.layers, { attention: 1, slidingWindow: 5, recurrent: 0, mtp: 0 });
  assert.equal(s.kvBytesPerToken, 256);
  assert.equal(s.swaKvBytesPerToken, 5 * 256);
  assert.equal(s.slidingWindow, 128);
});

Deno.test("kvRowBytes() refuses a width that is not whole quantization blocks", () => {
  assert.throws(() => kvRowBytes(16, 1, "q8_0"), RangeError);
  assert.equal(kvRowBytes(32, 1, "q4_0"), 2 * 18);
});
