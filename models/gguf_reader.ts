/**
 * Reads the metadata and tensor infos of a GGUF file (never the tensor data). The parser is
 * pure and works on a prefix of the file; `readGgufFile` feeds it growing prefixes until the
 * header fits, up to `headerBytesMax`. Every count and length is checked against the bytes
 * that could hold it before anything is allocated, so a corrupt or hostile file fails with an
 * `InputFileError` instead of exhausting memory.
 */
import { InputFileError } from "../core/errors.ts";
import {
  alignUp,
  ggmlTensorBytes,
  ggmlTypeName,
  GGUF_DEFAULT_ALIGNMENT,
  GGUF_MAGIC,
  GGUF_VERSION,
  GgufValueType,
  SCALAR_BYTES,
} from "./_gguf_types.ts";

/** A scalar or array value as read. 64-bit integers come back as bigint. */
export type GgufReadScalar = number | bigint | boolean | string;
export interface GgufReadValue {
  /** "u32", "f32", "string", ... or "u32[]", "string[]", ... for arrays. */
  readonly type: string;
  readonly value: GgufReadScalar | readonly GgufReadScalar[];
}

export interface GgufTensorInfo {
  readonly name: string;
  /** ggml order: `shape[0]` is the contiguous row length. */
  readonly shape: readonly number[];
  readonly typeCode: number;
  readonly typeName: string;
  /** Offset inside the data section. */
  readonly offset: number;
  readonly bytes: number;
}

export interface GgufFileInfo {
  readonly version: number;
  readonly alignment: number;
  readonly metadata: ReadonlyMap<string, GgufReadValue>;
  readonly tensors: readonly GgufTensorInfo[];
  /** Absolute offset of the data section. */
  readonly dataOffset: number;
  /** Absolute offset just past the last tensor's padded data. */
  readonly dataEnd: number;
}

export interface GgufReadLimits {
  /** Most bytes of header (metadata + tensor infos) read before giving up. Default 256 MiB. */
  headerBytesMax?: number;
  /** Longest string accepted. Default 64 MiB. */
  stringBytesMax?: number;
  /** Most metadata entries or tensors accepted. Default 1 Mi each. */
  entriesMax?: number;
  /** Most items in one metadata array. Default 16 Mi (real vocabularies are ~256 Ki). */
  arrayItemsMax?: number;
}

/** Thrown by the parser when the prefix it was given ends early; the edge reads more. */
export class NeedMoreBytes extends Error {
  constructor(readonly bytesNeeded: number) {
    super(`need at least ${bytesNeeded} bytes`);
  }
}

const TYPE_NAMES: Readonly<Record<number, string>> = {
  0: "u8",
  1: "i8",
  2: "u16",
  3: "i16",
  4: "u32",
  5: "i32",
  6: "f32",
  7: "bool",
  8: "string",
  10: "u64",
  11: "i64",
  12: "f64",
};

/**
 * Parses the header of a GGUF file from `bytes`, a prefix of the file. When `complete` is
 * false and the prefix ends early, throws `NeedMoreBytes`; when true, a short file is an
 * `InputFileError` ("truncated").
 */
export function parseGgufHeader(
  bytes: Uint8Array,
  options: { complete: boolean; source?: string; limits?: GgufReadLimits },
): GgufFileInfo {
  const source = options.source ?? "input";
  const limits = options.limits ?? {};
  const r = new Cursor(bytes, options.complete, source, limits);
  if (bytes.length >= 4 && r.view.getUint32(0, true) !== GGUF_MAGIC) {
    throw r.corrupt("not a GGUF file (bad magic)");
  }
  r.u32();
  const version = r.u32();
  if (version < 2 || version > GGUF_VERSION) {
    throw r.corrupt(`unsupported GGUF version ${version}`, "only versions 2 and 3 are read");
  }
  const tensorCount = r.count("tensor", limits.entriesMax);
  const kvCount = r.count("metadata entry", limits.entriesMax);
  const metadata = new Map<string, GgufReadValue>();
  for (let i = 0; i < kvCount; i++) {
    const key = r.string();
    if (metadata.has(key)) throw r.corrupt(`duplicate metadata key "${key}"`);
    metadata.set(key, readValue(r, key));
  }
  const alignment = readAlignment(metadata, r);
  const tensors = readTensorInfos(r, tensorCount, alignment);
  const dataOffset = alignUp(r.offset, alignment);
  const last = tensors.at(-1);
  const dataEnd = dataOffset + (last ? last.offset + alignUp(last.bytes, alignment) : 0);
  return { version, alignment, metadata, tensors, dataOffset, dataEnd };
}

function readValue(r: Cursor, key: string): GgufReadValue {
  const type = r.u32();
  if (type !== GgufValueType.ARRAY) {
    return { type: r.typeName(type, key), value: r.scalar(type, key) };
  }
  const itemType = r.u32();
  if (itemType === GgufValueType.ARRAY) throw r.corrupt(`nested array in "${key}"`);
  const itemName = r.typeName(itemType, key);
  const length = r.u64();
  if (length > r.arrayItemsMax) {
    throw r.corrupt(`array "${key}" of ${length} items exceeds the limit of ${r.arrayItemsMax}`);
  }
  const itemBytesMin = itemType === GgufValueType.STRING ? 8 : SCALAR_BYTES[itemType];
  r.need(length * itemBytesMin, `array "${key}" of ${length} items`);
  const value: GgufReadScalar[] = new Array(length);
  for (let i = 0; i < length; i++) value[i] = r.scalar(itemType, key);
  return { type: `${itemName}[]`, value };
}

