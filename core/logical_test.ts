import assert from "node:assert/strict";
import { canonicalEncode } from "./bytes.ts";
import { StateValidationError } from "./errors.ts";
import {
  decodePositions,
  decodeSampler,
  decodeTokens,
  encodePositions,
  encodeSampler,
  encodeTokens,
} from "./logical.ts";

Deno.test("positions and sampler payloads round-trip", () => {
  const positions = { nPast: 4096, seqId: 0, nPosPerToken: 1 };
  assert.deepEqual(decodePositions(encodePositions(positions)), positions);
  const greedy = { params: { temperature: 0 }, state: { seed: 0, draws: 0 } };
  assert.deepEqual(decodeSampler(encodeSampler(greedy)), greedy);
  const seeded = {
    params: { temperature: 0.8, topK: 40, topP: 0.95 },
    state: { seed: 7, draws: 12 },
  };
  assert.deepEqual(decodeSampler(encodeSampler(seeded)), seeded);
});

Deno.test("token payloads are little-endian i32 and refuse ragged or negative input", () => {
  const bytes = encodeTokens([1, 256, 70000]);
  assert.deepEqual([...bytes.subarray(0, 8)], [1, 0, 0, 0, 0, 1, 0, 0]);
  assert.deepEqual([...decodeTokens(bytes)], [1, 256, 70000]);
  assert.throws(() => decodeTokens(bytes.subarray(0, 5)), StateValidationError);
  assert.throws(
    () => decodeTokens(encodeTokens([-1]), "first-token"),
    /first-token component: token 0/,
  );
});

Deno.test("logical decoders refuse malformed payloads with StateValidationError", () => {
  const bad = [
    new Uint8Array([0xc1]),
    canonicalEncode([1, 2]),
    canonicalEncode({ v: 2, nPast: 1, seqId: 0, nPosPerToken: 1 }),
    canonicalEncode({ v: 1, nPast: 0, seqId: 0, nPosPerToken: 1 }),
    canonicalEncode({ v: 1, nPast: 5, seqId: 999, nPosPerToken: 1 }),
  ];
  for (const b of bad) assert.throws(() => decodePositions(b), StateValidationError);
  const badSampler = [
    canonicalEncode({ v: 1, params: { temperature: -1 }, state: { seed: 0, draws: 0 } }),
    canonicalEncode({ v: 1, params: { temperature: 1, topP: 2 }, state: { seed: 0, draws: 0 } }),
    canonicalEncode({ v: 1, params: { temperature: 1 }, state: { seed: 0, draws: -3 } }),
    canonicalEncode({ v: 1, params: null, state: null }),
  ];
  for (const b of badSampler) assert.throws(() => decodeSampler(b), StateValidationError);
});
