/**
 * The decoder's end-of-prompt components in byte pieces (schema 3): history, positions and
 * sampler cut into pieces are joined once the last piece is in and decoded exactly as a whole
 * chunk would be; a piece out of byte order, of another size, or a whole copy while pieces are
 * arriving is refused; a wipe zeroes the pieces held. Pure: synthetic headers, no runtime.
 */
import assert from "node:assert/strict";
import {
  type ChunkHeader,
  encodePositions,
  encodeSampler,
  encodeTokens,
  StateValidationError,
} from "../core/mod.ts";
import { StagedTail } from "./_decode_tail.ts";

const N = 1000;

/** Headers and payloads of `payload` as pieces of `size` bytes (only fields take() reads). */
function pieces(kind: ChunkHeader["kind"], payload: Uint8Array, size: number) {
  const out: { h: ChunkHeader; payload: Uint8Array }[] = [];
  for (let a = 0; a < payload.byteLength; a += size) {
    const b = Math.min(payload.byteLength, a + size);
    const h = { kind, piece: { range: [a, b], of: payload.byteLength } } as unknown as ChunkHeader;
    out.push({ h, payload: payload.slice(a, b) });
  }
  return out;
}

const history = Int32Array.from({ length: N }, (_, i) => (i * 7919) % 950);
const sampling = { temperature: 0.8, topK: 40, topP: 0.95 };
const samplerBytes = encodeSampler({ params: sampling, state: { seed: 7, draws: 1 } });

Deno.test("history, positions and sampler in pieces are joined and decoded like whole chunks", () => {
  const tail = new StagedTail(N);
  const parts = [
    ...pieces("history", encodeTokens(history), 1500),
    ...pieces("positions", encodePositions({ nPast: N, seqId: 0, nPosPerToken: 1 }), 4),
    ...pieces("sampler", samplerBytes, 8),
  ];
  assert.ok(parts.length > 6);
  for (const { h, payload } of parts) tail.take(h, payload);
  assert.deepEqual(tail.history, history);
  assert.equal(tail.positions, N);
  assert.deepEqual(tail.sampler, { params: sampling, state: { seed: 7, draws: 1 } });
});

Deno.test("pieces out of byte order, of another size, or mixed with a whole copy are refused", () => {
  const parts = pieces("history", encodeTokens(history), 1500);
  const refused = (steps: { h: ChunkHeader; payload: Uint8Array }[], pattern: RegExp) => {
    const tail = new StagedTail(N);
    assert.throws(() => steps.forEach(({ h, payload }) => tail.take(h, payload)), (e: unknown) => {
      assert.ok(e instanceof StateValidationError, String(e));
      assert.match(e.message, pattern);
      return true;
    });
    assert.equal(tail.history, undefined);
  };
  refused([parts[0], parts[2]], /a piece at byte 3000 of 4000, expected byte 1500 of 4000/);
  refused([parts[1]], /a piece at byte 1500 of 4000, expected byte 0/);
  const piece = { range: [1500, 3000] as const, of: 8000 };
  const resized = { h: { ...parts[1].h, piece }, payload: parts[1].payload };
  refused([parts[0], resized], /of 8000, expected byte 1500 of 4000/);
  const whole = {
    h: { kind: "history" } as unknown as ChunkHeader,
    payload: encodeTokens(history),
  };
  refused([parts[0], whole], /history: it is arriving in pieces/);
});

Deno.test("a wipe zeroes the pieces held", () => {
  const parts = pieces("history", encodeTokens(history), 1500);
  const tail = new StagedTail(N);
  tail.take(parts[0].h, parts[0].payload);
  assert.ok(parts[0].payload.some((b) => b !== 0));
  tail.wipe();
  assert.ok(parts[0].payload.every((b) => b === 0));
  // A fresh start after the wipe: the first piece is expected again.
  for (const { h, payload } of pieces("history", encodeTokens(history), 1500)) {
    tail.take(h, payload);
  }
  assert.deepEqual(tail.history, history);
});