function readAlignment(metadata: ReadonlyMap<string, GgufReadValue>, r: Cursor): number {
  const entry = metadata.get("general.alignment");
  if (entry === undefined) return GGUF_DEFAULT_ALIGNMENT;
  const value = entry.value;
  if (entry.type !== "u32" || typeof value !== "number" || value === 0 || (value & (value - 1))) {
    throw r.corrupt("general.alignment is not a u32 power of two");
  }
  return value;
}

function readTensorInfos(r: Cursor, count: number, alignment: number): GgufTensorInfo[] {
  const tensors: GgufTensorInfo[] = [];
  const names = new Set<string>();
  let expectedOffset = 0;
  for (let i = 0; i < count; i++) {
    const name = r.string();
    if (names.has(name)) throw r.corrupt(`duplicate tensor "${name}"`);
    names.add(name);
    const rank = r.u32();
    if (rank < 1 || rank > 4) throw r.corrupt(`tensor "${name}" has ${rank} dimensions`);
    const shape: number[] = [];
    for (let d = 0; d < rank; d++) shape.push(r.u64());
    const elements = shape.reduce((a, b) => a * b, 1);
    if (!Number.isSafeInteger(elements)) throw r.corrupt(`tensor "${name}" is too large`);
    const typeCode = r.u32();
    const typeName = ggmlTypeName(typeCode);
    const bytes = ggmlTensorBytes(typeCode, shape[0], elements);
    if (typeName === undefined || bytes === undefined) {
      throw r.corrupt(`tensor "${name}" has unknown type ${typeCode} for row length ${shape[0]}`);
    }
    const offset = r.u64();
    if (offset !== expectedOffset) {
      throw r.corrupt(`tensor "${name}" has offset ${offset}, expected ${expectedOffset}`);
    }
    expectedOffset += alignUp(bytes, alignment);
    tensors.push({ name, shape, typeCode, typeName, offset, bytes });
  }
  return tensors;
}

/** Little-endian reads over a prefix, with bounds checked before every read. */
class Cursor {
  readonly view: DataView;
  offset = 0;
  readonly stringBytesMax: number;
  readonly arrayItemsMax: number;
  readonly #decoder = new TextDecoder("utf-8", { fatal: true });

  constructor(
    readonly bytes: Uint8Array,
    readonly complete: boolean,
    readonly source: string,
    limits: GgufReadLimits,
  ) {
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.stringBytesMax = limits.stringBytesMax ?? 64 << 20;
    this.arrayItemsMax = limits.arrayItemsMax ?? 16 << 20;
  }

  corrupt(detail: string, hint = "the file is damaged or not a GGUF model"): InputFileError {
    return new InputFileError(`Cannot read GGUF file "${this.source}": ${detail}`, { hint });
  }

  /** Ensures `n` more bytes are available (n may be huge: it is checked, never allocated). */
  need(n: number, what: string): void {
    if (this.offset + n <= this.bytes.length) return;
    if (!this.complete) throw new NeedMoreBytes(this.offset + n);
    throw this.corrupt(`truncated at byte ${this.offset} while reading ${what}`);
  }

  u32(): number {
    this.need(4, "a u32");
    const x = this.view.getUint32(this.offset, true);
    this.offset += 4;
    return x;
  }

  u64(): number {
    this.need(8, "a u64");
    const x = this.view.getBigUint64(this.offset, true);
    if (x > BigInt(Number.MAX_SAFE_INTEGER)) throw this.corrupt(`value ${x} out of range`);
    this.offset += 8;
    return Number(x);
  }

  count(what: string, max = 1 << 20): number {
    const n = this.u64();
    if (n > max) throw this.corrupt(`${n} ${what}s exceed the limit of ${max}`);
    return n;
  }

  string(): string {
    const length = this.u64();
    if (length > this.stringBytesMax) {
      throw this.corrupt(`string of ${length} bytes exceeds the limit of ${this.stringBytesMax}`);
    }
    this.need(length, "a string");
    const start = this.offset;
    this.offset += length;
    try {
      return this.#decoder.decode(this.bytes.subarray(start, this.offset));
    } catch {
      throw this.corrupt(`invalid UTF-8 in a string at byte ${start}`);
    }
  }

  typeName(type: number, key: string): string {
    const name = TYPE_NAMES[type];
    if (name === undefined) throw this.corrupt(`unknown value type ${type} for "${key}"`);
    return name;
  }

  scalar(type: number, key: string): GgufReadScalar {
    if (type === GgufValueType.STRING) return this.string();
    const size = SCALAR_BYTES[type];
    if (size === undefined) throw this.corrupt(`unknown value type ${type} for "${key}"`);
    this.need(size, `"${key}"`);
    const at = this.offset;
    this.offset += size;
    const v = this.view;
    switch (type) {
      case GgufValueType.UINT8:
        return v.getUint8(at);
      case GgufValueType.INT8:
        return v.getInt8(at);
      case GgufValueType.UINT16:
        return v.getUint16(at, true);
      case GgufValueType.INT16:
        return v.getInt16(at, true);
      case GgufValueType.UINT32:
        return v.getUint32(at, true);
      case GgufValueType.INT32:
        return v.getInt32(at, true);
      case GgufValueType.FLOAT32:
        return v.getFloat32(at, true);
      case GgufValueType.BOOL:
        return v.getUint8(at) !== 0;
      case GgufValueType.UINT64:
        return v.getBigUint64(at, true);
      case GgufValueType.INT64:
        return v.getBigInt64(at, true);
      default:
        return v.getFloat64(at, true);
    }
  }
}
