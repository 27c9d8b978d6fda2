import { assertEquals } from "../testing/assert.ts";
import { crc32c } from "./crc32c.ts";

/** Reference implementation: the bit-at-a-time definition, slow but obviously right. */
function crc32cReference(bytes: Uint8Array): number {
  let c = 0xffffffff;
  for (const b of bytes) {
    c ^= b;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
  }
  return ~c >>> 0;
}

Deno.test("crc32c() matches the standard check value for '123456789'", () => {
  assertEquals(crc32c(new TextEncoder().encode("123456789")), 0xe3069283);
  assertEquals(crc32c(new Uint8Array(0)), 0);
});

Deno.test("crc32c() matches the bitwise reference at every length and alignment", () => {
  const data = new Uint8Array(300);
  crypto.getRandomValues(data);
  for (let offset = 0; offset < 5; offset++) {
    for (const length of [0, 1, 7, 63, 64, 65, 127, 200, 295 - offset]) {
      const slice = data.subarray(offset, offset + length);
      assertEquals(crc32c(slice), crc32cReference(slice), `offset ${offset} length ${length}`);
    }
  }
});

Deno.test("crc32c() continues across pieces as if over the concatenation", () => {
  const data = new Uint8Array(1000);
  crypto.getRandomValues(data);
  const whole = crc32c(data);
  for (const cut of [0, 1, 13, 500, 999, 1000]) {
    assertEquals(crc32c(data.subarray(cut), crc32c(data.subarray(0, cut))), whole);
  }
});
