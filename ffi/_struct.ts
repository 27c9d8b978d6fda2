/**
 * C struct layouts for Deno FFI: computes field offsets with the C alignment rules of the
 * platforms we support (LP64: x86-64 and arm64, Linux and macOS), so the safe wrapper can read
 * and write named fields of a by-value struct held in a Uint8Array.
 */
import { assert } from "../core/errors.ts";

export type CFieldType =
  | "i8"
  | "u8"
  | "bool"
  | "i32"
  | "u32"
  | "f32"
  | "i64"
  | "u64"
  | "f64"
  | "pointer"
  | "usize"
  | "function";

const SIZE: Record<CFieldType, number> = {
  i8: 1,
  u8: 1,
  bool: 1,
  i32: 4,
  u32: 4,
  f32: 4,
  i64: 8,
  u64: 8,
  f64: 8,
  pointer: 8,
  usize: 8,
  function: 8,
};

/** A struct layout: ordered fields, their offsets, total size, and the Deno FFI type. */
export class StructLayout<Name extends string> {
  readonly offsets: Record<Name, number>;
  readonly types: Record<Name, CFieldType>;
  readonly size: number;
  readonly ffi: Deno.NativeStructType;

  constructor(readonly cName: string, fields: readonly (readonly [Name, CFieldType])[]) {
    const offsets = {} as Record<Name, number>;
    const types = {} as Record<Name, CFieldType>;
    let offset = 0;
    let align = 1;
    for (const [name, type] of fields) {
      const size = SIZE[type];
      offset = Math.ceil(offset / size) * size;
      offsets[name] = offset;
      types[name] = type;
      offset += size;
      align = Math.max(align, size);
    }
    this.offsets = offsets;
    this.types = types;
    this.size = Math.ceil(offset / align) * align;
    this.ffi = { struct: fields.map(([, type]) => type === "function" ? "pointer" : type) };
  }

  /** Reads a numeric field (pointers come back as bigint addresses). */
  get(buf: Uint8Array, name: Name): number | bigint | boolean {
    assert(buf.byteLength === this.size, `${this.cName}: buffer of ${buf.byteLength} bytes`);
    const view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
    const o = this.offsets[name];
    switch (this.types[name]) {
      case "i8":
        return view.getInt8(o);
      case "u8":
        return view.getUint8(o);
      case "bool":
        return view.getUint8(o) !== 0;
      case "i32":
        return view.getInt32(o, true);
      case "u32":
        return view.getUint32(o, true);
      case "f32":
        return view.getFloat32(o, true);
      case "f64":
        return view.getFloat64(o, true);
      case "i64":
        return view.getBigInt64(o, true);
      default:
        return view.getBigUint64(o, true);
    }
  }

  /** Writes a field; pointers take a Deno.PointerValue or a bigint address. */
  set(buf: Uint8Array, name: Name, value: number | bigint | boolean | Deno.PointerValue): void {
    assert(buf.byteLength === this.size, `${this.cName}: buffer of ${buf.byteLength} bytes`);
    const view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
    const o = this.offsets[name];
    switch (this.types[name]) {
      case "i8":
        return view.setInt8(o, Number(value));
      case "u8":
        return view.setUint8(o, Number(value));
      case "bool":
        return view.setUint8(o, value ? 1 : 0);
      case "i32":
        return view.setInt32(o, Number(value), true);
      case "u32":
        return view.setUint32(o, Number(value), true);
      case "f32":
        return view.setFloat32(o, Number(value), true);
      case "f64":
        return view.setFloat64(o, Number(value), true);
      case "i64":
        return view.setBigInt64(o, BigInt(value as number | bigint), true);
      default: {
        const address = value === null
          ? 0n
          : typeof value === "object"
          ? BigInt(Deno.UnsafePointer.value(value))
          : BigInt(value as number | bigint);
        return view.setBigUint64(o, address, true);
      }
    }
  }
}
