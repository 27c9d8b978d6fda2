/**
 * The decoder's record of what has been staged for one handoff. Pure bookkeeping: it sees
 * chunk headers (already tag- and checksum-verified), never payload bytes.
 *
 * It fails closed: after the first rejected chunk the ledger is poisoned, and
 * `verifyAgainst` reports that rejection instead of ever returning ok, so the session stays
 * uncommitted even if a caller ignored the exception.
 *
 * @module
 */
import { type ChunkHeader, describeChunk } from "./chunk.ts";
import { IdentityMismatchError, LimitExceededError, StateValidationError } from "./errors.ts";
import {
  componentOf,
  type FinalManifest,
  findIncompleteness,
  mandatoryVerifySteps,
  type ManifestComponent,
} from "./manifest.ts";
import {
  allowedInFamily,
  type ComponentKind,
  componentRule,
  DEFAULT_STATE_BOUNDS,
  describeComponent,
  formatPiece,
  formatRange,
  type ModelFamily,
  type Range,
  rangesOverlap,
  STATE_SCHEMA_VERSION,
  type StateBounds,
} from "./schema.ts";

/** What a ledger is bound to, and its limits. */
export interface StagingLedgerOptions {
  handoffId: string;
  /** The decoder's own identity digest: chunks from any other identity are refused. */
  identityDigest: string;
  family: ModelFamily;
  /** Trunk layers of the decoder's model (see `trunkLayerCount`). */
  trunkLayers: number;
  /** Credit granted at reservation, in bytes; more arrives through `grantCredit`. */
  creditBytes: number;
  schemaVersion?: number;
  bounds?: StateBounds;
}

/** Result of `verifyAgainst`. */
export type LedgerVerdict = { ok: true } | { ok: false; error: StateValidationError };

type LedgerError = StateValidationError | IdentityMismatchError | LimitExceededError;

/** The pages of one paged kind over one layer range (kv-page per layer range; mtp-kv). */
interface Lane {
  kind: ComponentKind;
  layers: Range;
  end: number;
}

/**
 * Records accepted chunk headers and checks them against the final manifest.
 *
 * @example
 * ```ts
 * const ledger = new StagingLedger({ handoffId, identityDigest, family: "hybrid",
 *   trunkLayers: 6, creditBytes: 64 << 20 });
 * ledger.accept(header);               // throws on duplicates, gaps, overlaps, credit
 * const verdict = ledger.verifyAgainst(manifest);
 * if (!verdict.ok) throw verdict.error;
 * ```
 */
export class StagingLedger {
  readonly #opts: Required<StagingLedgerOptions>;
  readonly #records = new Map<string, ManifestComponent>();
  readonly #lanes = new Map<string, Lane>();
  readonly #snapshotLayers = new Map<ComponentKind, Range[]>();
  readonly #singles = new Set<ComponentKind>();
  /** Components arriving in byte pieces: the whole's size and the bytes staged so far. */
  readonly #pieces = new Map<string, { of: number; end: number }>();
  #nextSeq = 0;
  #finalSeen = false;
  #sealedAt: number | null = null;
  #receivedBytes = 0;
  #creditBytes: number;
  #poison: LedgerError | null = null;

