/**
 * What one prefill-side handoff (serve/prefill_session.ts) is given: the request and its
 * tokens, the context and identity it runs on, the way to reach its decode worker, and its
 * bounds (PrefillLimits, each named with its unit).
 */
import type { HandoffTiming } from "../core/mod.ts";
import type { MtpDraft } from "../ffi/mtp.ts";
import type { DecoderChannel } from "./decoder_channel.ts";
import type { Engine } from "./engine.ts";
import { DEFAULT_EXPORT_LIMITS, type ExportPrefix, type FirstTokenHook } from "./exporter.ts";
import type { ResolvedIdentity } from "./identity.ts";
import type { PrefillRequest } from "./messages.ts";

/** Bounds of one prefill-side handoff, each named with its unit. */
export interface PrefillLimits {
  /** Exported chunks waiting to be sent; prefill pauses when this is reached. */
  exportQueueBytesMax: number;
  /** End-of-prompt components retained for a retry until CommitAck. */
  retainedBytesMax: number;
  /** How often the table's timers are advanced. */
  tickMs: number;
  /** Send recurrent layers while the last chunk computes (see ExportLimits.layerCapture). */
  layerCapture: boolean;
  /** With it, a hybrid model's last page too (see ExportLimits.lastPageCapture). */
  lastPageCapture: boolean;
  /** Largest state chunk payload, in bytes (see ExportLimits.chunkBytesMax). */
  chunkBytesMax: number;
}

export const DEFAULT_PREFILL_LIMITS: Readonly<PrefillLimits> = {
  exportQueueBytesMax: 256 * 1024 * 1024,
  retainedBytesMax: 1024 * 1024 * 1024,
  tickMs: 50,
  layerCapture: true,
  lastPageCapture: true,
  chunkBytesMax: DEFAULT_EXPORT_LIMITS.chunkBytesMax,
};

export interface PrefillHandoffInput {
  request: PrefillRequest;
  prompt: Int32Array;
  engine: Engine;
  draft: MtpDraft | null;
  identity: ResolvedIdentity;
  /**
   * This handoff's channel on the link to the decode worker; called again for a retry after
   * a connection loss, with the channel that failed (its link is not trusted again).
   */
  connectDecoder: (failed: DecoderChannel | null) => Promise<DecoderChannel>;
  sourceNodeId: string;
  timing: HandoffTiming;
  limits: PrefillLimits;
  cancel: AbortSignal;
  /** Called once the first token is sampled, before the tail is exported (see FirstTokenHook). */
  onFirstToken?: FirstTokenHook;
  /** Tokens restored from the prefix cache and checkpoints to take (serve/prefix_cache.ts). */
  prefix?: ExportPrefix;
  /** Tests only (PrefillHooks.probeDigest): replaces the probe digest sent. */
  probeDigestHook?: (logitsSha256: string) => string;
}
