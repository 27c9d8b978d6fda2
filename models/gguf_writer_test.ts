import assert from "node:assert/strict";
import { encodeGguf, type GgufMetadata, type GgufTensor, gv, layoutGguf } from "./gguf_writer.ts";
import { parseGgufHeader } from "./gguf_reader.ts";

function concat(chunks: Iterable<Uint8Array>): Uint8Array {
  const parts = [...chunks];
  const out = new Uint8Array(parts.reduce((n, c) => n + c.byteLength, 0));
  let at = 0;
  for (const c of parts) {
    out.set(c, at);
    at += c.byteLength;
  }
  return out;
}

function tensorOf(
  name: string,
  shape: number[],
  type: "f32" | "f16",
  values: number[],
): GgufTensor {
  return { name, shape, type, values: () => [Float32Array.from(values)] };
}

const METADATA: GgufMetadata = [
  ["general.architecture", gv.str("llama")],
  ["general.alignment", gv.u32(32)],
  ["test.u32", gv.u32(4294967295)],
  ["test.i32", gv.i32(-7)],
  ["test.f32", gv.f32(0.5)],
  ["test.bool", gv.bool(true)],
  ["test.unicode", gv.str("▁héllo ✓")],
  ["test.u32s", gv.u32s([0, 1, 4294967295])],
  ["test.i32s", gv.i32s([-1, 0, 2147483647])],
  ["test.f32s", gv.f32s([1.5, -2.25, 0])],
  ["test.strs", gv.strs(["a", "", "<0x0A>"])],
];

Deno.test("encodeGguf() output parses back to the same metadata and tensor infos", () => {
  const tensors = [
    tensorOf("a.weight", [3, 2], "f32", [1, 2, 3, 4, 5, 6]),
    tensorOf("b.weight", [5], "f16", [1, -2, 0.5, 65504, 0]),
  ];
  const bytes = concat(encodeGguf(METADATA, tensors));
  const info = parseGgufHeader(bytes, { complete: true });
  assert.equal(info.version, 3);
  assert.equal(info.alignment, 32);
  assert.deepEqual(
    [...info.metadata].map(([k, v]) => [k, v]),
    METADATA.map(([k, v]) => [k, { type: v.type, value: v.value }]),
  );
  assert.deepEqual(info.tensors.map((t) => [t.name, t.shape, t.typeName, t.offset, t.bytes]), [
    ["a.weight", [3, 2], "F32", 0, 24],
    ["b.weight", [5], "F16", 32, 10],
  ]);
  const a = new Float32Array(bytes.slice(info.dataOffset, info.dataOffset + 24).buffer);
  assert.deepEqual([...a], [1, 2, 3, 4, 5, 6]);
});

Deno.test("encodeGguf() aligns the data section and every tensor, padding the file", () => {
  const tensors = [
    tensorOf("x", [7], "f32", [1, 2, 3, 4, 5, 6, 7]),
    tensorOf("y", [3], "f16", [1, 2, 3]),
  ];
  const layout = layoutGguf(METADATA, tensors);
  const bytes = concat(encodeGguf(METADATA, tensors));
  assert.equal(bytes.byteLength, layout.totalBytes);
  assert.equal(layout.dataOffset % 32, 0);
  assert.deepEqual(layout.tensorOffsets, [0, 32]);
  assert.equal(layout.totalBytes, layout.dataOffset + 64);
  // Padding after a tensor's data is zero.
  assert.deepEqual([...bytes.subarray(layout.dataOffset + 28, layout.dataOffset + 32)], [
    0,
    0,
    0,
    0,
  ]);
});

Deno.test("encodeGguf() streams tensor data in chunks of at most chunkBytesMax", () => {
  const big: GgufTensor = {
    name: "big",
    shape: [1000, 10],
    type: "f32",
    *values() {
      for (let i = 0; i < 10; i++) yield new Float32Array(1000).fill(i);
    },
  };
  const chunks = [...encodeGguf(METADATA, [big], { chunkBytesMax: 4096 })];
  const dataChunks = chunks.slice(1);
  assert.ok(dataChunks.length >= 10);
  for (const c of dataChunks) assert.ok(c.byteLength <= 4096);
  const bytes = concat(chunks);
  const info = parseGgufHeader(bytes, { complete: true });
  const view = new DataView(bytes.buffer, info.dataOffset);
  assert.equal(view.getFloat32(4 * 9999, true), 9);
});

Deno.test("encodeGguf() converts f32 to f16 rounding to nearest, ties to even", () => {
  const cases: [number, number][] = [
    [1, 0x3c00],
    [-2, 0xc000],
    [0.1, 0x2e66],
    [65504, 0x7bff],
    [65520, 0x7c00], // rounds up to infinity
    [2 ** -24, 0x0001], // smallest subnormal
    [2 ** -25, 0x0000], // exactly half of it: ties to even (zero)
    [1.5 * 2 ** -25, 0x0001],
    [1 + 2 ** -11, 0x3c00], // tie between 0x3c00 and 0x3c01: even wins
    [1 + 3 * 2 ** -11, 0x3c02], // tie between 0x3c01 and 0x3c02: even wins
    [Infinity, 0x7c00],
  ];
  const tensor = tensorOf("h", [cases.length], "f16", cases.map(([x]) => x));
  const bytes = concat(encodeGguf([], [tensor]));
  const info = parseGgufHeader(bytes, { complete: true });
  const view = new DataView(bytes.buffer, info.dataOffset);
  cases.forEach(([x, bits], i) => assert.equal(view.getUint16(2 * i, true), bits, `f16(${x})`));
});

Deno.test("encodeGguf() refuses a tensor that yields the wrong number of values", () => {
  const short = tensorOf("short", [4], "f32", [1, 2, 3]);
  assert.throws(() => [...encodeGguf([], [short])], /produced 12 of 16 bytes/);
  const long = tensorOf("long", [2], "f32", [1, 2, 3]);
  assert.throws(() => [...encodeGguf([], [long])], /too many values/);
});

Deno.test("layoutGguf() rejects duplicate keys, duplicate tensors and bad shapes", () => {
  const t = tensorOf("t", [1], "f32", [1]);
  assert.throws(() => layoutGguf([["k", gv.u32(1)], ["k", gv.u32(2)]], []), /duplicate metadata/);
  assert.throws(() => layoutGguf([], [t, t]), /duplicate tensor/);
  assert.throws(() => layoutGguf([], [tensorOf("z", [0], "f32", [])]), /bad dimension/);
  assert.throws(() => layoutGguf([], [tensorOf("n".repeat(64), [1], "f32", [1])]), /too long/);
  assert.throws(() => layoutGguf([["general.alignment", gv.u32(24)]], []), /power of 2/);
  assert.throws(() => [...encodeGguf([["bad", gv.u32(-1)]], [])], /not a u32/);
});
