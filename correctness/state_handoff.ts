/**
 * The state-handoff parity harness (upstream: skippy-correctness state-handoff), in process:
 * a prefiller side A prefills a prompt in chunks of one page each, exporting every page right
 * after its chunk; a decoder side B, a fresh context on a separate model instance, takes the
 * pages (in any order), then the end-of-prompt components, then commits; both continue
 * greedily and every logit row is compared bit for bit.
 *
 * The identity gate comes first: `openHandoff` compares the two sides' numerical identities
 * (serve/identity.ts) and refuses a mismatch with IdentityMismatchError naming the fields,
 * before the decoder opens an import, so no state byte reaches it.
 *
 * Ownership: a `Side` owns its engine, context and MTP draft until disposed; the model of a
 * decoder side belongs to whoever loaded it (`DecoderModel`), so fresh decoder contexts can be
 * made on one separate model instance.
 */
import { assert, StateValidationError } from "../core/errors.ts";
import { assertIdentityMatch, contextTokensNeeded } from "../core/identity.ts";
import {
  argmax,
  type ExportedState,
  LlamaModel,
  loadLlama,
  prefillAndExport,
  StagedImport,
  stateBackend,
} from "../ffi/mod.ts";
import { SKIPPY_SHIM_ABI_VERSION } from "../ffi/shim/abi.ts";
import { Engine, type RuntimeConfig } from "../serve/engine.ts";
import { type ResolvedIdentity, resolveIdentity } from "../serve/identity.ts";
import { MtpDraft } from "../ffi/mtp.ts";

/** One side of a handoff: an engine (its own context), its MTP draft, and its identity. */
export class Side implements Disposable {
  private constructor(
    readonly engine: Engine,
    readonly draft: MtpDraft | null,
    readonly identity: ResolvedIdentity,
  ) {}

  /**
   * Opens a side with its own context; on `model` when given (which the caller keeps owning),
   * otherwise on a model instance of its own.
   */
  static async open(
    config: RuntimeConfig,
    options: { model?: LlamaModel; digestCacheFile?: string } = {},
  ): Promise<Side> {
    const engine = await Engine.open(config, options.model);
    try {
      const draft = config.mtp ? await MtpDraft.open(engine.ctx) : null;
      const backend = await stateBackend(engine.ctx);
      const identity = await resolveIdentity(engine, {
        digestCacheFile: options.digestCacheFile,
        shimAbiVersion: backend.path === "shim" ? SKIPPY_SHIM_ABI_VERSION : 0,
      });
      return new Side(engine, draft, identity);
    } catch (error) {
      engine[Symbol.dispose]();
      throw error;
    }
  }

  [Symbol.dispose](): void {
    this.draft?.[Symbol.dispose]();
    this.engine[Symbol.dispose]();
  }
}

/** A model instance of the decoder's own, on which fresh decoder sides are opened. */
export class DecoderModel implements Disposable {
  private constructor(readonly model: LlamaModel, readonly config: RuntimeConfig) {}

  static async load(config: RuntimeConfig): Promise<DecoderModel> {
    const lib = loadLlama({ cpuVariant: config.cpuVariant });
    return new DecoderModel(
      await LlamaModel.load(lib, config.modelPath, {
        loadMtp: config.mtp,
        gpuLayers: config.gpuLayers,
      }),
      config,
    );
  }

  /** A fresh context (and draft) on this model instance. */
  openSide(digestCacheFile?: string): Promise<Side> {
    return Side.open(this.config, { model: this.model, digestCacheFile });
  }

  [Symbol.dispose](): void {
    this.model.free();
  }
}

/** What A sends: the exported components plus the first generated token. */
export interface PrefillResult {
  state: ExportedState;
  /** Greedy token from the last prompt row: the `first-token` component. */
  firstToken: number;
}

/** Prefills `tokens` on the prefiller side in chunks of `config.chunkTokens` (one page each). */
export async function prefillSide(side: Side, tokens: Int32Array): Promise<PrefillResult> {
  const { engine, draft } = side;
  assert(engine.position === 0, "the prefiller side must start empty");
  const state = await prefillAndExport(engine.ctx, tokens, {
    chunkTokens: engine.config.chunkTokens,
    draft: draft?.ctx,
  });
  engine.adoptPosition(tokens.length);
  if (draft) draft.adoptPending(floats(state.mtpHidden!));
  return { state, firstToken: argmax(engine.ctx.logits(-1)) };
}

