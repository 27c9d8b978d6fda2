import { assert, assertEquals, assertThrows } from "../testing/assert.ts";
import { LimitExceededError, ProtocolError } from "../core/errors.ts";
import { randomInt, seededRandom } from "./_prng.ts";
import { crc32c } from "../core/crc32c.ts";
import {
  encodeFrame,
  type Frame,
  FRAME_PREFIX_BYTES,
  FrameDecoder,
  FrameError,
  type FrameHeader,
  type FrameLimits,
} from "./frame.ts";

function concat(parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/** Three frames: an empty payload, a small one, and a final 100 KiB one. */
interface Fixture {
  bytes: Uint8Array;
  headers: FrameHeader[];
  payloads: Uint8Array[];
}
let cachedFixture: Fixture | undefined;
function fixture(): Fixture {
  return cachedFixture ??= makeFixture();
}

function makeFixture(): Fixture {
  const big = new Uint8Array(100 * 1024);
  for (let i = 0; i < big.length; i++) big[i] = (i * 31) & 0xff;
  const headers = [{ type: "A" }, { type: "B", n: 7, bin: new Uint8Array([9, 8]) }, { type: "C" }];
  const payloads = [new Uint8Array(0), new Uint8Array([1, 2, 3]), big];
  const parts = headers.flatMap((h, i) => {
    const e = encodeFrame(h, payloads[i], { final: i === headers.length - 1 });
    return [e.head, e.payload];
  });
  return { bytes: concat(parts), headers, payloads };
}

function bytesEqual(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

function decodeAll(bytes: Uint8Array, cuts: number[], limits?: FrameLimits): Frame[] {
  const decoder = new FrameDecoder(limits);
  const frames: Frame[] = [];
  let at = 0;
  for (const cut of [...cuts, bytes.length]) {
    frames.push(...decoder.push(bytes.slice(at, cut)));
    at = cut;
  }
  decoder.finish();
  return frames;
}

function assertFixture(frames: Frame[]): void {
  const { headers, payloads } = fixture();
  assertEquals(frames.length, 3);
  frames.forEach((f, i) => {
    assertEquals(f.index, i);
    assertEquals(f.final, i === 2);
    assertEquals(f.header.type, headers[i].type);
    assert(bytesEqual(f.payload, payloads[i]), `payload of frame ${i} differs`);
  });
  assertEquals(Array.from(frames[1].header.bin as Uint8Array), [9, 8]);
}

Deno.test("FrameDecoder decodes a fixture fed one byte at a time", () => {
  const { bytes } = fixture();
  const cuts = Array.from({ length: bytes.length - 1 }, (_, i) => i + 1);
  assertFixture(decodeAll(bytes, cuts));
});

Deno.test("FrameDecoder decodes a fixture fed in one slice and in 200 seeded random splits", () => {
  const { bytes } = fixture();
  assertFixture(decodeAll(bytes, []));
  const random = seededRandom(42);
  for (let round = 0; round < 200; round++) {
    const cuts = Array.from(
      { length: randomInt(random, 1, 12) },
      () => randomInt(random, 0, bytes.length),
    )
      .sort((a, b) => a - b);
    assertFixture(decodeAll(bytes, cuts));
  }
});

Deno.test("FrameDecoder hands out a view, not a copy, when a whole frame arrives in one slice", () => {
  const e = encodeFrame({ type: "X" }, new Uint8Array([5, 6, 7]), { final: true });
  const wire = concat([e.head, e.payload]);
  const [frame] = new FrameDecoder().push(wire);
  assert(frame.payload.buffer === wire.buffer, "payload should share the input buffer");
  assertEquals(frame.wireBytes, wire.length);
});

Deno.test("FrameDecoder rejects bad magic, version, flags and checksum with what was wrong", () => {
  const e = encodeFrame({ type: "X" }, new Uint8Array([1, 2, 3]), { final: true });
  const wire = concat([e.head, e.payload]);
  const cases: [number, number, string, string][] = [
    [0, 0x00, "bad-magic", "bad magic 0x0044"],
    [2, 0x09, "bad-version", "unsupported frame version 9"],
    [3, 0x80, "bad-flags", "unknown flag bits"],
    [wire.length - 1, wire[wire.length - 1] ^ 0x01, "bad-checksum", "checksum mismatch"],
    [FRAME_PREFIX_BYTES, 0xc1, "bad-checksum", "checksum mismatch"],
  ];
  for (const [offset, value, kind, text] of cases) {
    const bad = wire.slice();
    bad[offset] = value;
    const error = assertThrows(() => new FrameDecoder().push(bad), FrameError, text);
    assertEquals(error.kind, kind);
    assert(error instanceof ProtocolError);
  }
});

Deno.test("FrameDecoder checks size ceilings on the prefix, before the body arrives", () => {
  const limits = { headerBytesMax: 64, payloadBytesMax: 1024 };
  const big = encodeFrame({ type: "X" }, new Uint8Array(2048));
  // Only the prefix is fed: the refusal must not wait for (or allocate) the 2 KiB body.
  const e1 = assertThrows(
    () => new FrameDecoder(limits).push(big.head.subarray(0, FRAME_PREFIX_BYTES)),
    FrameError,
    "payload of 2048 bytes exceeds payloadBytesMax (1024)",
  );
  assertEquals(e1.kind, "payload-too-large");
  const fat = encodeFrame({ type: "X", pad: "y".repeat(100) });
  const e2 = assertThrows(
    () => new FrameDecoder(limits).push(fat.head.subarray(0, FRAME_PREFIX_BYTES)),
    FrameError,
    "exceeds headerBytesMax (64)",
  );
  assertEquals(e2.kind, "header-too-large");
});

Deno.test("encodeFrame() refuses to send past its own limits", () => {
  const limits = { headerBytesMax: 64, payloadBytesMax: 16 };
  assertThrows(
    () => encodeFrame({ type: "X" }, new Uint8Array(17), { limits }),
    LimitExceededError,
  );
  assertThrows(
    () => encodeFrame({ type: "X".repeat(80) }, undefined, { limits }),
    LimitExceededError,
  );
});

Deno.test("FrameDecoder rejects a header that is not a msgpack map", () => {
  const frame = encodeFrame({ a: 1 }).head;
  frame[FRAME_PREFIX_BYTES] = 0x92; // fixarray(2) where the fixmap(1) was: same length
  assertThrows(() => new FrameDecoder().push(withChecksum(frame)), FrameError, "not a msgpack map");
  frame[FRAME_PREFIX_BYTES] = 0xc1; // the one byte msgpack never uses
  assertThrows(() => new FrameDecoder().push(withChecksum(frame)), FrameError, "header is not");
});

/** Recomputes the checksum of a whole frame after a test edited it. */
function withChecksum(frame: Uint8Array): Uint8Array {
  const crc = crc32c(frame.subarray(FRAME_PREFIX_BYTES), crc32c(frame.subarray(0, 12)));
  new DataView(frame.buffer, frame.byteOffset).setUint32(12, crc);
  return frame;
}

Deno.test("finish() tells a stream cut mid-frame from one cut before the final frame", () => {
  const { bytes } = fixture();
  const firstTwo = encodeFrame({ type: "A" }).head.length +
    encodeFrame({ type: "B", n: 7, bin: new Uint8Array([9, 8]) }, new Uint8Array([1, 2, 3]))
      .wireBytes;

  const midFrame = new FrameDecoder();
  midFrame.push(bytes.slice(0, firstTwo + 20));
  const e1 = assertThrows(() => midFrame.finish(), FrameError, "Stream ended mid-frame");
  assertEquals(e1.kind, "ended-mid-frame");

  const midPrefix = new FrameDecoder();
  midPrefix.push(bytes.slice(0, firstTwo + 3));
  assertEquals(assertThrows(() => midPrefix.finish(), FrameError).kind, "ended-mid-frame");

  const betweenFrames = new FrameDecoder();
  assertEquals(betweenFrames.push(bytes.slice(0, firstTwo)).length, 2);
  const e2 = assertThrows(
    () => betweenFrames.finish(),
    FrameError,
    "Stream ended before the final frame",
  );
  assertEquals(e2.kind, "ended-before-final");
  betweenFrames.finish(false); // ...unless the caller does not require a final frame
});

Deno.test("FrameDecoder refuses bytes after the final frame but returns the frames before them", () => {
  const { bytes } = fixture();
  const decoder = new FrameDecoder();
  const frames = decoder.push(concat([bytes, new Uint8Array([0x53])]));
  assertEquals(frames.length, 3);
  const error = assertThrows(() => decoder.finish(), FrameError, "data after the final frame");
  assertEquals(error.kind, "data-after-final");
  assertThrows(() => decoder.push(new Uint8Array(1)), FrameError);
});

Deno.test("FrameDecoder never throws anything but FrameError on 300 seeded random corruptions", () => {
  const { bytes } = fixture();
  const random = seededRandom(7);
  for (let round = 0; round < 300; round++) {
    const bad = bytes.slice(0, 4096);
    for (let flips = randomInt(random, 1, 3); flips > 0; flips--) {
      bad[randomInt(random, 0, bad.length - 1)] ^= 1 << randomInt(random, 0, 7);
    }
    const decoder = new FrameDecoder({ headerBytesMax: 1024, payloadBytesMax: 1 << 20 });
    try {
      decoder.push(bad);
      decoder.finish();
      throw new Error("corruption went unnoticed");
    } catch (error) {
      assert(error instanceof FrameError, `round ${round}: ${error}`);
    }
  }
});
