/**
 * What a PeerConnection (peer.ts) is configured with, and the bounds establishment
 * (establish.ts) and the connection enforce when a caller leaves them out. peer.ts re-exports
 * all of it.
 */
import type { Capabilities } from "./capabilities.ts";
import type { FrameLimits } from "./frame.ts";
import type { HandoffStreamOptions } from "./handoff_stream.ts";
import type { LinkProbeOptions } from "./link_probe.ts";
import type { LossProbeOptions } from "./loss_probe.ts";
import type { NodeIdentity } from "./node_identity.ts";
import type { TrustList } from "./trust.ts";

export const DEFAULT_HANDSHAKE_TIMEOUT_MS = 5_000;
/**
 * Server side: each handshake step (control stream, ClientHello, ClientProof, capabilities)
 * and each new stream's opening frame must arrive within this of the previous one. Far above a
 * LAN or WAN round trip plus one signature, far below the time a stalled opener could hold a
 * slot under the old whole-handshake bound.
 */
export const DEFAULT_HANDSHAKE_STEP_MS = 500;
export const DEFAULT_CLOSE_TIMEOUT_MS = 2_000;
/** Control messages are small; bulk state belongs on handoff streams. */
export const DEFAULT_CONTROL_FRAME_LIMITS: Readonly<FrameLimits> = Object.freeze({
  headerBytesMax: 64 * 1024,
  payloadBytesMax: 1024 * 1024,
});

/** Who this node is, whom it trusts, what it announces, and the bounds it enforces. */
export interface PeerOptions {
  identity: NodeIdentity;
  trust: TrustList;
  capabilities?: Capabilities;
  /** Authentication plus capability exchange must finish within this. */
  handshakeTimeoutMs?: number;
  /**
   * Server: each handshake step, and each incoming stream's opening frame, must arrive within
   * this; a peer that stalls longer is cut.
   */
  handshakeStepMs?: number;
  /** How long `close()` waits for the peer's answer before closing anyway. */
  closeTimeoutMs?: number;
  controlFrameLimits?: FrameLimits;
  /** Received control messages buffered before the reader stops reading (backpressure). */
  controlQueueMessagesMax?: number;
  /** Incoming handoff streams waiting for `acceptHandoffStream()`; more are refused. */
  incomingHandoffStreamsMax?: number;
  handoff?: HandoffStreamOptions & { manualRelease?: boolean };
  /** Bounds of link pings and bandwidth probes (link_probe.ts). */
  linkProbe?: Partial<LinkProbeOptions>;
  /** Bounds of the datagram loss probe (loss_probe.ts). */
  lossProbe?: Partial<LossProbeOptions>;
}
