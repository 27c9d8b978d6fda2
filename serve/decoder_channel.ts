/**
 * One handoff's view of its decode worker on the prefill worker: the prefill worker's one
 * authenticated link per decode peer (serve/peer_links.ts, shared by every handoff to that
 * peer) and this handoff's mailbox on it. Control messages travel on the link's shared
 * control stream, routed by handoff id; each handoff attempt opens its own handoff stream on
 * the same connection. Closing a channel leaves the link open for the next handoff.
 */
import type { Capabilities, HandoffSender, PeerConnection } from "../transport/mod.ts";
import type { Mailbox, PeerLink } from "./peer_links.ts";

export class DecoderChannel {
  readonly #mailbox: Mailbox;
  #closed = false;

  constructor(readonly link: PeerLink, readonly handoffId: string) {
    this.#mailbox = link.subscribe(handoffId);
  }

  get peerCapabilities(): Capabilities {
    return this.link.peerCapabilities;
  }

  /** Sends a control message on the shared link. */
  async send(header: Record<string, unknown>): Promise<void> {
    await this.link.send(header);
  }

  /** A handoff stream of its own on the shared connection. */
  async openHandoffStream(
    meta: Parameters<PeerConnection["openHandoffStream"]>[0],
  ): Promise<HandoffSender> {
    return await this.link.conn.openHandoffStream(meta);
  }

  /**
   * The next control message for this handoff. Rejects with PeerError once the link is lost
   * or the channel is closed.
   */
  async receive(): Promise<Record<string, unknown>> {
    return (await this.#mailbox.next()).header;
  }

  /** Leaves the link (idempotent); the link stays open for other handoffs. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.link.unsubscribe(this.handoffId);
  }
}
