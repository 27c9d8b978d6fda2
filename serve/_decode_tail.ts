/**
 * The end-of-prompt components a decode-side handoff attempt receives besides KV pages
 * (recurrent snapshot, SWA cache, MTP hidden row, positions, sampler, history, first token):
 * held, uncommitted, until the import step hands the snapshots to the staged import, and
 * zeroed when the attempt is wiped.
 */
import {
  type ChunkHeader,
  decodePositions,
  decodeSampler,
  decodeTokens,
  describeComponent,
  type Range,
  type SamplerPayload,
  StateValidationError,
} from "../core/mod.ts";
import type { StagedImport } from "../ffi/staged_import.ts";
import { countEntries } from "../ffi/state.ts";

/** One received run of recurrent layers (a conv or ssm chunk), held until import. */
interface LayerRun {
  layers: Range;
  payload: Uint8Array;
}

export class StagedTail {
  readonly #conv: LayerRun[] = [];
  readonly #ssm: LayerRun[] = [];
  swa?: Uint8Array;
  mtpHidden?: Uint8Array;
  positions?: number;
  sampler?: SamplerPayload;
  history?: Int32Array;
  firstToken?: number;

  /**
   * @param trunkKinds the decoder's own trunk layer kinds (numerical identity, MTP left out):
   *   each conv/ssm chunk must hold exactly one entry per recurrent layer of its layer range.
   */
  constructor(readonly promptTokens: number, readonly trunkKinds: readonly string[] = []) {}

  /** Takes one component that is not a KV page; throws StateValidationError if inconsistent. */
  take(h: ChunkHeader, payload: Uint8Array): void {
    const n = this.promptTokens;
    switch (h.kind) {
      case "conv":
      case "ssm":
        return this.#takeRun(h, payload);
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

  #takeRun(h: ChunkHeader, payload: Uint8Array): void {
    const [a, b] = h.layerRange;
    const expected = this.trunkKinds.slice(a, b).filter((k) => k === "recurrent").length;
    const headed = h.kind === "conv" && a === 0;
    const found = countEntries(payload, headed);
    if (found !== expected) {
      throw new StateValidationError(
        `Cannot stage ${describeComponent(h.kind, h.layerRange, h.tokenRange)}: ${
          found === null ? "it does not parse as recurrent rows" : `${found} layers`
        }, expected ${expected}`,
      );
    }
    (h.kind === "conv" ? this.#conv : this.#ssm).push({ layers: h.layerRange, payload });
  }

  /** Bytes of recurrent state held (not yet imported). */
  get recurrentBytes(): number {
    return [...this.#conv, ...this.#ssm].reduce((n, r) => n + r.payload.byteLength, 0);
  }

  /**
   * The snapshot as llama.cpp reads it: conv runs then ssm runs, each in layer order, joined
   * into one fresh buffer (the ledger and manifest already proved the runs tile the trunk).
   */
  #joinRecurrent(): Uint8Array<ArrayBuffer> | null {
    if (this.#conv.length === 0 || this.#ssm.length === 0) return null;
    const runs = [...this.#conv, ...this.#ssm];
    const byLayer = (x: LayerRun, y: LayerRun) => x.layers[0] - y.layers[0];
    const ordered = [...this.#conv.sort(byLayer), ...this.#ssm.sort(byLayer)];
    const out = new Uint8Array(runs.reduce((n, r) => n + r.payload.byteLength, 0));
    let at = 0;
    for (const r of ordered) {
      out.set(r.payload, at);
      at += r.payload.byteLength;
    }
    return out;
  }

  /** Hands the snapshots to `staged` and checks every metadata component arrived. */
  async importInto(staged: StagedImport): Promise<void> {
    const blob = this.#joinRecurrent();
    if (blob) await staged.setRecurrent({ layout: "whole", blob });
    if (this.swa) await staged.setSwa(this.swa);
    if (this.mtpHidden) staged.setMtpHidden(this.mtpHidden);
    const missing = (["positions", "sampler", "history", "firstToken"] as const).find((k) =>
      this[k] === undefined
    );
    if (missing) throw new StateValidationError(`Cannot commit: ${missing} missing`);
  }

  /** Zeroes and drops everything held. */
  wipe(): void {
    for (const r of [...this.#conv, ...this.#ssm]) r.payload.fill(0);
    this.#conv.length = 0;
    this.#ssm.length = 0;
    for (const v of [this.swa, this.mtpHidden, this.history]) v?.fill(0);
    this.swa =
      this.mtpHidden =
      this.history =
        undefined;
    this.positions = this.sampler = this.firstToken = undefined;
  }
}
