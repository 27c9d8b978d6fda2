/**
 * Small byte helpers shared by `core/`: hex, UTF-8, a canonical MessagePack encoding, SHA-256
 * and HMAC-SHA256 over Web Crypto. Nothing here touches `Deno.*`.
 *
 * The canonical encoding is what every digest and binding tag is computed over, so two
 * processes that agree on a value agree on its bytes: object keys are sorted, `undefined`,
 * functions, symbols and non-finite numbers are refused, and integers keep msgpackr's
 * smallest-width form.
 *
 * @module
 */
// "msgpackr/pack" resolves to the pure JavaScript build; the bare "msgpackr" entry reads
// process.env at load time, which would make `deno test core/` need --allow-env.
import { Packr, Unpackr } from "msgpackr/pack";
import { assert, ProtocolError } from "./errors.ts";

/** Bytes in a SHA-256 digest. */
export const SHA256_BYTES = 32;
/** Most bytes one `randomBytes` call returns (the Web Crypto limit). */
export const RANDOM_BYTES_MAX = 65_536;
/** Nesting depth the canonical encoder accepts; deeper values are a programmer error. */
export const CANONICAL_DEPTH_MAX = 32;

const packr = new Packr({
  useRecords: false,
  mapsAsObjects: true,
  variableMapSize: true,
  moreTypes: false,
  structuredClone: false,
  bundleStrings: false,
});
const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: true, structuredClone: false });
const utf8Encoder = new TextEncoder();
const utf8Decoder = new TextDecoder("utf-8", { fatal: true });

/**
 * Lower-case hex of `bytes`.
 *
 * @example
 * ```ts
 * toHex(new Uint8Array([0, 255])); // "00ff"
 * ```
 */
export function toHex(bytes: Uint8Array): string {
  let out = "";
  for (const b of bytes) out += b.toString(16).padStart(2, "0");
  return out;
}

/**
 * Parses lower- or upper-case hex; throws ProtocolError on odd length or a non-hex digit.
 *
 * @example
 * ```ts
 * fromHex("00ff"); // Uint8Array [0, 255]
 * ```
 */
