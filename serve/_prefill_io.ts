/**
 * The prefill session's I/O with its decode worker (serve/prefill_session.ts): reaching the
 * decoder for an attempt, reading its control messages for the handoff, and sending state
 * chunks and the final manifest on the attempt's handoff stream. The session's transition
 * table decides what is sent and when; this only carries it out.
 */
import {
  type BindingContext,
  type ChunkHeader,
  computeChunkTag,
  type FinalManifestMessage,
  LimitExceededError,
} from "../core/mod.ts";
import type { PrefillerTelemetry } from "../core/telemetry.ts";
import type { HandoffSender } from "../transport/mod.ts";
import type { DecoderChannel } from "./decoder_channel.ts";
import type { Engine } from "./engine.ts";
import { reexportPage } from "./exporter.ts";
import type { RetainedState } from "./_retained_state.ts";
import type { StreamEnd } from "./_stream_end.ts";
import { within } from "./_deadline.ts";
import { CORE_MESSAGE_TYPES } from "./wire.ts";
import { faultPoint } from "./fault_points.ts";

/**
 * This attempt's channel to the decode worker. A retry (`previous` set) gets as long to reach
 * the decoder as a reservation gets to be answered (a QUIC connect to a dead host would
 * otherwise take its own 3 s); a channel that arrives after that is closed.
 */
export async function connectAttempt(
  connectDecoder: (failed: DecoderChannel | null) => Promise<DecoderChannel>,
  previous: DecoderChannel | null,
  reserveTimeoutMs: number,
): Promise<DecoderChannel> {
  const connecting = connectDecoder(previous);
  if (previous === null) return await connecting;
  return await within(connecting, reserveTimeoutMs, () => {
    connecting.then((late) => late.close(), () => {});
    return new LimitExceededError(`No connection within reserveTimeoutMs (${reserveTimeoutMs} ms)`);
  });
}

/**
 * Hands the decoder's control messages for `handoffId` to `deliver` (which returns false to
 * stop reading) until the link fails or the channel is closed; then calls `ended` once.
 */
export function listenToDecoder(
  decoder: DecoderChannel,
  handoffId: string,
  deliver: (header: Record<string, unknown>) => boolean,
  ended: () => void,
): void {
  (async () => {
    try {
      for (;;) {
        const h = await decoder.receive();
        if (h.handoffId !== handoffId || !CORE_MESSAGE_TYPES.has(h.type as string)) continue;
        if (!deliver(h)) break;
      }
    } catch {
      // The link failed (or this channel was closed): `ended` reports it as ConnectionLost.
    }
    ended();
  })();
}

/**
 * The page the k-th TransferCredit proves staged (undefined: none). The decoder grants credit
 * back once per page (kv-page or mtp-kv) it has imported, in stream order, so the k-th grant
 * proves page k arrived and was staged.
 */
export function stagedPage(headers: ChunkHeader[], k: number): ChunkHeader | undefined {
  return headers.filter((h) => h.kind === "kv-page" || h.kind === "mtp-kv")[k];
}

/** What sending one state chunk of an attempt needs. */
export interface ChunkSend {
  stream: HandoffSender;
  binding: BindingContext;
  attempt: number;
  retained: RetainedState;
  engine: Engine;
  telemetry: PrefillerTelemetry;
}

/**
 * Sends chunk `seq` on the attempt's handoff stream, its payload as retained or, for a KV page
 * already sent once, exported again from the context; then marks it sent.
 */
export async function sendStateChunk(s: ChunkSend, seq: number): Promise<void> {
  const header = s.retained.header(seq);
  const payload = s.retained.payload(seq) ?? await reexportPage(s.engine.ctx, header);
  const tag = await computeChunkTag(s.binding, header);
  const t0 = performance.now();
  // The chunk's own checksum covers the payload (the decoder verifies it), so the frame's
  // CRC leaves it out: every byte of state is read once per side, not twice.
  await s.stream.send(
    {
      type: "StateChunk",
      handoffId: header.handoffId,
      attempt: s.attempt,
      header,
      tag,
    } as unknown as Record<string, unknown>,
    payload,
    { payloadChecked: false },
  );
  const atMs = performance.now();
  s.telemetry.push({
    type: "chunk-sent",
    atMs,
    seq,
    kind: header.kind,
    bytes: header.payloadBytes,
    durationMs: atMs - t0,
  });
  // Sent: the context still holds a KV page's cells; a retry exports them again.
  s.retained.markSent(seq);
  faultPoint("prefill-chunk-sent");
}

/**
 * Sends the final manifest on the attempt's handoff stream. The component list grows with the
 * prompt: it travels as the frame's payload (bounded by the frame's payload limit), never in
 * the header. The probe digest follows it on the same stream, as its final frame. The payload
 * is the bytes its tag covers, as signed: the decoder checks the tag before it parses them.
 */
export async function sendManifest(
  stream: HandoffSender,
  msg: FinalManifestMessage,
  end: StreamEnd,
  telemetry: PrefillerTelemetry,
): Promise<void> {
  const { manifest, ...head } = msg;
  await stream.send({ ...head, tag: manifest.tag }, end.payload(manifest));
  telemetry.push({ type: "manifest-sent", atMs: performance.now() });
  end.manifestLeft();
}
