/**
 * The streams a peer opens on an established PeerConnection (peer.ts). Each new stream's
 * opening frame, read within `handshakeStepMs`, says what it is: a loss probe or a bandwidth
 * probe is answered here, a handoff stream waits without credit for `acceptHandoffStream()`,
 * and anything else is refused and closed at once. Private to transport/.
 */
import { SkippyError } from "../core/errors.ts";
import type { BoundedQueue } from "../core/queue.ts";
import type { ByteChannel, RawConnection } from "./channel.ts";
import type { Frame, FrameHeader } from "./frame.ts";
import type { FrameReader, FrameWriter } from "./framed_stream.ts";
import { type HandoffStreamOptions, IncomingHandoffStream } from "./handoff_stream.ts";
import { answerProbe, LINK_PROBE_OPEN, type LinkProbeOptions } from "./link_probe.ts";
import {
  answerLossProbe,
  LINK_LOSS_OPEN,
  type LossProbeCounter,
  type LossProbeOptions,
} from "./loss_probe.ts";

/** What admitting a stream needs from its connection. */
export interface StreamAdmission {
  /** Frames a new stream as the connection frames its handoff streams. */
  frame(channel: ByteChannel): { reader: FrameReader; writer: FrameWriter };
  /** The opening frame must arrive within this. */
  stepMs: number;
  handoff?: HandoffStreamOptions & { manualRelease?: boolean };
  /** Handoff streams waiting for `acceptHandoffStream()` (bounded: more are refused). */
  incoming: BoundedQueue<IncomingHandoffStream>;
  linkProbe: LinkProbeOptions;
  lossProbe: LossProbeOptions;
  /** Counts the loss probe's datagrams; null without datagrams on this connection. */
  lossCounter: LossProbeCounter | null;
}

/** Admits every stream the peer opens until the connection ends, then closes `incoming`. */
export async function admitIncomingStreams(
  raw: RawConnection,
  admission: StreamAdmission,
): Promise<void> {
  // One bandwidth probe is answered at a time; another is refused while it runs.
  const bandwidthProbe = { running: false };
  for (;;) {
    let channel: ByteChannel | null;
    try {
      channel = await raw.acceptChannel();
    } catch {
      channel = null;
    }
    if (channel === null) break;
    // Not awaited: a slow opener must not hold up the streams behind it.
    admitStream(channel, admission, bandwidthProbe).catch(() => {});
  }
  admission.incoming.close();
}

/**
 * Reads a new stream's opening frame (within `stepMs`). A stream that does not open as a
 * handoff stream, stalls or is malformed is refused and closed at once, so it never holds one
 * of the connection's stream slots; a valid one waits, without credit, for
 * `acceptHandoffStream()` and the caller's match.
 */
async function admitStream(
  channel: ByteChannel,
  admission: StreamAdmission,
  bandwidthProbe: { running: boolean },
): Promise<void> {
  const { reader, writer } = admission.frame(channel);
  const stepMs = admission.stepMs;
  let timer: ReturnType<typeof setTimeout> | undefined;
  let first: Frame | null = null;
  let why = `no opening frame within handshakeStepMs (${stepMs} ms)`;
  try {
    first = await Promise.race([
      reader.read(),
      new Promise<null>((resolve) => timer = setTimeout(() => resolve(null), stepMs)),
    ]);
  } catch (error) {
    why = error instanceof SkippyError ? "malformed opening frame" : "stream lost";
  } finally {
    clearTimeout(timer);
  }
  if (first?.header.type === LINK_LOSS_OPEN && !first.final) {
    const { lossCounter, lossProbe } = admission;
    await answerLossProbe(first.header, reader, writer, lossCounter, lossProbe);
    return;
  }
  if (first?.header.type === LINK_PROBE_OPEN && !first.final && !bandwidthProbe.running) {
    bandwidthProbe.running = true;
    await answerProbe(first.header, reader, writer, admission.linkProbe);
    bandwidthProbe.running = false;
    return;
  }
  const meta = first?.header.meta;
  if (
    first?.header.type !== "HandoffStreamOpen" || first.final || typeof meta !== "object" ||
    meta === null
  ) {
    // Unknown stream types are refused, not fatal: a newer peer may offer more of them.
    if (first) why = "unknown stream type";
    reader.cancel();
    await writer.refuse(why);
    await writer.close();
    return;
  }
  const stream = new IncomingHandoffStream(reader, writer, meta as FrameHeader, admission.handoff);
  if (!admission.incoming.tryPush(stream)) {
    await stream.refuse("too many pending handoff streams");
  }
}
