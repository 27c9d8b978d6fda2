/**
 * HandoffSender over a FAKE channel: a hand-driven pair of streams that lets a test order the
 * receiver's frames and the failure of the sender's writes exactly, which real QUIC leaves to
 * chance. Protocol behaviour only; nothing here measures or claims performance.
 */
import { assertEquals, assertRejects } from "../testing/assert.ts";
import { HandoffAbortedError, PeerError } from "../core/errors.ts";
import { encodeFrame } from "./frame.ts";
import { FrameReader, FrameWriter } from "./framed_stream.ts";
import { HandoffSender } from "./handoff_stream.ts";

/** The receiver's direction, fed by the test, and a sender's direction that fails on demand. */
function fakeChannel() {
  let feed!: ReadableStreamDefaultController<Uint8Array>;
  const readable = new ReadableStream<Uint8Array>({ start: (c) => void (feed = c) });
  let writesAllowed = 1; // the opening frame
  const writable = new WritableStream<Uint8Array>({
    write() {
      if (writesAllowed-- <= 0) throw new Error("stream stopped by the peer (fake)");
    },
  });
  return {
    reader: new FrameReader(readable),
    writer: new FrameWriter(writable),
    receiverSends(type: string, fields: Record<string, unknown> = {}, final = false) {
      const frame = encodeFrame({ type, ...fields }, undefined, { final });
      feed.enqueue(frame.head);
      if (frame.payload.length > 0) feed.enqueue(frame.payload);
    },
    receiverLost() {
      feed.error(new Error("connection lost (fake)"));
    },
  };
}

function openSender(ch: ReturnType<typeof fakeChannel>, abortReasonWaitMs = 30_000) {
  const sender = new HandoffSender(ch.reader, ch.writer, { handoffId: "h" }, {
    abortReasonWaitMs,
  });
  ch.receiverSends("TransferCredit", { grantedBytesTotal: 1 << 20 });
  return sender;
}

Deno.test("a receiver's abort whose stop overtakes its reason is reported as the receiver's abort", async () => {
  const ch = fakeChannel();
  const sender = openSender(ch);
  // The write fails first (the stop arrived); the reason the receiver wrote before it is
  // read only afterwards.
  const sending = sender.send({ type: "StateChunk" }, new Uint8Array(64));
  setTimeout(() => ch.receiverSends("HandoffStreamAborted", { reason: "bad chunk" }, true), 20);
  const error = await assertRejects(() => sending, HandoffAbortedError, "bad chunk");
  assertEquals(error.reason, "receiver-aborted");
});

Deno.test("a receiver's refusal read after a failed write is reported as the refusal", async () => {
  const ch = fakeChannel();
  const sender = openSender(ch);
  const sending = sender.send({ type: "StateChunk" }, new Uint8Array(64));
  setTimeout(() => ch.receiverSends("HandoffStreamRefused", { reason: "no reservation" }, true));
  await assertRejects(() => sending, PeerError, "refused");
});

Deno.test("a failed write with the connection gone reports the write's own error", async () => {
  const ch = fakeChannel();
  const sender = openSender(ch);
  const sending = sender.send({ type: "StateChunk" }, new Uint8Array(64));
  setTimeout(() => ch.receiverLost());
  await assertRejects(() => sending, Error, "stream stopped by the peer (fake)");
});

Deno.test("a failed write without a reason from the receiver reports the write's error after abortReasonWaitMs", async () => {
  const ch = fakeChannel();
  const sender = openSender(ch, 10);
  const sending = sender.send({ type: "StateChunk" }, new Uint8Array(64));
  await assertRejects(() => sending, Error, "stream stopped by the peer (fake)");
});
