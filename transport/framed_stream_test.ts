import { assertEquals, assertRejects } from "../testing/assert.ts";
import { FrameError } from "./frame.ts";
import { FrameReader, FrameWriter } from "./framed_stream.ts";

function pipe(): { readable: ReadableStream<Uint8Array>; writable: WritableStream<Uint8Array> } {
  return new TransformStream<Uint8Array, Uint8Array>();
}

Deno.test("FrameReader returns frames, then null only after the final frame", async () => {
  const { readable, writable } = pipe();
  const writer = new FrameWriter(writable);
  const reader = new FrameReader(readable);
  writer.write({ type: "A" }, new Uint8Array([1]));
  writer.write({ type: "B" }, undefined, { final: true });
  assertEquals((await reader.read())?.header.type, "A");
  assertEquals((await reader.read())?.final, true);
  assertEquals(await reader.read(), null);
});

Deno.test("FrameReader reports a clean end of stream before the final frame as an error", async () => {
  const { readable, writable } = pipe();
  const writer = new FrameWriter(writable);
  const reader = new FrameReader(readable);
  writer.write({ type: "A" });
  writer.close(); // what writer.abort() looks like on Deno QUIC
  assertEquals((await reader.read())?.header.type, "A");
  const error = await assertRejects(() => reader.read(), FrameError, "before the final frame");
  assertEquals(error.kind, "ended-before-final");
});

Deno.test("FrameWriter keeps overlapping frames whole and in call order", async () => {
  const { readable, writable } = pipe();
  const writer = new FrameWriter(writable);
  const reader = new FrameReader(readable);
  const writes = Array.from(
    { length: 20 },
    (_, i) => writer.write({ type: "P", i }, new Uint8Array(1000 + i), { final: i === 19 }),
  );
  const seen: number[] = [];
  for (let frame = await reader.read(); frame !== null; frame = await reader.read()) {
    seen.push(frame.header.i as number);
    assertEquals(frame.payload.length, 1000 + (frame.header.i as number));
  }
  await Promise.all(writes);
  assertEquals(seen, Array.from({ length: 20 }, (_, i) => i));
});

/**
 * A byte stream (as Deno QUIC's are) serving `bytes` in slices of at most `sliceMax`, each
 * `delayMs` after it was asked for.
 */
function byteStream(bytes: Uint8Array, sliceMax: number, asked: number[], delayMs = 0) {
  let at = 0;
  return new ReadableStream({
    type: "bytes",
    async pull(controller) {
      if (delayMs > 0) await new Promise((resolve) => setTimeout(resolve, delayMs));
      const request = controller.byobRequest!;
      const view = request.view as Uint8Array;
      asked.push(view.byteLength);
      if (at === bytes.length) {
        controller.close();
        request.respond(0);
        return;
      }
      const n = Math.min(view.byteLength, sliceMax, bytes.length - at);
      view.set(bytes.subarray(at, at + n));
      at += n;
      request.respond(n);
    },
  });
}

Deno.test("FrameReader on a byte stream reads a large body in place and yields the same frames", async () => {
  // Encode frames through a plain pipe, then serve those exact bytes as a byte stream.
  const { readable, writable } = pipe();
  const writer = new FrameWriter(writable);
  const payloads = [1 << 20, 3, 0, 300_000].map((n, i) =>
    new Uint8Array(n).map((_, k) => (k * 7 + i) & 0xff)
  );
  payloads.forEach((p, i) =>
    writer.write({ type: "P", i }, p, { final: i === payloads.length - 1 })
  );
  writer.close();
  const all = new Uint8Array(await new Response(readable).arrayBuffer());
  const asked: number[] = [];
  const reader = new FrameReader(byteStream(all, 50_000, asked));
  for (const [i, p] of payloads.entries()) {
    const frame = (await reader.read())!;
    assertEquals(frame.header, { type: "P", i });
    assertEquals(frame.payload, p);
  }
  assertEquals(await reader.read(), null);
  // After the first slice of the 1 MiB frame, each read asked for exactly the rest of its body:
  // the reader offered the frame's own buffer, not a scratch chunk to copy from.
  const firstBody = asked.slice(1).filter((n) => n > 64 * 1024);
  assertEquals(firstBody.length > 5, true);
  firstBody.slice(0, 5).forEach((n, k) => k > 0 && assertEquals(firstBody[k - 1] - n, 50_000));
});

Deno.test("FrameReader times a large frame's body from its header's read to its last", async () => {
  const { readable, writable } = pipe();
  const writer = new FrameWriter(writable);
  writer.write({ type: "P" }, new Uint8Array(1 << 20));
  writer.write({ type: "S" }, new Uint8Array(3), { final: true });
  writer.close();
  const all = new Uint8Array(await new Response(readable).arrayBuffer());
  // 50,000 bytes a read, each 5 ms after it was asked for: the body after the first slice
  // takes 20 more reads, so at least 20 x 5 ms.
  const reader = new FrameReader(byteStream(all, 50_000, [], 5));
  const large = (await reader.read())!;
  assertEquals(large.arrival?.bytes, large.wireBytes - 50_000);
  const reads = Math.ceil((large.wireBytes - 50_000) / 50_000);
  assertEquals(reads, 20);
  assertEquals(large.arrival!.ms >= reads * 5, true, `${large.arrival!.ms} ms`);
  // A frame that came whole in one read has no arrival to time.
  assertEquals((await reader.read())?.arrival, undefined);
});
