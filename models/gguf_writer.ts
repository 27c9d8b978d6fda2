/**
 * A streaming GGUF v3 encoder. Pure: it turns typed metadata and lazily produced tensors into
 * byte chunks and never touches a file, so a multi-gigabyte model never sits in memory. The
 * caller writes the chunks wherever it likes (`writeChunksToFile` in `write_file.ts`).
 *
 * Layout (ggml `gguf.cpp`): magic, version, tensor count (u64), metadata count (u64), the
 * metadata, the tensor infos, zero padding to the alignment, then each tensor's data padded to
 * the alignment. Tensor offsets are relative to the start of the data section and sequential,
 * which llama.cpp checks.
 */
import { assert } from "../core/errors.ts";
import {
  alignUp,
  GGUF_DEFAULT_ALIGNMENT,
  GGUF_MAGIC,
  GGUF_VERSION,
  GgufValueType,
  WEIGHT_TYPE_CODE,
  type WeightType,
} from "./_gguf_types.ts";

/**
 * A typed metadata value. llama.cpp checks scalar types strictly: integer hyperparameters are
 * `u32`, floating ones `f32`; per-layer arrays may be `i32[]` or `u32[]`.
 */
export type GgufValue =
  | { readonly type: "u32"; readonly value: number }
  | { readonly type: "i32"; readonly value: number }
  | { readonly type: "f32"; readonly value: number }
  | { readonly type: "bool"; readonly value: boolean }
  | { readonly type: "string"; readonly value: string }
  | { readonly type: "u32[]"; readonly value: readonly number[] }
  | { readonly type: "i32[]"; readonly value: readonly number[] }
  | { readonly type: "f32[]"; readonly value: readonly number[] }
  | { readonly type: "string[]"; readonly value: readonly string[] };

/** Constructors that keep metadata tables short: `["llama.block_count", gv.u32(4)]`. */
export const gv = {
  u32: (value: number): GgufValue => ({ type: "u32", value }),
  i32: (value: number): GgufValue => ({ type: "i32", value }),
  f32: (value: number): GgufValue => ({ type: "f32", value }),
  bool: (value: boolean): GgufValue => ({ type: "bool", value }),
  str: (value: string): GgufValue => ({ type: "string", value }),
  u32s: (value: readonly number[]): GgufValue => ({ type: "u32[]", value }),
  i32s: (value: readonly number[]): GgufValue => ({ type: "i32[]", value }),
  f32s: (value: readonly number[]): GgufValue => ({ type: "f32[]", value }),
  strs: (value: readonly string[]): GgufValue => ({ type: "string[]", value }),
};

/** Metadata in file order. Keys must be unique. */
export type GgufMetadata = ReadonlyArray<readonly [string, GgufValue]>;

/** A tensor whose values are produced only when its turn comes in the stream. */
export interface GgufTensor {
  /** At most 63 bytes of UTF-8 (ggml's GGML_MAX_NAME minus the terminator). */
  readonly name: string;
  /** ggml order: `shape[0]` is the contiguous row length. One to four dimensions. */
  readonly shape: readonly number[];
  readonly type: WeightType;
  /** Yields the values in ggml element order, in blocks of any length. */
  values(): Iterable<Float32Array>;
}

export interface GgufEncodeOptions {
  /** Must equal `general.alignment` when the metadata has it. Default 32. */
  alignment?: number;
  /** Upper bound of one tensor-data chunk. Default 1 MiB. */
  chunkBytesMax?: number;
}

/** Sizes known before any tensor value is generated: enough for a progress bar. */
export interface GgufLayout {
  /** Bytes before the data section (header, metadata, tensor infos, padding). */
  readonly dataOffset: number;
  /** Per tensor, its offset inside the data section. */
  readonly tensorOffsets: readonly number[];
  readonly totalBytes: number;
}

const NAME_BYTES_MAX = 63;
const DIMS_MAX = 4;
const textEncoder = new TextEncoder();

