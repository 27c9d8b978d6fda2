/**
 * The end-of-prompt components a decode-side handoff attempt receives besides KV pages and
 * recurrent runs (SWA cache, MTP hidden row, positions, sampler, history, first token):
 * held, uncommitted, until the import step hands the snapshots to the staged import, and
 * zeroed when the attempt is wiped.
 */
import {
  type ChunkHeader,
  decodePositions,
  decodeSampler,
  decodeTokens,
  type SamplerPayload,
  StateValidationError,
} from "../core/mod.ts";
import type { StagedImport } from "../ffi/staged_import.ts";

export class StagedTail {
  swa?: Uint8Array;
  mtpHidden?: Uint8Array;
  positions?: number;
  sampler?: SamplerPayload;
  history?: Int32Array;
  firstToken?: number;

  constructor(readonly promptTokens: number) {}

  /** Takes one component that is not a KV page; throws StateValidationError if inconsistent. */
  take(h: ChunkHeader, payload: Uint8Array): void {
    const n = this.promptTokens;
    switch (h.kind) {
      case "swa-kv":
        this.swa = payload;
        return;
      case "mtp-hidden":
        this.mtpHidden = payload;
        return;
      case "positions": {
        const p = decodePositions(payload);
        if (p.nPast !== n) throw new StateValidationError(`positions: n_past is not ${n}`);
        this.positions = p.nPast;
        return;
      }
      case "sampler":
        this.sampler = decodeSampler(payload);
        return;
      case "history":
        this.history = decodeTokens(payload, "history");
        if (this.history.length !== n) {
          throw new StateValidationError(
            `history: ${this.history.length} tokens, expected ${n}`,
          );
        }
        return;
      case "first-token":
        this.firstToken = decodeTokens(payload, "first-token")[0];
        return;
      default:
        throw new StateValidationError(`Cannot stage ${h.kind} as an end-of-prompt component`);
    }
  }

  /** Hands the snapshots to `staged` and checks every metadata component arrived. */
  async importInto(staged: StagedImport): Promise<void> {
    if (this.swa) await staged.setSwa(this.swa);
    if (this.mtpHidden) staged.setMtpHidden(this.mtpHidden);
    const missing = (["positions", "sampler", "history", "firstToken"] as const).find((k) =>
      this[k] === undefined
    );
    if (missing) throw new StateValidationError(`Cannot commit: ${missing} missing`);
  }

  /** Zeroes and drops everything held. */
  wipe(): void {
    for (const v of [this.swa, this.mtpHidden, this.history]) v?.fill(0);
    this.swa =
      this.mtpHidden =
      this.history =
        undefined;
    this.positions = this.sampler = this.firstToken = undefined;
  }
}
