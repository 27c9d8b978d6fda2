/**
 * The prefill side of a handoff's state: prefill the prompt in chunks, export each chunk's KV
 * page right after the chunk that produced it, then the components that exist only at the end
 * (recurrent snapshot, SWA cache, MTP draft state, positions, sampler, history, first token),
 * each as a typed chunk with header and checksum. Chunks go to a bounded queue that the
 * handoff loop drains as credit allows; prefill waits only when that queue is full.
 *
 * Ownership: the exporter keeps nothing. The handoff loop retains what a retry needs (see
 * prefill_session.ts); KV pages can always be exported again from the context with
 * `reexportPage`, because the cells of a finished chunk never change.
 */
import {
  buildManifest,
  type ChunkHeader,
  type ComponentKind,
  componentOf,
  DEFAULT_STATE_BOUNDS,
  encodePositions,
  encodeSampler,
  encodeTokens,
  LimitExceededError,
  payloadChecksum,
  type Range,
  type SamplerState,
  sampleToken,
  type SamplingParams,
  StateValidationError,
  type UnsignedManifest,
  UsageError,
} from "../core/mod.ts";
import { exportKvPage, exportSwa } from "../ffi/state.ts";
import { ChunkMaker, type ExportedChunk } from "./_export_chunks.ts";
import { exportSnapshot } from "./_snapshot_export.ts";
import type { LlamaContext } from "../ffi/mod.ts";
import type { ChunkDone, Engine, PrefillHooks } from "./engine.ts";
import { openLayerCapture, streamLayers } from "./_layer_stream.ts";
import type { ResolvedIdentity } from "./identity.ts";
import type { MtpDraft } from "../ffi/mtp.ts";
import { logitsDigest, probeStep } from "./probe.ts";

export type { ExportedChunk };

/**
 * The prefix cache's part in one export (serve/prefix_cache.ts): the context already holds
 * the first `restoredTokens` tokens (their pages are exported first, marked cached), and the
 * prefill stops at each of `checkpoints` to let `onCheckpoint` snapshot the sequence.
 */
export interface ExportPrefix {
  restoredTokens: number;
  checkpoints: readonly number[];
  onCheckpoint: (pos: number) => Promise<void>;
  /**
   * Hears about tokens restored (`cached`) and computed where no page carries them (a pure
   * recurrent model), so telemetry can still report the split.
   */
  onUnpagedTokens?: (tokens: number, cached: boolean) => void;
}

/** No prefix-cache part: nothing restored, no checkpoints. */
export const NO_PREFIX: Readonly<ExportPrefix> = {
  restoredTokens: 0,
  checkpoints: [],
  onCheckpoint: () => Promise.resolve(),
};

/** What the export produced besides the chunks. */
export interface ExportResult {
  nTokens: number;
  firstToken: number;
  /** SHA-256 of the logits after decoding the first token: the continuation probe. */
  probeLogitsSha256: string;
  /**
   * Those logits: the context now holds the prompt and the first token, so the prefill worker
   * can continue generating from here itself (its decode worker lost before the commit).
   */
  probeLogits: Float32Array;
  /** SHA-256 of the prompt's last logits (the first token was sampled from them). */
  firstLogitsSha256: string;
  /**
   * The last chunk's KV page left while that chunk still computed (layer capture), not after
   * it: exported when the last attention layer had written its rows.
   */
  lastPageCaptured: boolean;
}

/** Where exported chunks go; resolves when the queue has room for the next one. */
export type ChunkSink = (chunk: ExportedChunk, exportMs: number) => Promise<void>;

/** Chunk sizes the exporter cuts state into, each named with its unit. */
export interface ExportLimits {
  /**
   * Largest chunk payload: at most the receiver's `chunkPayloadBytesMax` (one frame's
   * payload). KV pages are cut into token sub-ranges that fit, snapshot runs and the other
   * end-of-prompt components into byte pieces (schema 3); one token's KV page must fit.
   */
  chunkBytesMax: number;
  /**
   * Preferred size of one recurrent snapshot chunk: small enough that sending begins after
   * the first few layers are checksummed and hashing overlaps the wire, large enough that
   * per-chunk costs (tag, frame, ledger) stay negligible.
   */
  snapshotChunkBytes: number;
  /**
   * Send each recurrent layer's final rows while the last chunk still computes (the shim's
   * layer capture); off, or where the capture cannot run, the snapshot is exported after.
   */
  layerCapture: boolean;
  /**
   * With `layerCapture`, in a model with attention layers: send the last chunk's KV page as
   * soon as the last attention layer has written it, while later layers still compute; off,
   * it is exported after the chunk.
   */
  lastPageCapture: boolean;
}

