/**
 * CRC-32C (Castagnoli) of page bytes, for pages made or checked without the native shim (which
 * computes the same function in C++). The same function as transport's frame checksum:
 * `crc32c(utf8("123456789")) === 0xe3069283`. Slicing by 8 over little-endian words.
 */

const POLY_REFLECTED = 0x82f63b78;

function makeTables(): Uint32Array[] {
  const t = Array.from({ length: 8 }, () => new Uint32Array(256));
  for (let i = 0; i < 256; i++) {
    let c = i;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ POLY_REFLECTED : c >>> 1;
    t[0][i] = c >>> 0;
  }
  for (let i = 0; i < 256; i++) {
    for (let s = 1; s < 8; s++) t[s][i] = (t[s - 1][i] >>> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
  return t;
}

const [T0, T1, T2, T3, T4, T5, T6, T7] = makeTables();

/** Continues `crc` (0 to start) over `bytes`. */
export function crc32c(bytes: Uint8Array, crc = 0): number {
  let c = ~crc >>> 0;
  const n = bytes.length;
  const view = new DataView(bytes.buffer, bytes.byteOffset, n);
  let i = 0;
  for (; i + 8 <= n; i += 8) {
    const a = (c ^ view.getUint32(i, true)) >>> 0;
    const b = view.getUint32(i + 4, true);
    c = T7[a & 0xff] ^ T6[(a >>> 8) & 0xff] ^ T5[(a >>> 16) & 0xff] ^ T4[a >>> 24] ^
      T3[b & 0xff] ^ T2[(b >>> 8) & 0xff] ^ T1[(b >>> 16) & 0xff] ^ T0[b >>> 24];
  }
  for (; i < n; i++) c = T0[(c ^ bytes[i]) & 0xff] ^ (c >>> 8);
  return ~c >>> 0;
}
