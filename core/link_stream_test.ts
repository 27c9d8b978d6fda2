import assert from "node:assert/strict";
import { chunkTimes, lastChunkTokens, streamFinish, type StreamInput } from "./link_stream.ts";

/** A stream input: one 512-token chunk at 512 tokens/s and no KV unless `over` says otherwise. */
function input(over: Partial<StreamInput> = {}): StreamInput {
  return {
    promptTokens: 512,
    chunkTokens: 512,
    prefillerPrefillTokensPerS: 512,
    state: { kvBytesPerToken: 0 },
    ...over,
  };
}

Deno.test("lastChunkTokens: a full chunk when the remainder goes first, else the remainder", () => {
  assert.equal(lastChunkTokens(2036, 512, true), 512);
  assert.equal(lastChunkTokens(2036, 512, false), 500);
  assert.equal(lastChunkTokens(300, 512, true), 300); // one chunk: the whole prompt
  assert.equal(lastChunkTokens(1024, 512, false), 512);
  assert.equal(lastChunkTokens(0, 512, true), 0);
});

Deno.test("chunkTimes: chunk ends follow the engine's layout, remainder first with capture", () => {
  const base = input({
    promptTokens: 1100,
    prefillerPrefillTokensPerS: 1000,
    state: { kvBytesPerToken: 8192 },
  });
  const captured = chunkTimes({ ...base, snapshotDuringLastChunk: true });
  assert.deepEqual([0, 1, 2, 3].map(captured.tokensAfter), [0, 76, 588, 1100]);
  assert.equal(captured.firstTokens, 76);
  assert.equal(captured.lastTokens, 512);
  assert.equal(captured.lastChunkMs, 512);
  const plain = chunkTimes(base);
  assert.deepEqual([0, 1, 2, 3].map(plain.tokensAfter), [0, 512, 1024, 1100]);
  assert.equal(plain.firstTokens, 512);
  assert.equal(plain.lastTokens, 76);
  assert.equal(plain.lastChunkMs, 76);
  // A cached prefix: the computed tokens alone are chunked.
  const cached = chunkTimes({ ...base, prefillerCachedTokens: 600, snapshotDuringLastChunk: true });
  assert.deepEqual([cached.n, cached.firstTokens, cached.lastTokens], [1, 500, 500]);
});

Deno.test("streamFinish: a measured capture schedule, layers in groups, leaves more to the tail than an even spread", () => {
  // One 512-token chunk of 1 s; 8 layers of 4 MB (32 MB) over a 10 MB/s link (10,000 B/ms).
  const i = input({ snapshotDuringLastChunk: true });
  const bw = 10_000;
  const even = streamFinish(i, bw, 0, 32e6, false, 8, 0).uncoveredMs;
  // Evenly, the first layer leaves at 125 ms and the link is busy 3.2 s after it.
  assert.ok(Math.abs(even - 2325) < 1e-6, `${even}`);
  // The same even spread, as a schedule: the same finish.
  const asMeasured = Array.from({ length: 8 }, (_, k) => [(7 - k) / 8, 1 / 8] as const);
  const same = streamFinish(i, bw, 0, 32e6, false, 8, 0, asMeasured).uncoveredMs;
  assert.ok(Math.abs(same - even) < 1e-6, `${same}`);
  // Two groups of four, the second in the chunk's last 100 ms (an attention layer before it):
  // its 16 MB leave 1.6 s from 900 ms on, whatever the first group did.
  const grouped = [0.9, 0.88, 0.86, 0.84, 0.1, 0.07, 0.04, 0.01].map((f) => [f, 1] as const);
  const burst = streamFinish(i, bw, 0, 32e6, false, 8, 0, grouped).uncoveredMs;
  // The first group from 100 ms: 3.2 s for all 32 MB, ending at 3,300 ms.
  assert.ok(Math.abs(burst - 2300) < 1e-6, `${burst}`);
  // On a faster link (40 MB/s) the even spread keeps up, the groups do not.
  const fastEven = streamFinish(i, 40_000, 0, 32e6, false, 8, 0).uncoveredMs;
  const fastBurst = streamFinish(i, 40_000, 0, 32e6, false, 8, 0, grouped).uncoveredMs;
  assert.ok(Math.abs(fastEven - 100) < 1e-6, `${fastEven}`); // the last 4 MB after compute end
  assert.ok(Math.abs(fastBurst - 300) < 1e-6, `${fastBurst}`); // 16 MB from 900 ms: 1,300
});
