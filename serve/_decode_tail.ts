/**
 * The end-of-prompt components a decode-side handoff attempt receives besides KV pages and
 * recurrent runs (SWA cache, MTP hidden row, positions, sampler, history, first token):
 * held, uncommitted, until the import step hands the snapshots to the staged import, and
 * zeroed when the attempt is wiped. A component larger than a chunk arrives in byte pieces
 * (schema 3), which are joined here once the last one is in; the ledger has already checked
 * that they come in byte order without gaps.
 */
import {
  type ChunkHeader,
  concatBytes,
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

  /** Components being joined from their pieces, by kind (each kind is one component here). */
  readonly #pieces = new Map<string, { of: number; parts: Uint8Array[]; end: number }>();

  constructor(readonly promptTokens: number) {}

  /** Takes one component that is not a KV page; throws StateValidationError if inconsistent. */
  take(h: ChunkHeader, payload: Uint8Array): void {
    const whole = h.piece ? this.#join(h, payload) : payload;
    if (h.piece === undefined && this.#pieces.has(h.kind)) {
      throw new StateValidationError(`Cannot stage ${h.kind}: it is arriving in pieces`);
    }
    if (whole) this.#takeWhole(h, whole);
  }

  /** Adds a piece; returns the joined component once its last piece is in, else null. */
  #join(h: ChunkHeader, payload: Uint8Array): Uint8Array | null {
    const { range: [a, b], of } = h.piece!;
    const open = this.#pieces.get(h.kind) ?? { of, parts: [], end: 0 };
    if (open.end !== a || open.of !== of) {
      throw new StateValidationError(
        `Cannot stage ${h.kind}: a piece at byte ${a} of ${of}, expected byte ${open.end} of ${open.of}`,
      );
    }
    open.parts.push(payload);
    open.end = b;
    this.#pieces.set(h.kind, open);
    if (b < of) return null;
    this.#pieces.delete(h.kind);
    const whole = concatBytes(open.parts);
    for (const p of open.parts) p.fill(0);
    return whole;
  }

  #takeWhole(h: ChunkHeader, payload: Uint8Array): void {
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
    for (const open of this.#pieces.values()) open.parts.forEach((p) => p.fill(0));
    this.#pieces.clear();
    for (const v of [this.swa, this.mtpHidden, this.history]) v?.fill(0);
    this.swa =
      this.mtpHidden =
      this.history =
        undefined;
    this.positions = this.sampler = this.firstToken = undefined;
  }
}
