import assert from "node:assert/strict";
import { InputFileError, UsageError } from "../core/errors.ts";
import { encodeGguf, type GgufTensor, gv } from "./gguf_writer.ts";
import { NeedMoreBytes, parseGgufHeader } from "./gguf_reader.ts";
import { readGgufFile, writeChunksToFile } from "./gguf_file.ts";
import { Rng } from "./_prng.ts";

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

const tensor = (name: string, n: number): GgufTensor => ({
  name,
  shape: [n],
  type: "f32",
  values: () => [new Float32Array(n).fill(1)],
});

function sampleFile(): Uint8Array {
  return concat(encodeGguf(
    [
      ["general.architecture", gv.str("llama")],
      ["tokens", gv.strs(["<unk>", "<s>", "a", "b"])],
      ["counts", gv.i32s([0, 1, 2])],
    ],
    [tensor("a", 5), tensor("b", 3)],
  ));
}

function isInputFileError(pattern: RegExp) {
  return (e: unknown) => e instanceof InputFileError && pattern.test(e.message);
}

Deno.test("parseGgufHeader() rejects bytes that are not GGUF with an InputFileError", () => {
  const text = new TextEncoder().encode("#!/bin/sh\necho hello\n");
  assert.throws(() => parseGgufHeader(text, { complete: true }), isInputFileError(/bad magic/));
});

Deno.test("parseGgufHeader() reports truncation at every cut point of a valid header", () => {
  const bytes = sampleFile();
  const info = parseGgufHeader(bytes, { complete: true });
  for (let cut = 0; cut < info.dataOffset - 31; cut++) {
    const prefix = bytes.subarray(0, cut);
    assert.throws(() => parseGgufHeader(prefix, { complete: false }), NeedMoreBytes);
    assert.throws(
      () => parseGgufHeader(prefix, { complete: true }),
      isInputFileError(/truncated/),
      `cut at ${cut}`,
    );
  }
});

Deno.test("parseGgufHeader() refuses a huge array length before allocating", () => {
  const bytes = sampleFile().slice();
  const view = new DataView(bytes.buffer);
  // Find the "tokens" array length (the u64 right after its item type STRING = 8).
  const key = new TextEncoder().encode("tokens");
  const at = bytes.findIndex((_, i) => key.every((b, j) => bytes[i + j] === b));
  assert.ok(at > 0);
  const lengthAt = at + key.length + 4 + 4;
  assert.equal(view.getBigUint64(lengthAt, true), 4n);
  view.setBigUint64(lengthAt, 1n << 20n, true); // more strings than bytes left to hold them
  assert.throws(() => parseGgufHeader(bytes, { complete: true }), isInputFileError(/truncated/));
  assert.throws(() => parseGgufHeader(bytes, { complete: false }), NeedMoreBytes);
  view.setBigUint64(lengthAt, 1n << 50n, true);
  assert.throws(() => parseGgufHeader(bytes, { complete: false }), isInputFileError(/limit/));
});

Deno.test("parseGgufHeader() refuses strings longer than stringBytesMax", () => {
  const bytes = concat(encodeGguf([["k", gv.str("x".repeat(100))]], []));
  assert.throws(
    () => parseGgufHeader(bytes, { complete: true, limits: { stringBytesMax: 50 } }),
    isInputFileError(/exceeds the limit of 50/),
  );
});

Deno.test("parseGgufHeader() refuses a tensor whose offset is not where it should be", () => {
  const bytes = sampleFile().slice();
  // Tensor info of "b": name (u64 length 1, "b"), 1 dimension, shape [3], type F32, offset.
  const info = [1, 0, 0, 0, 0, 0, 0, 0, 98, 1, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
  const at = bytes.findIndex((_, i) => info.every((b, j) => bytes[i + j] === b));
  const view = new DataView(bytes.buffer);
  assert.equal(view.getBigUint64(at + info.length, true), 32n);
  view.setBigUint64(at + info.length, 40n, true);
  assert.throws(
    () => parseGgufHeader(bytes, { complete: true }),
    isInputFileError(/offset 40, expected 32/),
  );
});

Deno.test("parseGgufHeader() fails only with InputFileError on randomly corrupted headers", () => {
  const original = sampleFile();
  const headerEnd = parseGgufHeader(original, { complete: true }).dataOffset;
  const rng = new Rng(7, "corruption");
  for (let trial = 0; trial < 2000; trial++) {
    const bytes = original.slice();
    const flips = 1 + (rng.nextU32() % 4);
    for (let f = 0; f < flips; f++) bytes[rng.nextU32() % headerEnd] = rng.nextU32() & 0xff;
    try {
      parseGgufHeader(bytes, { complete: true });
    } catch (e) {
      assert.ok(e instanceof InputFileError, `trial ${trial}: ${e}`);
    }
  }
});

Deno.test("readGgufFile() reads a header larger than its first read", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const tokens = Array.from({ length: 200_000 }, (_, i) => `token-${i}`);
    const path = `${dir}/big-header.gguf`;
    await writeChunksToFile(path, encodeGguf([["tokens", gv.strs(tokens)]], [tensor("t", 8)]));
    const info = await readGgufFile(path);
    assert.ok(info.dataOffset > 1 << 20);
    assert.equal((info.metadata.get("tokens")!.value as string[])[199_999], "token-199999");
    assert.equal(info.fileBytes, info.dataEnd);
    await assert.rejects(
      () => readGgufFile(path, { headerBytesMax: 1 << 20 }),
      isInputFileError(/needs more than 1048576 bytes/),
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("readGgufFile() reports a file whose tensor data is cut short", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const bytes = sampleFile();
    const path = `${dir}/short.gguf`;
    await Deno.writeFile(path, bytes.subarray(0, bytes.length - 40));
    await assert.rejects(() => readGgufFile(path), isInputFileError(/truncated \(tensor data/));
    await assert.rejects(() => readGgufFile(`${dir}/missing.gguf`), isInputFileError(/no such/));
    await assert.rejects(() => readGgufFile(dir), isInputFileError(/not a regular file/));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("writeChunksToFile() names an unwritable path and leaves nothing behind", async () => {
  const dir = await Deno.makeTempDir();
  try {
    await assert.rejects(
      () => writeChunksToFile(`${dir}/no/such/folder/m.gguf`, [new Uint8Array(4)]),
      (e: unknown) => e instanceof UsageError && /folder does not exist/.test(e.message),
    );
    await assert.rejects(
      () => writeChunksToFile(dir, [new Uint8Array(4)]),
      (e: unknown) => e instanceof UsageError && /is a directory/.test(e.message),
    );
    const failing = async function* () {
      yield new Uint8Array(4);
      throw new Error("generator broke");
    };
    await assert.rejects(() => writeChunksToFile(`${dir}/m.gguf`, failing()), /generator broke/);
    const left = [...Deno.readDirSync(dir)].map((e) => e.name);
    assert.deepEqual(left, []);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("parseGgufHeader() refuses arrays with more items than arrayItemsMax", () => {
  const bytes = concat(encodeGguf([["k", gv.i32s([1, 2, 3, 4, 5])]], []));
  assert.throws(
    () => parseGgufHeader(bytes, { complete: true, limits: { arrayItemsMax: 4 } }),
    isInputFileError(/5 items exceeds the limit of 4/),
  );
});
