/**
 * Which congestion controller a prefill worker sends the state to each decode worker with.
 * Cubic keeps more of a clean fast link's rate (0.81-0.98 of the line at 0.2-2 ms, BBR
 * 0.53-0.95); under 0.1% random loss Cubic falls to 0.05-0.53 and BBR keeps 0.37-0.95, and a
 * handoff's tail over a lossy 10 ms link went from 21-896 ms (Cubic) to 21-104 ms (BBR)
 * (docs/bench-report/link-matrix/FINDINGS.md, section 000000000). So `auto` sends with Cubic until the link's
 * own loss probe (serve/link_loss.ts) finds loss, and with BBR from then on, and back when a
 * later probe finds none. A change applies to new handoffs: the link is replaced, and the
 * handoffs on the old one finish there (never migrated).
 *
 * @module
 */
import {
  type CongestionControl,
  type CongestionControlMode,
  startingController,
} from "../core/mod.ts";

/**
 * `auto`: a decode worker's link whose loss probe lost at least this fraction of its
 * datagrams (in loss events, as placement counts them) is sent over with BBR. A lossless link
 * here probes at exactly 0; 0.1% emulated loss at 0.022-0.198%.
 */
export const DEFAULT_BBR_LOSS_FRACTION_MIN = 0.0002;

export class CongestionChoice {
  readonly #chosen = new Map<string, CongestionControl>();

  constructor(
    readonly mode: CongestionControlMode,
    readonly bbrLossFractionMin: number = DEFAULT_BBR_LOSS_FRACTION_MIN,
  ) {}

  /** The controller new handoffs to `decoderNodeId` go with. */
  for(decoderNodeId: string): CongestionControl {
    if (this.mode !== "auto") return this.mode;
    return this.#chosen.get(decoderNodeId) ?? startingController(this.mode);
  }

  /**
   * After a loss probe of the link to `decoderNodeId` (`lossEvents` among `sent` datagrams):
   * the controller new handoffs go with from now on when it changed, else null.
   */
  afterProbe(decoderNodeId: string, sent: number, lossEvents: number): CongestionControl | null {
    if (this.mode !== "auto" || sent <= 0) return null;
    const before = this.for(decoderNodeId);
    const now: CongestionControl = lossEvents / sent >= this.bbrLossFractionMin ? "bbr" : "cubic";
    this.#chosen.set(decoderNodeId, now);
    return now === before ? null : now;
  }
}
