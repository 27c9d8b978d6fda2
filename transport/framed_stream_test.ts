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
