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
  encodePositions,
  encodeSampler,
  encodeTokens,
  kvDtype,
  NO_LAYERS,
  payloadChecksum,
  type Range,
  type SamplerState,
  sampleToken,
  type SamplingParams,
  STATE_SCHEMA_VERSION,
  StateValidationError,
  type UnsignedManifest,
} from "../core/mod.ts";
import { exportKvPage, exportRecurrent, exportSwa } from "../ffi/state.ts";
import type { LlamaContext } from "../ffi/mod.ts";
import type { Engine } from "./engine.ts";
import type { ResolvedIdentity } from "./identity.ts";
import type { MtpDraft } from "../ffi/mtp.ts";
import { logitsDigest, probeStep } from "./probe.ts";

/** A chunk ready to send: its header and payload. */
export interface ExportedChunk {
  header: ChunkHeader;
  payload: Uint8Array;
}

/** What the export produced besides the chunks. */
export interface ExportResult {
  nTokens: number;
  firstToken: number;
  /** SHA-256 of the logits after decoding the first token: the continuation probe. */
  probeLogitsSha256: string;
  /** SHA-256 of the prompt's last logits (the first token was sampled from them). */
  firstLogitsSha256: string;
  /** Milliseconds each prefill chunk took, in order (telemetry). */
  chunkMs: number[];
}

/** Where exported chunks go; resolves when the queue has room for the next one. */
export type ChunkSink = (chunk: ExportedChunk, exportMs: number) => Promise<void>;

/**
 * Called once, right after the last prefill chunk is computed and the first token sampled,
 * before the last page and the tail are exported, with the logits it was sampled from and when
 * that was (this process's clock). It must not block: the export waits for it to return.
 */
export type FirstTokenHook = (token: number, logits: Float32Array, prefillEndMs: number) => void;

export class StateExporter {
  #seq = 0;

  constructor(
    readonly engine: Engine,
    readonly identity: ResolvedIdentity,
    readonly handoffId: string,
    readonly draft: MtpDraft | null,
  ) {}

  /** The unsigned manifest listing `sent` (every chunk header, in order) and the probe. */
  manifest(sent: readonly ChunkHeader[], result: ExportResult): UnsignedManifest {
    return buildManifest({
      handoffId: this.handoffId,
      identityDigest: this.identity.digest,
      family: this.identity.numerical.family,
      components: sent.map(componentOf),
      logical: { position: result.nTokens, tokenCount: result.nTokens },
      probe: { logitsSha256: result.probeLogitsSha256 },
    });
  }

