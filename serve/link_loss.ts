/**
 * The prefill worker's measurement of its links to decode workers. The coordinator cannot see
 * the prefill -> decode link, and the handoffs' own transfers show its rate but not its loss
 * (a stream retransmits what was lost). So after a committed handoff to a decoder, when the
 * link has no recent loss probe, this worker measures it as a node does (`LinkMonitor`: pings,
 * a bandwidth probe, then a datagram loss probe paced under that rate), in the background: no
 * request waits for it. Every outcome it sends the coordinator carries the
 * newest loss probe of that decoder's link (`LinkLossReport`) and the bandwidth probe before
 * it, which the coordinator's placement reads as the pair's loss, and as its rate while no
 * handoff has given one (api/live_placement.ts).
 *
 * Bounds: one measurement per decoder at a time, none while one younger than
 * `lossProbeAgeMsMax` exists, and each probe within the monitor's bounds.
 *
 * @module
 */
import { LinkMonitor, type LinkMonitorOptions } from "../transport/link_monitor.ts";
import type { PeerConnection } from "../transport/peer.ts";
import type { LinkLossReport } from "./messages.ts";

export class DecoderLinkLoss {
  /** Each loss probe's counts, once measured (the prefill role's congestion controller choice). */
  onProbe: ((decoderNodeId: string, sent: number, lossEvents: number) => void) | null = null;
  readonly #monitor: LinkMonitor;
  readonly #latest = new Map<
    string,
    {
      probe: number;
      sent: number;
      received: number;
      lossEvents: number;
      atMs: number;
      bandwidthProbe?: { bytes: number; receiveMs: number };
    }
  >();
  readonly #running = new Set<string>();
  #closed = false;

  constructor(
    nodeId: string,
    readonly log: (line: string) => void,
    options: Partial<LinkMonitorOptions> = {},
  ) {
    this.#monitor = new LinkMonitor(nodeId, undefined, options);
  }

  /**
   * After a committed handoff over `conn`: measures the link in the background if it has no
   * recent loss probe (and the decoder answers one). Resolves when that is done (callers need
   * not wait; tests do).
   */
  async afterHandoff(conn: PeerConnection): Promise<void> {
    const to = conn.peerNodeId;
    const latest = this.#latest.get(to);
    const fresh = latest &&
      performance.now() - latest.atMs <= this.#monitor.options.lossProbeAgeMsMax;
    if (this.#closed || !conn.supportsLossProbe || fresh || this.#running.has(to)) return;
    this.#running.add(to);
    try {
      const rate = await this.#monitor.measureRate(conn);
      const r = await this.#monitor.probeLoss(conn);
      const e = this.#monitor.estimate(this.#monitor.pairTo(conn));
      if (!r || !e) {
        this.log(`link to decode worker ${to}: loss probe not run; its loss stays unmeasured`);
        return;
      }
      const probe = crypto.getRandomValues(new Uint32Array(1))[0];
      const { sent, received, lossEvents } = r;
      const atMs = performance.now();
      this.#latest.set(to, {
        probe,
        sent,
        received,
        lossEvents,
        atMs,
        ...(rate ? { bandwidthProbe: rate } : {}),
      });
      this.log(
        `link to decode worker ${to}: ${((e.bandwidthBytesPerS ?? 0) / 1e6).toFixed(1)} MB/s, ` +
          `RTT ${(e.rttMs ?? 0).toFixed(2)} ms, ${sent - received} of ${sent} datagrams lost ` +
          `in ${lossEvents} loss events`,
      );
      this.onProbe?.(to, sent, lossEvents);
    } catch (error) {
      // A measurement cut short by this worker's own shutdown is no finding.
      if (this.#closed) return;
      this.log(`link to decode worker ${to}: measurement failed: ${(error as Error).message}`);
    } finally {
      this.#running.delete(to);
    }
  }

  /** The worker is closing: no new measurement, and none that its links' close cuts short is logged. */
  close(): void {
    this.#closed = true;
  }

  /** The newest loss probe of the link to `decoderNodeId`, for an outcome (null: none yet). */
  report(decoderNodeId: string): LinkLossReport | null {
    const l = this.#latest.get(decoderNodeId);
    if (!l) return null;
    const { atMs, ...report } = l;
    return { ...report, ageMs: performance.now() - atMs };
  }
}
