import assert from "node:assert/strict";
import { chunkTimes, lastChunkTokens, type StreamInput } from "./link_stream.ts";

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
