/**
 * What the decoder makes of the end of one attempt's handoff stream (serve/decode_session.ts):
 * the FinalManifest and the ProbeDigest frames, their binding tags checked before the
 * transition table sees them, and a stream that fails (a cut or lost connection, or a frame
 * that breaks the framing).
 */
import {
  type AbortReason,
  type BindingContext,
  type HandoffEvent,
  openManifest,
  verifyProbeDigest,
} from "../core/mod.ts";
import type { DecoderTelemetryEvent } from "../core/telemetry.ts";
import { type Frame, FrameError } from "../transport/mod.ts";

/** Why the stream is rejected: the table's reason, and one line (no content) for the log. */
export interface StreamRejection {
  reason: AbortReason;
  message: string;
}

/**
 * Opens this attempt's FinalManifest or ProbeDigest frame and hands its event to the table
 * (`push`); returns the rejection instead when its tag does not verify or its payload does not
 * parse.
 */
export async function readStreamEnd(
  frame: Frame,
  binding: BindingContext | null,
  telemetry: DecoderTelemetryEvent[],
  push: (event: HandoffEvent) => void,
): Promise<StreamRejection | null> {
  const h = frame.header as Record<string, unknown>;
  if (h.type === "FinalManifest") {
    telemetry.push({ type: "manifest-received", atMs: performance.now() });
    // Its tag is checked over the bytes as received, before they are parsed.
    let manifest: unknown;
    try {
      manifest = binding && await openManifest(frame.payload, h.tag, binding);
    } catch {
      return { reason: "protocol-error", message: "FinalManifest payload is not valid msgpack" };
    }
    if (!manifest) {
      return { reason: "binding-tag", message: "manifest binding tag does not verify" };
    }
    push({ ...h, manifest } as unknown as HandoffEvent);
    return null;
  }
  // A ProbeDigest: its tag is checked here, before the table sees it; the table checks the rest.
  if (!binding || !await verifyProbeDigest(binding, h.logitsSha256, h.tag)) {
    return { reason: "binding-tag", message: "probe digest binding tag does not verify" };
  }
  const { handoffId, attempt, logitsSha256 } = h;
  telemetry.push({ type: "probe-digest-received", atMs: performance.now() });
  push(
    {
      type: "ProbeDigest",
      handoffId,
      attempt,
      logitsSha256,
      tag: h.tag,
    } as unknown as HandoffEvent,
  );
  return null;
}

/**
 * How a failed stream ends the attempt: null for a cut or lost connection (ConnectionLost),
 * else the rejection of a frame that breaks the framing.
 */
export function streamFailure(error: unknown): StreamRejection | null {
  if (!(error instanceof FrameError) || error.kind.startsWith("ended-")) return null;
  // A corrupted frame may be a transient fault (the prefiller retries); anything else is a
  // peer that does not follow the framing.
  const reason = error.kind === "bad-checksum" ? "invalid-state" : "protocol-error";
  return { reason, message: error.message };
}