/** Element count of a shape. */
export function elementCount(shape: readonly number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

/** Data bytes of one tensor, before padding. */
export function tensorDataBytes(tensor: Pick<GgufTensor, "shape" | "type">): number {
  return elementCount(tensor.shape) * (tensor.type === "f32" ? 4 : 2);
}

/** Computes where everything will go, validating the inputs (programmer errors assert). */
export function layoutGguf(
  metadata: GgufMetadata,
  tensors: readonly GgufTensor[],
  options: GgufEncodeOptions = {},
): GgufLayout {
  const alignment = checkAlignment(metadata, options.alignment);
  checkUnique(metadata.map(([key]) => key), "metadata key");
  checkUnique(tensors.map((t) => t.name), "tensor name");
  let headerBytes = 4 + 4 + 8 + 8;
  for (const [key, value] of metadata) headerBytes += stringBytes(key) + 4 + valueBytes(value);
  const tensorOffsets: number[] = [];
  let dataBytes = 0;
  for (const tensor of tensors) {
    checkTensor(tensor);
    headerBytes += stringBytes(tensor.name) + 4 + 8 * tensor.shape.length + 4 + 8;
    tensorOffsets.push(dataBytes);
    dataBytes += alignUp(tensorDataBytes(tensor), alignment);
  }
  const dataOffset = alignUp(headerBytes, alignment);
  return { dataOffset, tensorOffsets, totalBytes: dataOffset + dataBytes };
}

/**
 * Encodes a whole GGUF file as a sequence of chunks: first the header (metadata and tensor
 * infos, padded), then tensor data in chunks of at most `chunkBytesMax`. Each chunk is a fresh
 * buffer the consumer may keep.
 */
export function* encodeGguf(
  metadata: GgufMetadata,
  tensors: readonly GgufTensor[],
  options: GgufEncodeOptions = {},
): Generator<Uint8Array> {
  const layout = layoutGguf(metadata, tensors, options);
  const alignment = checkAlignment(metadata, options.alignment);
  yield encodeHeader(metadata, tensors, layout);
  const chunker = new Chunker(options.chunkBytesMax ?? 1 << 20);
  for (const tensor of tensors) {
    const dataBytes = tensorDataBytes(tensor);
    let written = 0;
    for (const block of tensor.values()) {
      const bytes = encodeValues(block, tensor.type);
      written += bytes.byteLength;
      assert(written <= dataBytes, `tensor "${tensor.name}" produced too many values`);
      yield* chunker.push(bytes);
    }
    assert(
      written === dataBytes,
      `tensor "${tensor.name}" produced ${written} of ${dataBytes} bytes`,
    );
    yield* chunker.push(new Uint8Array(alignUp(dataBytes, alignment) - dataBytes));
  }
  yield* chunker.flush();
}

function checkAlignment(metadata: GgufMetadata, requested: number | undefined): number {
  const entry = metadata.find(([key]) => key === "general.alignment");
  const fromMetadata = entry === undefined ? undefined : entry[1];
  if (fromMetadata !== undefined) {
    assert(fromMetadata.type === "u32", "general.alignment must be a u32");
  }
  const alignment = requested ?? (fromMetadata?.value as number | undefined) ??
    GGUF_DEFAULT_ALIGNMENT;
  assert(alignment > 0 && (alignment & (alignment - 1)) === 0, "alignment must be a power of 2");
  assert(fromMetadata === undefined || fromMetadata.value === alignment, "alignment mismatch");
  return alignment;
}

function checkUnique(names: readonly string[], what: string): void {
  const seen = new Set<string>();
  for (const name of names) {
    assert(!seen.has(name), `duplicate ${what} "${name}"`);
    seen.add(name);
  }
}

function checkTensor(tensor: GgufTensor): void {
  assert(textEncoder.encode(tensor.name).length <= NAME_BYTES_MAX, `name too long: ${tensor.name}`);
  assert(tensor.shape.length >= 1 && tensor.shape.length <= DIMS_MAX, `bad rank: ${tensor.name}`);
  for (const dim of tensor.shape) {
    assert(Number.isSafeInteger(dim) && dim > 0, `bad dimension in ${tensor.name}: ${dim}`);
  }
}

function stringBytes(s: string): number {
  return 8 + textEncoder.encode(s).length;
}

function valueBytes(v: GgufValue): number {
  switch (v.type) {
    case "u32":
    case "i32":
    case "f32":
      return 4;
    case "bool":
      return 1;
    case "string":
      return stringBytes(v.value);
    case "u32[]":
    case "i32[]":
    case "f32[]":
      return 4 + 8 + 4 * v.value.length;
    case "string[]":
      return 4 + 8 + v.value.reduce((sum, s) => sum + stringBytes(s), 0);
  }
}

function encodeHeader(
  metadata: GgufMetadata,
  tensors: readonly GgufTensor[],
  layout: GgufLayout,
): Uint8Array {
  const out = new ByteWriter(layout.dataOffset);
  out.u32(GGUF_MAGIC);
  out.u32(GGUF_VERSION);
  out.u64(tensors.length);
  out.u64(metadata.length);
  for (const [key, value] of metadata) {
    out.string(key);
    writeValue(out, value);
  }
  tensors.forEach((tensor, i) => {
    out.string(tensor.name);
    out.u32(tensor.shape.length);
    for (const dim of tensor.shape) out.u64(dim);
    out.u32(WEIGHT_TYPE_CODE[tensor.type]);
    out.u64(layout.tensorOffsets[i]);
  });
  assert(out.offset <= layout.dataOffset, "header larger than planned");
  return out.bytes; // the remainder is already zero: that is the padding
}

function writeValue(out: ByteWriter, v: GgufValue): void {
  const T = GgufValueType;
  switch (v.type) {
    case "u32":
      return out.typed(T.UINT32, () => out.u32(v.value));
    case "i32":
      return out.typed(T.INT32, () => out.i32(v.value));
    case "f32":
      return out.typed(T.FLOAT32, () => out.f32(v.value));
    case "bool":
      return out.typed(T.BOOL, () => out.u8(v.value ? 1 : 0));
    case "string":
      return out.typed(T.STRING, () => out.string(v.value));
    case "u32[]":
      return out.array(T.UINT32, v.value.length, () => v.value.forEach((x) => out.u32(x)));
    case "i32[]":
      return out.array(T.INT32, v.value.length, () => v.value.forEach((x) => out.i32(x)));
    case "f32[]":
      return out.array(T.FLOAT32, v.value.length, () => v.value.forEach((x) => out.f32(x)));
    case "string[]":
      return out.array(T.STRING, v.value.length, () => v.value.forEach((x) => out.string(x)));
  }
}

/** Little-endian writes into a buffer of known size. */
class ByteWriter {
  readonly bytes: Uint8Array;
  offset = 0;
  readonly #view: DataView;

  constructor(size: number) {
    this.bytes = new Uint8Array(size);
    this.#view = new DataView(this.bytes.buffer);
  }

  u8(x: number): void {
    this.#view.setUint8(this.offset, x);
    this.offset += 1;
  }
  u32(x: number): void {
    assert(Number.isInteger(x) && x >= 0 && x <= 0xffffffff, `not a u32: ${x}`);
    this.#view.setUint32(this.offset, x, true);
    this.offset += 4;
  }
  i32(x: number): void {
    assert(Number.isInteger(x) && x >= -0x80000000 && x <= 0x7fffffff, `not an i32: ${x}`);
    this.#view.setInt32(this.offset, x, true);
    this.offset += 4;
  }
  f32(x: number): void {
    this.#view.setFloat32(this.offset, x, true);
    this.offset += 4;
  }
  u64(x: number): void {
    assert(Number.isSafeInteger(x) && x >= 0, `not a u64: ${x}`);
    this.#view.setBigUint64(this.offset, BigInt(x), true);
    this.offset += 8;
  }
  string(s: string): void {
    const utf8 = textEncoder.encode(s);
    this.u64(utf8.length);
    this.bytes.set(utf8, this.offset);
    this.offset += utf8.length;
  }
  typed(type: number, body: () => void): void {
    this.u32(type);
    body();
  }
  array(itemType: number, length: number, body: () => void): void {
    this.u32(GgufValueType.ARRAY);
    this.u32(itemType);
    this.u64(length);
    body();
  }
}

const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/** Values to little-endian bytes of the tensor type; f16 rounds to nearest, ties to even. */
function encodeValues(block: Float32Array, type: WeightType): Uint8Array {
  assert(LITTLE_ENDIAN, "GGUF encoding assumes a little-endian host");
  const typed = type === "f32" ? block : new Float16Array(block);
  return new Uint8Array(typed.buffer, typed.byteOffset, typed.byteLength);
}

/** Packs byte runs into chunks of exactly `size` bytes (the last may be shorter). */
class Chunker {
  #chunk: Uint8Array;
  #used = 0;

  constructor(readonly size: number) {
    assert(size > 0, "chunk size must be positive");
    this.#chunk = new Uint8Array(size);
  }

  *push(bytes: Uint8Array): Generator<Uint8Array> {
    let from = 0;
    while (from < bytes.byteLength) {
      const n = Math.min(this.size - this.#used, bytes.byteLength - from);
      this.#chunk.set(bytes.subarray(from, from + n), this.#used);
      this.#used += n;
      from += n;
      if (this.#used === this.size) {
        yield this.#chunk;
        this.#chunk = new Uint8Array(this.size);
        this.#used = 0;
      }
    }
  }

  *flush(): Generator<Uint8Array> {
    if (this.#used > 0) yield this.#chunk.subarray(0, this.#used);
    this.#used = 0;
  }
}