export const DEFAULT_EXPORT_LIMITS: Readonly<ExportLimits> = {
  chunkBytesMax: DEFAULT_STATE_BOUNDS.chunkPayloadBytesMax,
  snapshotChunkBytes: 4 * 1024 * 1024,
  layerCapture: true,
  lastPageCapture: true,
};

/** Smallest `chunkBytesMax`: the snapshot header and a token's page of any model here fit. */
export const CHUNK_BYTES_MIN = 1024;

/**
 * Called once, right after the last prefill chunk is computed and the first token sampled,
 * before the last page and the tail are exported, with the logits it was sampled from and when
 * that was (this process's clock). It must not block: the export waits for it to return.
 */
export type FirstTokenHook = (
  token: number,
  logits: Float32Array,
  prefillEndMs: number,
  /** The last chunk's positions and its compute alone (the decode, not the sends around it). */
  lastChunk?: ChunkDone,
) => void;

export class StateExporter {
  readonly #chunks: ChunkMaker;
  /** Recurrent layers (by index) the layer capture already sent for this run. */
  #captured = new Set<number>();
  /** Per paged kind: tokens per page that fit `chunkBytesMax`, once a range was too large. */
  readonly #pageTokens = new Map<string, number>();

  constructor(
    readonly engine: Engine,
    readonly identity: ResolvedIdentity,
    readonly handoffId: string,
    readonly draft: MtpDraft | null,
    readonly limits: ExportLimits = DEFAULT_EXPORT_LIMITS,
  ) {
    const max = limits.chunkBytesMax;
    if (
      !Number.isSafeInteger(max) || max < CHUNK_BYTES_MIN ||
      max > DEFAULT_EXPORT_LIMITS.chunkBytesMax
    ) {
      throw new UsageError(`Invalid state chunk size ${max} bytes`, {
        hint: `use ${CHUNK_BYTES_MIN} to ${DEFAULT_EXPORT_LIMITS.chunkBytesMax} bytes`,
      });
    }
    this.#chunks = new ChunkMaker(identity, handoffId, max);
  }

  /**
   * The unsigned manifest listing `sent` (every chunk header, in order) and the probe's
   * digest, or null: the digest follows the manifest in its own ProbeDigest message.
   */
  manifest(
    sent: readonly ChunkHeader[],
    nTokens: number,
    probeLogitsSha256: string | null,
  ): UnsignedManifest {
    return buildManifest({
      handoffId: this.handoffId,
      identityDigest: this.identity.digest,
      family: this.identity.numerical.family,
      components: sent.map(componentOf),
      logical: { position: nTokens, tokenCount: nTokens },
      probe: { logitsSha256: probeLogitsSha256 },
    });
  }