export function fromHex(hex: string): Uint8Array {
  if (hex.length % 2 !== 0 || !/^[0-9a-fA-F]*$/.test(hex)) {
    throw new ProtocolError(`Invalid hex string of length ${hex.length}`);
  }
  const out = new Uint8Array(hex.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(hex.slice(2 * i, 2 * i + 2), 16);
  return out;
}

/** True when `s` is exactly `bytes` bytes of lower-case hex (e.g. a SHA-256 digest). */
export function isHex(s: unknown, bytes: number): s is string {
  return typeof s === "string" && s.length === 2 * bytes && /^[0-9a-f]*$/.test(s);
}

/** UTF-8 bytes of `text`. */
export function utf8(text: string): Uint8Array {
  return utf8Encoder.encode(text);
}

/** Decodes UTF-8, throwing ProtocolError on invalid sequences. */
export function fromUtf8(bytes: Uint8Array): string {
  try {
    return utf8Decoder.decode(bytes);
  } catch (cause) {
    throw new ProtocolError("Invalid UTF-8 text", { cause });
  }
}

/** Concatenates byte arrays into one new array. */
export function concatBytes(parts: readonly Uint8Array[]): Uint8Array {
  let length = 0;
  for (const p of parts) length += p.length;
  const out = new Uint8Array(length);
  let offset = 0;
  for (const p of parts) {
    out.set(p, offset);
    offset += p.length;
  }
  return out;
}

/** Byte equality that does not stop at the first difference (for tags and keys). */
export function bytesEqual(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff |= a[i] ^ b[i];
  return diff === 0;
}

/** `n` cryptographically random bytes (Web Crypto). */
export function randomBytes(n: number): Uint8Array {
  assert(Number.isInteger(n) && n >= 0 && n <= RANDOM_BYTES_MAX, `randomBytes(${n}) out of range`);
  return crypto.getRandomValues(new Uint8Array(n));
}

/**
 * Canonical MessagePack bytes of `value`: keys sorted at every level, no `undefined`.
 * Throws (a programmer error) for values that have no canonical form.
 *
 * @example
 * ```ts
 * const a = canonicalEncode({ b: 1, a: 2 });
 * const b = canonicalEncode({ a: 2, b: 1 });
 * // a and b are byte-identical
 * ```
 */
export function canonicalEncode(value: unknown): Uint8Array {
  const packed = packr.pack(_canonicalize(value, 0));
  // Copy: msgpackr may hand out a view onto a buffer it reuses for the next call.
  return new Uint8Array(packed);
}

/** Decodes MessagePack bytes (canonical or not); throws ProtocolError when malformed. */
export function decodeMsgpack(bytes: Uint8Array): unknown {
  try {
    return unpackr.unpack(bytes);
  } catch (cause) {
    throw new ProtocolError("Malformed MessagePack value", { cause });
  }
}

function _canonicalize(value: unknown, depth: number): unknown {
  assert(depth <= CANONICAL_DEPTH_MAX, "canonicalEncode: value nested too deeply");
  if (value === null || typeof value === "string" || typeof value === "boolean") return value;
  if (typeof value === "number") {
    assert(Number.isFinite(value), "canonicalEncode: non-finite number");
    return Object.is(value, -0) ? 0 : value;
  }
  if (typeof value === "bigint") return value;
  if (value instanceof Uint8Array) return value;
  if (Array.isArray(value)) return value.map((v) => _canonicalize(v, depth + 1));
  assert(
    typeof value === "object" && Object.getPrototypeOf(value) === Object.prototype,
    `canonicalEncode: unsupported value of type ${typeof value}`,
  );
  const out: Record<string, unknown> = {};
  for (const key of Object.keys(value).sort()) {
    const v = (value as Record<string, unknown>)[key];
    assert(v !== undefined, `canonicalEncode: field "${key}" is undefined`);
    out[key] = _canonicalize(v, depth + 1);
  }
  return out;
}

/**
 * SHA-256 of `bytes`.
 *
 * @example
 * ```ts
 * const digest = await sha256(utf8("abc")); // 32 bytes
 * ```
 */
export async function sha256(bytes: Uint8Array): Promise<Uint8Array> {
  return new Uint8Array(await crypto.subtle.digest("SHA-256", _buffer(bytes)));
}

/**
 * SHA-256 of `bytes` as 64 lower-case hex characters.
 *
 * @example
 * ```ts
 * await sha256Hex(new Uint8Array()); // "e3b0c442...b855"
 * ```
 */
export async function sha256Hex(bytes: Uint8Array): Promise<string> {
  return toHex(await sha256(bytes));
}

/**
 * HMAC-SHA256 of `data` under `key`.
 *
 * @example
 * ```ts
 * const tag = await hmacSha256(randomBytes(32), utf8("message")); // 32 bytes
 * ```
 */
export async function hmacSha256(key: Uint8Array, data: Uint8Array): Promise<Uint8Array> {
  const k = await _hmacKey(key, ["sign"]);
  return new Uint8Array(await crypto.subtle.sign("HMAC", k, _buffer(data)));
}

/**
 * Checks an HMAC-SHA256 tag in constant time (Web Crypto `verify`).
 *
 * @example
 * ```ts
 * const ok = await verifyHmacSha256(key, data, tag);
 * ```
 */
export async function verifyHmacSha256(
  key: Uint8Array,
  data: Uint8Array,
  tag: Uint8Array,
): Promise<boolean> {
  if (tag.length !== SHA256_BYTES) return false;
  const k = await _hmacKey(key, ["verify"]);
  return await crypto.subtle.verify("HMAC", k, _buffer(tag), _buffer(data));
}

function _hmacKey(key: Uint8Array, usages: KeyUsage[]): Promise<CryptoKey> {
  assert(key.length > 0, "HMAC key must not be empty");
  return crypto.subtle.importKey("raw", _buffer(key), { name: "HMAC", hash: "SHA-256" }, false, [
    ...usages,
  ]);
}

// Web Crypto wants an ArrayBuffer-backed view; copy when the view sits on a shared buffer.
function _buffer(bytes: Uint8Array): Uint8Array<ArrayBuffer> {
  return bytes.buffer instanceof ArrayBuffer
    ? bytes as Uint8Array<ArrayBuffer>
    : new Uint8Array(bytes);
}
