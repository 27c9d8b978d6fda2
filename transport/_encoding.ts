/** Text encodings for keys, fingerprints and node ids. Private to transport/. */

const BASE32_ALPHABET = "abcdefghijklmnopqrstuvwxyz234567";

/** Lowercase RFC 4648 base32 without padding: case-insensitive-safe and easy to read aloud. */
export function base32(bytes: Uint8Array): string {
  let out = "";
  let bits = 0;
  let value = 0;
  for (const byte of bytes) {
    value = (value << 8) | byte;
    bits += 8;
    while (bits >= 5) {
      out += BASE32_ALPHABET[(value >>> (bits - 5)) & 31];
      bits -= 5;
    }
    value &= (1 << bits) - 1;
  }
  if (bits > 0) out += BASE32_ALPHABET[(value << (5 - bits)) & 31];
  return out;
}

/** Lowercase hex. */
export function hex(bytes: Uint8Array): string {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** Parses hex (case-insensitive, ':' separators allowed); null if malformed. */
export function parseHex(text: string): Uint8Array | null {
  const clean = text.replaceAll(":", "").toLowerCase();
  if (clean.length % 2 !== 0 || !/^[0-9a-f]*$/.test(clean)) return null;
  return Uint8Array.from(
    { length: clean.length / 2 },
    (_, i) => parseInt(clean.slice(2 * i, 2 * i + 2), 16),
  );
}

/** Unpadded base64url. */
export function base64url(bytes: Uint8Array): string {
  let binary = "";
  for (const b of bytes) binary += String.fromCharCode(b);
  return btoa(binary).replaceAll("+", "-").replaceAll("/", "_").replace(/=+$/, "");
}

/** Parses base64url or base64 (padding optional); null if malformed. */
export function parseBase64url(text: string): Uint8Array | null {
  const normal = text.replaceAll("-", "+").replaceAll("_", "/");
  if (!/^[A-Za-z0-9+/]*=*$/.test(normal)) return null;
  try {
    const binary = atob(normal.padEnd(normal.length + ((4 - (normal.length % 4)) % 4), "="));
    return Uint8Array.from(binary, (c) => c.charCodeAt(0));
  } catch {
    return null;
  }
}

/** Constant-shape equality of two byte arrays (lengths are public). */
export function bytesEqual(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff |= a[i] ^ b[i];
  return diff === 0;
}
