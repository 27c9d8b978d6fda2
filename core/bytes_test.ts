import assert from "node:assert/strict";
import {
  canonicalEncode,
  decodeMsgpack,
  fromHex,
  hmacSha256,
  randomBytes,
  sha256Hex,
  toHex,
  utf8,
  verifyHmacSha256,
} from "./bytes.ts";
import { ProtocolError } from "./errors.ts";

Deno.test("toHex() and fromHex() round-trip every byte value", () => {
  const all = Uint8Array.from({ length: 256 }, (_, i) => i);
  assert.deepEqual(fromHex(toHex(all)), all);
  assert.equal(toHex(new Uint8Array([0, 255])), "00ff");
});

Deno.test("fromHex() rejects odd lengths and non-hex digits", () => {
  assert.throws(() => fromHex("abc"), ProtocolError);
  assert.throws(() => fromHex("zz"), ProtocolError);
});

Deno.test("canonicalEncode() gives the same bytes whatever the key order", () => {
  const a = canonicalEncode({ b: 1, a: { y: [1, 2], x: "s" }, c: true });
  const b = canonicalEncode({ c: true, a: { x: "s", y: [1, 2] }, b: 1 });
  assert.deepEqual(a, b);
  assert.deepEqual(decodeMsgpack(a), { a: { x: "s", y: [1, 2] }, b: 1, c: true });
});

Deno.test("canonicalEncode() refuses undefined fields and non-finite numbers", () => {
  assert.throws(() => canonicalEncode({ a: undefined }));
  assert.throws(() => canonicalEncode({ a: NaN }));
  assert.throws(() => canonicalEncode(new Map()));
});

Deno.test("canonicalEncode() returns fresh bytes, not a view onto a reused buffer", () => {
  const first = canonicalEncode({ a: 1 });
  const copy = first.slice();
  canonicalEncode({ a: 2, b: "overwrite" });
  assert.deepEqual(first, copy);
  assert.equal(first.byteOffset, 0);
  assert.equal(first.buffer.byteLength, first.length);
});

Deno.test("sha256Hex() matches the known digest of 'abc'", async () => {
  assert.equal(
    await sha256Hex(utf8("abc")),
    "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
  );
});

Deno.test("verifyHmacSha256() accepts the right tag and rejects a flipped bit or another key", async () => {
  const key = randomBytes(32);
  const data = utf8("chunk header");
  const tag = await hmacSha256(key, data);
  assert.equal(await verifyHmacSha256(key, data, tag), true);
  const flipped = tag.slice();
  flipped[0] ^= 1;
  assert.equal(await verifyHmacSha256(key, data, flipped), false);
  assert.equal(await verifyHmacSha256(randomBytes(32), data, tag), false);
  assert.equal(await verifyHmacSha256(key, data, tag.subarray(0, 16)), false);
});

Deno.test("decodeMsgpack() throws ProtocolError on truncated input", () => {
  const bytes = canonicalEncode({ field: "value" });
  assert.throws(() => decodeMsgpack(bytes.subarray(0, 3)), ProtocolError);
});