/**
 * The identity gate, then an import opened on B: throws IdentityMismatchError naming every
 * differing field (B's context must hold the prompt plus `generateTokensMax`) before any state
 * reaches B. The returned import holds B's contexts until it is committed or aborted.
 */
export async function openHandoff(
  decoder: Side,
  prefiller: ResolvedIdentity,
  nTokens: number,
  generateTokensMax: number,
): Promise<StagedImport> {
  assertIdentityMatch(decoder.identity.numerical, prefiller.numerical, {
    contextTokensNeeded: contextTokensNeeded({ promptTokens: nTokens, generateTokensMax }),
    decoder: "local",
  });
  return await StagedImport.open(decoder.engine.ctx, { nTokens, draft: decoder.draft?.ctx });
}

/** Which pages to stage, in which order, and which one to corrupt on the way. */
export interface StagePlan {
  /** Page indices in staging order (default: all, as exported); leave one out for a hole. */
  order?: readonly number[];
  /** Index of a page whose copy gets one byte flipped inside its K/V rows. */
  flipPage?: number;
}

/** Microseconds spent staging, split as the handoff's tail sees it, and what commit handed back. */
export interface StageTimings {
  /** All KV (and MTP KV) page imports. */
  pagesUs: number;
  /** End-of-prompt components plus validation and commit: on the handoff's critical path. */
  finalUs: number;
  /** The pending MTP hidden row, when a draft context was imported. */
  mtpHidden: Float32Array | null;
}

/**
 * Stages `state` into `imp` following `plan`, then commits. A refusal (typed error naming the
 * component and range) propagates and leaves the import uncommitted for the caller to inspect
 * and abort.
 */
export async function stageAndCommit(
  imp: StagedImport,
  state: ExportedState,
  plan: StagePlan = {},
): Promise<StageTimings> {
  const order = plan.order ?? state.pages.map((_, i) => i);
  let pagesUs = 0;
  for (const i of order) {
    const page = i === plan.flipPage ? flipped(state.pages[i]) : state.pages[i];
    const t0 = performance.now();
    await imp.addPage(page);
    if (state.mtpPages.length > 0) await imp.addMtpPage(state.mtpPages[i]);
    pagesUs += (performance.now() - t0) * 1000;
  }
  const t1 = performance.now();
  if (state.recurrent) await imp.setRecurrent(state.recurrent);
  if (state.swa) await imp.setSwa(state.swa);
  if (state.mtpHidden) imp.setMtpHidden(state.mtpHidden);
  const { mtpHidden } = await imp.commit();
  return { pagesUs, finalUs: (performance.now() - t1) * 1000, mtpHidden };
}

/** After a commit: B continues from the prompt's end (and its draft from the pending row). */
export function adoptHandoff(decoder: Side, nTokens: number, mtpHidden: Float32Array | null) {
  decoder.engine.adoptPosition(nTokens);
  if (decoder.draft) {
    assert(mtpHidden !== null, "an MTP import commits with its pending row");
    decoder.draft.adoptPending(mtpHidden);
  }
}

/** A copy of `page` with one bit flipped in its last V rows (past the header and metadata). */
export function flipped(page: Uint8Array): Uint8Array {
  assert(page.byteLength > 200, "page too small to corrupt inside its rows");
  const copy = page.slice();
  copy[copy.byteLength - 100] ^= 0x40;
  return copy;
}

/** What one side produced while continuing greedily. */
export interface Continuation {
  /** The token fed at each step (step 0: the first token). */
  tokens: number[];
  /** Target logits after each step. */
  logits: Float32Array[];
  /** MTP: the draft's greedy token and logits at each step (empty without a draft). */
  draftTokens: number[];
  draftLogits: Float32Array[];
}

/**
 * Continues `steps` greedy tokens from `firstToken` at the side's position. With an MTP draft,
 * each step first drafts from (token, pending hidden row), as llama.cpp's draft-mtp does, then
 * decodes the token on the target and takes its nextn row as the next pending row.
 */
