import assert from "node:assert/strict";
import { chunkTimes, lastChunkTokens, streamFinish, type StreamInput } from "./link_stream.ts";

Deno.test("lastChunkTokens: a full chunk when the remainder goes first, else the remainder", () => {
  assert.equal(lastChunkTokens(2036, 512, true), 512);
  assert.equal(lastChunkTokens(2036, 512, false), 500);
  assert.equal(lastChunkTokens(300, 512, true), 300); // one chunk: the whole prompt
  assert.equal(lastChunkTokens(1024, 512, false), 512);
  assert.equal(lastChunkTokens(0, 512, true), 0);
});

Deno.test("chunkTimes: chunk ends follow the engine's layout, remainder first with capture", () => {
  const base: StreamInput = {
    promptTokens: 1100,
    chunkTokens: 512,
    prefillerPrefillTokensPerS: 1000,
    state: { kvBytesPerToken: 8192 },
  };
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

Deno.test("streamFinish: layers captured over a measured share of the last chunk arrive as a burst", () => {
  // One 512-token chunk of 1 s; 40 layers of 4 MB (160 MB) over a 100 MB/s link (100 B/us).
  const i: StreamInput = {
    promptTokens: 512,
    chunkTokens: 512,
    prefillerPrefillTokensPerS: 512,
    state: { kvBytesPerToken: 0 },
    snapshotDuringLastChunk: true,
  };
  const bw = 100_000; // bytes per ms
  const even = streamFinish(i, bw, 0, 160e6, false, 40, 0).uncoveredMs;
  // Spread over the whole second, the first layer leaves at 25 ms and the link is busy 1.6 s.
  assert.ok(Math.abs(even - 625) < 1e-6, `${even}`);
  // The default spread is a span of 39/40 of the chunk.
  assert.ok(
    Math.abs(streamFinish(i, bw, 0, 160e6, false, 40, 0, 39 / 40).uncoveredMs - even) < 1e-6,
  );
  // Captured over the chunk's last 30%: the first leaves at 700 ms, all 1.6 s of it after.
  const burst = streamFinish(i, bw, 0, 160e6, false, 40, 0, 0.3).uncoveredMs;
  assert.ok(Math.abs(burst - 1300) < 1e-6, `${burst}`);
  // A span past the chunk (less the lead) is clamped to it.
  const clamped = streamFinish(i, bw, 0, 160e6, false, 40, 100, 5).uncoveredMs;
  assert.ok(Math.abs(clamped - 600) < 1e-6, `${clamped}`);
});