  /** Prefills `prompt` and emits every component to `sink`, the last one marked final. */
  async run(
    prompt: Int32Array,
    sampling: SamplingParams,
    sampler: SamplerState,
    sink: ChunkSink,
    onFirstToken?: FirstTokenHook,
  ): Promise<ExportResult> {
    const ctx = this.engine.ctx;
    const chunkMs: number[] = [];
    // A pure recurrent model has no attention cache: its whole state is the final snapshot.
    const paged = this.identity.numerical.family !== "recurrent";
    // The first token is sampled the moment the last chunk is computed, before that chunk's
    // page and the tail are exported, so the client can have it at once (onFirstToken).
    let firstToken = -1;
    const sampleFirst = (logits: Float32Array) => {
      firstToken = sampleToken(logits, sampling, sampler);
      onFirstToken?.(firstToken, logits, performance.now());
    };
    const logits = await this.engine.prefill(prompt, async ({ p0, p1, computeMs }) => {
      chunkMs.push(computeMs);
      if (p1 === prompt.length) sampleFirst(ctx.logits(-1));
      await this.draft?.catchUp(prompt.subarray(p0, p1), p0);
      if (!paged) return;
      const t0 = performance.now();
      const page = await exportKvPage(ctx, p0, p1);
      await sink(await this.#chunk("kv-page", [p0, p1], page, false), performance.now() - t0);
    });
    const n = prompt.length;
    if (firstToken < 0) sampleFirst(logits); // the engine's positions did not start at 0
    const firstLogitsSha256 = await logitsDigest(logits);
    await this.#exportTail(n, prompt, firstToken, sampling, sampler, sink);
    // The probe: continue one token here so the decoder can prove it continues identically.
    const { digest: probeLogitsSha256 } = await probeStep(this.engine, firstToken);
    return { nTokens: n, firstToken, probeLogitsSha256, firstLogitsSha256, chunkMs };
  }

  async #exportTail(
    n: number,
    prompt: Int32Array,
    firstToken: number,
    sampling: SamplingParams,
    sampler: SamplerState,
    sink: ChunkSink,
  ): Promise<void> {
    const ctx = this.engine.ctx;
    const family = this.identity.numerical.family;
    const timed = async (kind: ComponentKind, range: Range, make: () => Promise<Uint8Array>) => {
      const t0 = performance.now();
      const payload = await make();
      const chunk = await this.#chunk(kind, range, payload, kind === "first-token");
      await sink(chunk, performance.now() - t0);
    };
    if (this.draft) await timed("mtp-kv", [0, n], () => exportKvPage(this.draft!.ctx, 0, n));
    if (family === "iswa") await timed("swa-kv", [0, n], () => exportSwa(ctx));
    if (family === "recurrent" || family === "hybrid" || family === "hybrid-moe-mtp") {
      const snapshot = await exportRecurrent(ctx);
      if (snapshot.layout !== "split") {
        throw new StateValidationError(
          "Cannot export conv/ssm: this model's recurrent state layout is not one we can split",
          { hint: "use colocated generation for this model" },
        );
      }
      await timed("conv", [0, n], () => Promise.resolve(snapshot.conv));
      await timed("ssm", [0, n], () => Promise.resolve(snapshot.ssm));
    }
    if (this.draft) {
      await timed("mtp-hidden", [n - 1, n], () => Promise.resolve(this.draft!.pendingBytes()));
    }
    const positions = { nPast: n, seqId: 0, nPosPerToken: 1 };
    await timed("positions", [0, n], () => Promise.resolve(encodePositions(positions)));
    const samplerPayload = { params: sampling, state: { ...sampler } };
    await timed("sampler", [0, n], () => Promise.resolve(encodeSampler(samplerPayload)));
    await timed("history", [0, n], () => Promise.resolve(encodeTokens(prompt)));
    await timed("first-token", [n, n + 1], () => Promise.resolve(encodeTokens([firstToken])));
  }

  async #chunk(
    kind: ComponentKind,
    tokenRange: Range,
    payload: Uint8Array,
    final: boolean,
  ): Promise<ExportedChunk> {
    const layered = kind === "kv-page" || kind === "swa-kv" || kind === "conv" || kind === "ssm";
    const id = this.identity.numerical;
    const trunk = id.layerKinds.filter((k) => k !== "mtp").length;
    const header: ChunkHeader = {
      handoffId: this.handoffId,
      identityDigest: this.identity.digest,
      schemaVersion: STATE_SCHEMA_VERSION,
      kind,
      layerRange: layered ? [0, trunk] : NO_LAYERS,
      tokenRange,
      codec: CODEC[kind],
      dtype: DTYPE[kind] ?? kvDtype(id.kType, id.vType),
      positionConfig: { seqId: 0, nPosPerToken: 1 },
      payloadBytes: payload.byteLength,
      checksum: await payloadChecksum(payload),
      seq: this.#seq++,
      final,
    };
    return { header, payload };
  }
}

/** Exports a KV page again for a retry; refuses if its bytes are not what was sent first. */
export async function reexportPage(ctx: LlamaContext, header: ChunkHeader): Promise<Uint8Array> {
  const [p0, p1] = header.tokenRange;
  const payload = await exportKvPage(ctx, p0, p1);
  if (await payloadChecksum(payload) !== header.checksum) {
    throw new StateValidationError(
      `Cannot retry: kv-page tokens [${p0}, ${p1}) changed since it was first exported`,
    );
  }
  return payload;
}

const CODEC: Record<ComponentKind, string> = {
  "kv-page": "llama-kv-cells",
  "swa-kv": "llama-kv-cells",
  "conv": "llama-recurrent-rows",
  "ssm": "llama-recurrent-rows",
  "mtp-kv": "llama-kv-cells",
  "mtp-hidden": "f32-rows",
  "positions": "msgpack",
  "sampler": "msgpack",
  "history": "i32-le",
  "first-token": "i32-le",
};

const DTYPE: Partial<Record<ComponentKind, string>> = {
  "conv": "f32",
  "ssm": "f32",
  "mtp-hidden": "f32",
  "positions": "none",
  "sampler": "none",
  "history": "i32",
  "first-token": "i32",
};