  /**
   * Prefills `prompt` and emits every component to `sink`, the last one marked final; then
   * calls `onTailExported` (the manifest may leave now) and runs the continuation probe once
   * the promise it returns settles.
   */
  async run(
    prompt: Int32Array,
    sampling: SamplingParams,
    sampler: SamplerState,
    sink: ChunkSink,
    onFirstToken?: FirstTokenHook,
    prefix?: ExportPrefix,
    onTailExported?: () => Promise<void> | void,
  ): Promise<ExportResult> {
    const ctx = this.engine.ctx;
    // A pure recurrent model has no attention cache: its whole state is the final snapshot.
    const paged = this.identity.numerical.family !== "recurrent";
    // The first token is sampled the moment the last chunk is computed, before that chunk's
    // page and the tail are exported, so the client can have it at once (onFirstToken).
    let firstToken = -1;
    const sampleFirst = (logits: Float32Array, lastChunk?: ChunkDone) => {
      firstToken = sampleToken(logits, sampling, sampler);
      onFirstToken?.(firstToken, logits, performance.now(), lastChunk);
    };
    const n = prompt.length;
    // Recurrent layers sent while the last chunk computed (layer capture), by index, and the
    // start of the last chunk's KV page when the capture sent that too.
    const captured = new Set<number>();
    let capturedPage = -1;
    const hooks = await this.#captureHooks(n, sink, captured, {
      onLastComputed: (lastChunk) => sampleFirst(ctx.logits(-1), lastChunk),
      onPageSent: (p0) => capturedPage = p0,
    });
    const onChunk = async ({ p0, p1, computeMs }: ChunkDone) => {
      if (p1 === prompt.length && firstToken < 0) {
        sampleFirst(ctx.logits(-1), { p0, p1, computeMs });
      }
      await this.draft?.catchUp(prompt.subarray(p0, p1), p0);
      const pageSent = p1 === n && p0 === capturedPage;
      if (!paged) prefix?.onUnpagedTokens?.(p1 - p0, false);
      else if (!pageSent) await this.#pages("kv-page", ctx, p0, p1, sink);
      // The draft's KV for these positions is final too: it streams like the target's.
      if (this.draft) await this.#pages("mtp-kv", this.draft.ctx, p0, p1, sink);
    };
    // Final before any chunk computes: they leave now, not in the tail after compute end.
    await this.#exportKnown(n, prompt, sink);
    const logits = await this.#prefill(prompt, paged, sink, onChunk, hooks, prefix);
    if (firstToken < 0) sampleFirst(logits); // the engine's positions did not start at 0
    this.#captured = captured;
    await this.#exportTail(n, firstToken, sampling, sampler, sink);
    const held = onTailExported?.();
    // Only the result needs it: hashed after the tail left, not between compute end and the tail.
    const firstLogitsSha256 = await logitsDigest(logits);
    // The probe: continue one token here so the decoder can prove it continues identically.
    // It runs once `held` settles (the session: the manifest has left), while the decoder
    // imports; its digest follows the manifest.
    await held;
    const probe = await probeStep(this.engine, firstToken);
    return {
      nTokens: n,
      firstToken,
      probeLogitsSha256: probe.digest,
      probeLogits: probe.logits,
      firstLogitsSha256,
      lastPageCaptured: capturedPage >= 0,
    };
  }

  /**
   * The prefill hooks that send each recurrent layer's final rows while the last chunk
   * computes (none without a capture or recurrent layers), and the last chunk's KV page once
   * the last attention layer has written it (`onPageSent` with its start), unless pages of
   * this model are cut smaller than a chunk. The last chunk's decode returns before its
   * captured layers have been handed to the (bounded) sink: the first token leaves then
   * (`onLastComputed`), not after the layers drained through a slow link.
   */
  async #captureHooks(
    n: number,
    sink: ChunkSink,
    sent: Set<number>,
    on: { onLastComputed: (chunk: ChunkDone) => void; onPageSent: (p0: number) => void },
  ): Promise<PrefillHooks> {
    const capture = this.limits.layerCapture ? await openLayerCapture(this.engine.ctx) : null;
    const kinds = this.identity.numerical.layerKinds;
    if (!capture || !kinds.includes("recurrent")) return {};
    return {
      lastDecode: (decode, finalPos, p0) =>
        streamLayers({
          capture,
          kinds,
          decode: async () => {
            const t0 = performance.now();
            await decode();
            on.onLastComputed({ p0, p1: finalPos + 1, computeMs: performance.now() - t0 });
          },
          finalPos,
          sink,
          chunks: (part, layers, payload) => this.#chunks.cut(part, layers, payload, false, [0, n]),
          sent,
          page: this.limits.lastPageCapture && kinds.includes("attention") &&
              !this.#pageTokens.has("kv-page")
            ? {
              p0,
              maxBytes: this.limits.chunkBytesMax,
              chunk: (payload) => this.#chunks.chunk("kv-page", [p0, finalPos + 1], payload, false),
              onSent: () => on.onPageSent(p0),
            }
            : undefined,
        }),
    };
  }

  /**
   * Prefills `prompt` after what the prefix cache restored: the restored tokens' pages go
   * first, from the context, like computed ones; the prefill stops at each checkpoint (a chunk
   * ends there) so the sequence can be snapshotted there. Returns the last chunk's logits.
   */
  async #prefill(
    prompt: Int32Array,
    paged: boolean,
    sink: ChunkSink,
    onChunk: (done: ChunkDone) => Promise<void>,
    hooks: PrefillHooks,
    prefix: ExportPrefix | undefined,
  ): Promise<Float32Array> {
    const ctx = this.engine.ctx;
    const restored = prefix?.restoredTokens ?? 0;
    if (restored > 0 && paged) await this.#pages("kv-page", ctx, 0, restored, sink, true);
    if (restored > 0 && !paged) prefix?.onUnpagedTokens?.(restored, true);
    if (restored > 0 && this.draft) {
      await this.#pages("mtp-kv", this.draft.ctx, 0, restored, sink, true);
    }
    let from = restored;
    for (const b of prefix?.checkpoints ?? []) {
      if (b <= from || b >= prompt.length) continue;
      await this.engine.prefill(prompt.subarray(from, b), onChunk);
      await prefix!.onCheckpoint(b);
      from = b;
    }
    return await this.engine.prefill(prompt.subarray(from), onChunk, hooks);
  }

  /**
   * Exports positions [p0, p1) of `ctx` as pages of `kind`, each within `chunkBytesMax`: a
   * range too large for one chunk is cut into token sub-ranges (halved until it fits, and the
   * fitting size is kept for later ranges), so any prefill chunk size works.
   */
  async #pages(
    kind: "kv-page" | "mtp-kv",
    ctx: LlamaContext,
    p0: number,
    p1: number,
    sink: ChunkSink,
    cached = false,
  ): Promise<void> {
    const max = this.limits.chunkBytesMax;
    let a = p0;
    while (a < p1) {
      const step = Math.min(p1 - a, this.#pageTokens.get(kind) ?? p1 - a);
      const t0 = performance.now();
      let page: Uint8Array;
      try {
        page = await exportKvPage(ctx, a, a + step, { pageBytesMax: max });
      } catch (error) {
        if (!(error instanceof LimitExceededError)) throw error;
        if (step === 1) {
          // Pages are cut by token, never inside one: a token's page must fit a chunk.
          throw new LimitExceededError(
            `Cannot export ${kind} tokens [${a}, ${
              a + 1
            }): one token's page exceeds the state chunk size of ${max} bytes`,
            { hint: "raise --state-chunk-bytes on the prefill worker", cause: error },
          );
        }
        this.#pageTokens.set(kind, Math.max(1, step >> 1));
        continue;
      }
      const chunk = this.#chunks.chunk(kind, [a, a + step], page, false);
      await sink(cached ? { ...chunk, cached } : chunk, performance.now() - t0);
      a += step;
    }
  }

  /**
   * The components that are final before prefill starts: the positions after the prompt and
   * the token history (the prompt itself), each one chunk or byte pieces.
   */
  async #exportKnown(n: number, prompt: Int32Array, sink: ChunkSink): Promise<void> {
    const positions = { nPast: n, seqId: 0, nPosPerToken: 1 };
    await this.#emit(sink, "positions", [0, n], () => encodePositions(positions));
    await this.#emit(sink, "history", [0, n], () => encodeTokens(prompt));
  }

  /** Emits one component as one chunk, or as byte pieces when larger than a chunk. */
  async #emit(
    sink: ChunkSink,
    kind: ComponentKind,
    range: Range,
    make: () => Uint8Array | Promise<Uint8Array>,
  ): Promise<void> {
    const t0 = performance.now();
    const payload = await make();
    let ms = performance.now() - t0;
    for (const chunk of this.#chunks.cut(kind, range, payload, kind === "first-token")) {
      await sink(chunk, ms);
      ms = 0;
    }
  }

  /** What is final only after the last chunk: the rest of the state, sampler, first token. */
  async #exportTail(
    n: number,
    firstToken: number,
    sampling: SamplingParams,
    sampler: SamplerState,
    sink: ChunkSink,
  ): Promise<void> {
    const ctx = this.engine.ctx;
    const family = this.identity.numerical.family;
    // Bounded by the state, not by a chunk: the exporter cuts it into pieces.
    const swaBytesMax = DEFAULT_STATE_BOUNDS.stateBytesMax;
    if (family === "iswa") {
      await this.#emit(sink, "swa-kv", [0, n], () => exportSwa(ctx, { pageBytesMax: swaBytesMax }));
    }
    const recurrentLayers = this.identity.numerical.layerKinds.filter((k) => k === "recurrent");
    const allCaptured = this.#captured.size === recurrentLayers.length;
    if (
      (family === "recurrent" || family === "hybrid" || family === "hybrid-moe-mtp") &&
      !allCaptured
    ) {
      await this.#recurrent(n, sink);
    }
    if (this.draft) {
      await this.#emit(sink, "mtp-hidden", [n - 1, n], () => this.draft!.pendingBytes());
    }
    const samplerPayload = { params: sampling, state: { ...sampler } };
    await this.#emit(sink, "sampler", [0, n], () => encodeSampler(samplerPayload));
    await this.#emit(sink, "first-token", [n, n + 1], () => encodeTokens([firstToken]));
  }

  /** The final recurrent snapshot (see `exportSnapshot`): what layer capture did not send. */
  async #recurrent(n: number, sink: ChunkSink): Promise<void> {
    await exportSnapshot({
      ctx: this.engine.ctx,
      layerKinds: this.identity.numerical.layerKinds,
      limits: this.limits,
      captured: this.#captured,
      sink,
      chunk: (part, layers, payload, piece) =>
        this.#chunks.chunk(part, layers, payload, false, [0, n], piece),
    });
  }
}

/** Exports a KV page again for a retry; refuses if its bytes are not what was sent first. */
export async function reexportPage(ctx: LlamaContext, header: ChunkHeader): Promise<Uint8Array> {
  const [p0, p1] = header.tokenRange;
  const payload = await exportKvPage(ctx, p0, p1);
  if (payloadChecksum(payload) !== header.checksum) {
    throw new StateValidationError(
      `Cannot retry: kv-page tokens [${p0}, ${p1}) changed since it was first exported`,
    );
  }
  return payload;
}