export async function continueGreedy(
  side: Side,
  firstToken: number,
  steps: number,
): Promise<Continuation> {
  const out: Continuation = { tokens: [], logits: [], draftTokens: [], draftLogits: [] };
  const { engine, draft } = side;
  let token = firstToken;
  for (let k = 0; k < steps; k++) {
    if (draft) {
      out.draftTokens.push(await draft.draftNext(token, engine.position));
      out.draftLogits.push(draft.ctx.logits(-1));
    }
    out.tokens.push(token);
    const logits = await engine.step(token);
    out.logits.push(logits);
    if (draft) draft.adoptPending(engine.ctx.nextnEmbedding(0));
    token = argmax(logits);
  }
  return out;
}

/** How a continuation after the handoff compares with the one without it. */
export interface Parity {
  /** Bit-identical logits (target and draft) at every step and identical tokens. */
  exact: boolean;
  tokensEqual: boolean;
  /** Largest |difference| over every compared logit (0 when exact). */
  maxAbsDiff: number;
  /** First step whose logits differ in any bit, or null. */
  firstDiffStep: number | null;
  steps: number;
}

/** Compares `moved` (after the handoff) with `local` (without it), bit for bit. */
export function compareContinuations(local: Continuation, moved: Continuation): Parity {
  assert(local.logits.length === moved.logits.length, "continuations of different lengths");
  const same = (a: number[], b: number[]) => a.length === b.length && a.every((x, i) => x === b[i]);
  const tokensEqual = same(local.tokens, moved.tokens) &&
    same(local.draftTokens, moved.draftTokens);
  let maxAbsDiff = 0;
  let firstDiffStep: number | null = null;
  const rows: [Float32Array[], Float32Array[]][] = [
    [local.logits, moved.logits],
    [local.draftLogits, moved.draftLogits],
  ];
  for (const [as, bs] of rows) {
    assert(as.length === bs.length, "draft rows of different lengths");
    for (let k = 0; k < as.length; k++) {
      const d = rowDiff(as[k], bs[k]);
      if (d.bitsDiffer && (firstDiffStep === null || k < firstDiffStep)) firstDiffStep = k;
      maxAbsDiff = Math.max(maxAbsDiff, d.maxAbs);
    }
  }
  const exact = tokensEqual && firstDiffStep === null;
  return { exact, tokensEqual, maxAbsDiff, firstDiffStep, steps: local.logits.length };
}

function rowDiff(a: Float32Array, b: Float32Array): { bitsDiffer: boolean; maxAbs: number } {
  if (a.length !== b.length) return { bitsDiffer: true, maxAbs: Infinity };
  const ua = new Uint32Array(a.buffer, a.byteOffset, a.length);
  const ub = new Uint32Array(b.buffer, b.byteOffset, b.length);
  let bitsDiffer = false;
  let maxAbs = 0;
  for (let i = 0; i < a.length; i++) {
    if (ua[i] === ub[i]) continue;
    bitsDiffer = true;
    const d = Math.abs(a[i] - b[i]);
    maxAbs = Number.isNaN(d) ? Infinity : Math.max(maxAbs, d);
  }
  return { bitsDiffer, maxAbs };
}

/**
 * Checks that a refused import left B unusable: still staging, and decode through B throws.
 * Returns the decode refusal (for reports); throws StateValidationError when B could decode.
 */
export async function assertUnusable(imp: StagedImport, decoder: Side): Promise<string> {
  if (imp.state !== "staging") {
    throw new StateValidationError(`A refused import is ${imp.state}, expected staging`);
  }
  const probe = decoder.engine.step(decoder.engine.model.vocab.bos).then(
    () => null,
    (error: Error) => error,
  );
  const refusal = await probe;
  if (refusal === null) {
    throw new StateValidationError("A refused import left its context able to decode");
  }
  return refusal.message;
}

function floats(bytes: Uint8Array): Float32Array {
  return new Float32Array(bytes.slice().buffer);
}

/** Deterministic prompt token ids spread over the vocabulary (no special tokens, no text). */
export function syntheticPrompt(n: number, nVocab: number, salt = 0): Int32Array {
  assert(nVocab > 3, "vocabulary too small");
  const out = new Int32Array(n);
  for (let i = 0; i < n; i++) out[i] = 3 + ((i * 7919 + salt * 104729) % (nVocab - 3));
  return out;
}