  constructor(options: StagingLedgerOptions) {
    this.#opts = {
      schemaVersion: STATE_SCHEMA_VERSION,
      bounds: DEFAULT_STATE_BOUNDS,
      ...options,
    };
    this.#creditBytes = 0;
    this.grantCredit(options.creditBytes);
  }

  /** Payload bytes accepted so far. */
  get receivedBytes(): number {
    return this.#receivedBytes;
  }

  /** Bytes the decoder has granted in total (initial credit plus every grant). */
  get creditBytes(): number {
    return this.#creditBytes;
  }

  /** Chunks accepted so far. */
  get chunkCount(): number {
    return this.#nextSeq;
  }

  /** True once the chunk marked `final` was accepted. */
  get finalSeen(): boolean {
    return this.#finalSeen;
  }

  /** The rejection that poisoned this ledger, or null. */
  get failure(): LedgerError | null {
    return this.#poison;
  }

  /** Accepted components in stream order. */
  components(): ManifestComponent[] {
    return [...this.#records.values()].map((c) => ({ ...c }));
  }

  /** Adds `bytes` of transfer credit (the decoder sent a TransferCredit). */
  grantCredit(bytes: number): void {
    if (!Number.isSafeInteger(bytes) || bytes < 0) {
      throw new LimitExceededError(`Invalid credit grant of ${bytes} bytes`);
    }
    const total = this.#creditBytes + bytes;
    this.#creditBytes = Math.min(total, this.#opts.bounds.stateBytesMax);
  }

  /**
   * Records `h` or throws (StateValidationError, IdentityMismatchError, LimitExceededError)
   * naming the chunk and range. Nothing is recorded on a throw, and the ledger is poisoned.
   */
  accept(h: ChunkHeader): void {
    if (this.#poison) throw this.#poison;
    try {
      this.#checkBinding(h);
      this.#checkSequence(h);
      this.#checkLimits(h);
      const commit = this.#checkPlacement(h);
      commit();
    } catch (error) {
      this.#poison = error as LedgerError;
      throw error;
    }
    this.#records.set(_key(h), componentOf(h));
    this.#nextSeq++;
    this.#receivedBytes += h.payloadBytes;
    if (h.final) this.#finalSeen = true;
  }

  #checkBinding(h: ChunkHeader): void {
    const name = describeChunk(h);
    if (h.handoffId !== this.#opts.handoffId) {
      throw new StateValidationError(`Cannot stage state ${name}: it belongs to another handoff`);
    }
    if (h.identityDigest !== this.#opts.identityDigest) {
      throw new IdentityMismatchError(
        `Cannot stage state ${name}: exported under a different numerical identity`,
        { hint: "run `compareIdentity` on both workers' identities to see which field differs" },
      );
    }
    if (h.schemaVersion !== this.#opts.schemaVersion) {
      throw new StateValidationError(
        `Cannot stage state ${name}: schema version ${h.schemaVersion}, expected ${this.#opts.schemaVersion}`,
      );
    }
    if (!allowedInFamily(this.#opts.family, h.kind)) {
      throw new StateValidationError(
        `Cannot stage state ${name}: not a component of family "${this.#opts.family}"`,
      );
    }
  }

  #checkSequence(h: ChunkHeader): void {
    const name = describeChunk(h);
    if (this.#finalSeen) {
      throw new StateValidationError(
        `Cannot stage state ${name}: it arrived after the final chunk`,
      );
    }
    if (h.seq < this.#nextSeq) {
      throw new StateValidationError(`Cannot stage state ${name}: duplicate or replayed chunk`);
    }
    if (h.seq > this.#nextSeq) {
      throw new StateValidationError(
        `Cannot stage state ${name}: out of order, expected chunk ${this.#nextSeq}`,
      );
    }
  }

  #checkLimits(h: ChunkHeader): void {
    const { bounds } = this.#opts;
    const after = this.#receivedBytes + h.payloadBytes;
    if (this.#nextSeq + 1 > bounds.chunksMax) {
      throw new LimitExceededError(
        `Cannot stage state ${describeChunk(h)}: more than ${bounds.chunksMax} chunks`,
      );
    }
    if (after > bounds.stateBytesMax) {
      throw new LimitExceededError(
        `Cannot stage state ${
          describeChunk(h)
        }: state would reach ${after} bytes, over stateBytesMax ${bounds.stateBytesMax}`,
      );
    }
    if (after > this.#creditBytes) {
      throw new LimitExceededError(
        `Cannot stage state ${
          describeChunk(h)
        }: ${after} bytes exceed the ${this.#creditBytes} bytes of credit granted`,
        { hint: "the prefiller must wait for TransferCredit before sending more" },
      );
    }
  }

  // Returns the mutation to apply once every check has passed, so a rejection changes nothing.
  #checkPlacement(h: ChunkHeader): () => void {
    const rule = componentRule(h.kind);
    if (rule.layered && h.layerRange[1] > this.#opts.trunkLayers) {
      throw this.#placementError(h, `the model has ${this.#opts.trunkLayers} trunk layers`);
    }
    if (rule.order === "paged") return this.#checkPage(h);
    if (rule.order === "after-pages") return this.#checkSnapshot(h);
    const lane = this.#pieces.get(_wholeKey(h));
    if (lane) return this.#checkNextPiece(h, lane);
    if (this.#singles.has(h.kind)) throw this.#placementError(h, `duplicate ${h.kind}`);
    const pieces = this.#startPieces(h);
    return () => (this.#singles.add(h.kind), pieces?.());
  }

  /** The first piece of a component (from byte 0) opens its lane; undefined when whole. */
  #startPieces(h: ChunkHeader): (() => void) | undefined {
    if (!h.piece) return undefined;
    const [a, b] = h.piece.range;
    if (a !== 0) throw this.#pieceGap(h, [0, a]);
    const lane = { of: h.piece.of, end: b };
    const key = _wholeKey(h);
    return () => this.#pieces.set(key, lane);
  }

  #checkPage(h: ChunkHeader): () => void {
    // Snapshots may arrive before the last pages (the prefiller sends recurrent layers while
    // the last chunk still computes), but they fix n: no page may reach past it.
    if (this.#sealedAt !== null && h.tokenRange[1] > this.#sealedAt) {
      throw this.#placementError(h, `lies past the snapshot position ${this.#sealedAt}`);
    }
    const laneKey = `${h.kind} ${formatRange(h.layerRange)}`;
    const lane = this.#lanes.get(laneKey);
    const [p0, p1] = h.tokenRange;
    if (!lane) {
      const clash = [...this.#lanes.values()].find((l) =>
        l.kind === h.kind && rangesOverlap(l.layers, h.layerRange)
      );
      if (clash) {
        throw this.#placementError(
          h,
          `layers overlap pages of layers ${formatRange(clash.layers)}`,
        );
      }
      if (p0 !== 0) throw this.#missing(h, [0, p0]);
      return () => this.#lanes.set(laneKey, { kind: h.kind, layers: h.layerRange, end: p1 });
    }
    if (p0 < lane.end) {
      throw this.#placementError(
        h,
        `overlaps tokens ${formatRange([p0, Math.min(lane.end, p1)])} already staged`,
      );
    }
    if (p0 > lane.end) throw this.#missing(h, [lane.end, p0]);
    return () => (lane.end = p1);
  }

  #checkSnapshot(h: ChunkHeader): () => void {
    const n = this.#pagesEnd(h);
    const rule = componentRule(h.kind);
    const [p0, p1] = h.tokenRange;
    const fits = rule.tokens === "next" ? p0 === n : p1 === n;
    if (!fits) throw this.#placementError(h, `does not match the last page position ${n}`);
    const seal = () => (this.#sealedAt = n);
    // A later piece of a component: it must continue the bytes staged so far, in order.
    const lane = this.#pieces.get(_wholeKey(h));
    if (lane) return this.#checkNextPiece(h, lane);
    const startPieces = () => this.#startPieces(h);
    if (!rule.layered) {
      if (this.#singles.has(h.kind)) throw this.#placementError(h, `duplicate ${h.kind}`);
      const pieces = startPieces();
      return () => (seal(), this.#singles.add(h.kind), pieces?.());
    }
    const seen = this.#snapshotLayers.get(h.kind) ?? [];
    const clash = seen.find((r) => rangesOverlap(r, h.layerRange));
    if (clash) {
      throw this.#placementError(h, `duplicate ${h.kind} for layers ${formatRange(clash)}`);
    }
    const pieces = startPieces();
    return () => (seal(), this.#snapshotLayers.set(h.kind, [...seen, h.layerRange]), pieces?.());
  }

  #checkNextPiece(h: ChunkHeader, lane: { of: number; end: number }): () => void {
    if (!h.piece) {
      throw this.#placementError(h, `duplicate ${h.kind}: it already arrived in pieces`);
    }
    const [a, b] = h.piece.range;
    if (h.piece.of !== lane.of) {
      throw this.#placementError(h, `earlier pieces cut it from ${lane.of} bytes`);
    }
    if (a < lane.end) {
      throw this.#placementError(
        h,
        `overlaps bytes ${formatRange([a, Math.min(lane.end, b)])} already staged`,
      );
    }
    if (a > lane.end) throw this.#pieceGap(h, [lane.end, a]);
    return () => (lane.end = b);
  }

  #pieceGap(h: ChunkHeader, gap: Range): StateValidationError {
    return this.#placementError(
      h,
      `bytes ${formatRange(gap)} missing (pieces must arrive in byte order)`,
    );
  }

  // The position the snapshots describe: fixed by the first one (its own end), which no page
  // lane may already have passed. Lanes that stop short are caught at verify (incomplete).
  #pagesEnd(h: ChunkHeader): number {
    if (this.#sealedAt !== null) return this.#sealedAt;
    const own = componentRule(h.kind).tokens === "next" ? h.tokenRange[0] : h.tokenRange[1];
    const reached = Math.max(0, ...[...this.#lanes.values()].map((l) => l.end));
    return reached > own ? reached : own;
  }

  #placementError(h: ChunkHeader, detail: string): StateValidationError {
    return new StateValidationError(`Cannot stage state ${describeChunk(h)}: ${detail}`);
  }

  #missing(h: ChunkHeader, gap: Range): StateValidationError {
    const missing = describeComponent(h.kind, h.layerRange, gap);
    return new StateValidationError(
      `Cannot stage state ${
        describeChunk(h)
      }: ${missing} missing (pages must arrive in token order)`,
    );
  }

  /**
   * Compares what was staged with the final manifest: binding, completeness for the family,
   * and every component's size and checksum. Never ok after any rejected chunk.
   */
  verifyAgainst(m: FinalManifest): LedgerVerdict {
    const fail = (detail: string): LedgerVerdict => ({
      ok: false,
      error: new StateValidationError(`Cannot commit handoff: ${detail}`, {
        hint: "the decoder stays uncommitted; the handoff will be retried or recomputed",
      }),
    });
    if (this.#poison) return fail(`a chunk was rejected earlier (${this.#poison.message})`);
    const o = this.#opts;
    if (m.handoffId !== o.handoffId) return fail("the manifest belongs to another handoff");
    if (m.identityDigest !== o.identityDigest) return fail("manifest identity differs");
    if (m.schemaVersion !== o.schemaVersion) {
      return fail(`manifest schema version ${m.schemaVersion}`);
    }
    if (m.family !== o.family) return fail(`manifest family "${m.family}", expected "${o.family}"`);
    if (!this.#finalSeen) return fail("the final chunk has not arrived");
    const step = mandatoryVerifySteps(o.family).find((s) => !m.verify.includes(s));
    if (step) return fail(`the manifest's verify list lacks "${step}"`);
    const incomplete = findIncompleteness(m, o.trunkLayers);
    if (incomplete) return { ok: false, error: incomplete };
    return this.#compareComponents(m, fail);
  }

  #compareComponents(m: FinalManifest, fail: (d: string) => LedgerVerdict): LedgerVerdict {
    const listed = new Set<string>();
    for (const c of m.components) {
      const key = _key(c);
      const name = describeComponent(c.kind, c.layerRange, c.tokenRange) + formatPiece(c.piece);
      if (listed.has(key)) return fail(`${name} listed twice`);
      listed.add(key);
      const staged = this.#records.get(key);
      if (!staged) return fail(`${name} missing`);
      if (staged.bytes !== c.bytes) {
        return fail(`${name} size mismatch (manifest ${c.bytes} bytes, staged ${staged.bytes})`);
      }
      if (staged.checksum !== c.checksum) return fail(`${name} checksum mismatch`);
    }
    for (const [key, c] of this.#records) {
      if (!listed.has(key)) {
        const name = describeComponent(c.kind, c.layerRange, c.tokenRange) + formatPiece(c.piece);
        return fail(`${name} not in the manifest`);
      }
    }
    return { ok: true };
  }
}

/** A component as a whole (all its pieces share it). */
function _wholeKey(c: Pick<ManifestComponent, "kind" | "layerRange" | "tokenRange">): string {
  const { kind, layerRange: l, tokenRange: t } = c;
  return `${kind} ${l[0]} ${l[1]} ${t[0]} ${t[1]}`;
}

/** One record: a whole component, or one piece of it. */
function _key(c: Pick<ManifestComponent, "kind" | "layerRange" | "tokenRange" | "piece">): string {
  const p = c.piece;
  return p ? `${_wholeKey(c)} ${p.range[0]} ${p.range[1]} ${p.of}` : _wholeKey(c);
}
