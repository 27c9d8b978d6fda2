/**
 * Drives a whole in-process handoff with the state primitives, for tests, benchmarks, the
 * `state inspect` command and the correctness harness: chunked prefill exporting each chunk's
 * page right after it (plus the MTP draft's catch-up and pages), the final snapshots, and the
 * import of all of it into another context, in any page order, with timings.
 *
 * MTP follows llama.cpp's draft-mtp: the target computes nextn rows (unmasked); after each
 * target chunk the draft context decodes the same tokens and positions with row k carrying the
 * target's row k-1 (row 0: the pending row of the previous chunk, zeros at first); the pending
 * row is the target's last row.
 */
import type { LlamaContext } from "./context.ts";
import { LlamaBatch } from "./batch.ts";
import { type RecurrentSnapshot } from "./_recurrent_split.ts";
import {
  exportKvPage,
  exportMtpHidden,
  exportRecurrent,
  exportSwa,
  stateBackend,
  type StateOptions,
} from "./state.ts";
import { StagedImport } from "./staged_import.ts";
import { MtpDraft } from "./mtp.ts";

/** Everything a prefill worker sends, in the order it became available. */
export interface ExportedState {
  nTokens: number;
  pages: Uint8Array[];
  mtpPages: Uint8Array[];
  recurrent: RecurrentSnapshot | null;
  swa: Uint8Array | null;
  mtpHidden: Uint8Array | null;
  /** Microseconds per page export, in page order. */
  pageExportUs: number[];
  /** Microseconds of the final snapshot exports (recurrent + swa + MTP hidden). */
  finalExportUs: number;
  prefillMs: number;
}

export interface PrefillOptions extends StateOptions {
  chunkTokens: number;
  /** MTP draft context (the target then runs with nextn embeddings on). */
  draft?: LlamaContext;
  /**
   * Tokens the context (and draft) already hold, restored from a prefix-cache checkpoint:
   * their pages are exported first, then the prefill continues from there. With a draft, the
   * pending hidden row of the last restored position.
   */
  restored?: { tokens: number; mtpPending: Float32Array | null };
}

/** Prefills `tokens` into `ctx` in chunks, exporting every chunk's page(s) right after it. */
export async function prefillAndExport(
  ctx: LlamaContext,
  tokens: Int32Array,
  options: PrefillOptions,
): Promise<ExportedState> {
  const { chunkTokens, draft } = options;
  const out: ExportedState = {
    nTokens: tokens.length,
    pages: [],
    mtpPages: [],
    recurrent: null,
    swa: null,
    mtpHidden: null,
    pageExportUs: [],
    finalExportUs: 0,
    prefillMs: 0,
  };
  const backend = await stateBackend(ctx, options.path);
  const attention = backend.kind !== "recurrent";
  const mtp = draft ? MtpDraft.adopt(ctx, draft) : null;
  const batch = new LlamaBatch(chunkTokens);
  const from = options.restored?.tokens ?? 0;
  if (mtp && options.restored?.mtpPending) mtp.adoptPending(options.restored.mtpPending, from - 1);
  for (let p0 = 0; p0 < from; p0 += chunkTokens) {
    const p1 = Math.min(from, p0 + chunkTokens);
    const t1 = performance.now();
    if (attention) out.pages.push(await exportKvPage(ctx, p0, p1, options));
    out.pageExportUs.push((performance.now() - t1) * 1000);
    if (draft) out.mtpPages.push(await exportKvPage(draft, p0, p1, options));
  }
  let lastP0 = from;
  for (let p0 = from; p0 < tokens.length; p0 += chunkTokens) {
    lastP0 = p0;
    const chunk = tokens.subarray(p0, Math.min(tokens.length, p0 + chunkTokens));
    const p1 = p0 + chunk.length;
    const t0 = performance.now();
    batch.fill(chunk, p0);
    await ctx.decode(batch);
    if (mtp) await mtp.catchUp(chunk, p0);
    out.prefillMs += performance.now() - t0;
    const t1 = performance.now();
    if (attention) out.pages.push(await exportKvPage(ctx, p0, p1, options));
    out.pageExportUs.push((performance.now() - t1) * 1000);
    if (draft) out.mtpPages.push(await exportKvPage(draft, p0, p1, options));
  }
  const t2 = performance.now();
  if (backend.kind === "hybrid" || backend.kind === "recurrent") {
    out.recurrent = await exportRecurrent(ctx, options);
  }
  if (backend.kind === "iswa") out.swa = await exportSwa(ctx, options);
  if (mtp) out.mtpHidden = exportMtpHidden(ctx, tokens.length - 1 - lastP0);
  out.finalExportUs = (performance.now() - t2) * 1000;
  return out;
}

export interface ImportOptions {
  draft?: LlamaContext;
  path?: "auto" | "public";
  /** Order in which pages are staged (indices into `pages`); default as exported. */
  order?: readonly number[];
  /** Stop before committing (the caller commits or inspects). */
  commit?: boolean;
}

export interface ImportResult {
  imp: StagedImport;
  /** Microseconds per page import, in staging order. */
  pageImportUs: number[];
  /** Microseconds from the final snapshots to a committed session (the handoff's tail). */
  finalImportUs: number;
}

/** Stages everything `state` holds into `ctx` (and `options.draft`) and commits. */
export async function importExported(
  ctx: LlamaContext,
  state: ExportedState,
  options: ImportOptions = {},
): Promise<ImportResult> {
  const imp = await StagedImport.open(ctx, {
    nTokens: state.nTokens,
    draft: options.draft,
    path: options.path,
  });
  const pageImportUs: number[] = [];
  const order = options.order ?? state.pages.map((_, i) => i);
  for (const i of order) {
    const t0 = performance.now();
    await imp.addPage(state.pages[i]);
    pageImportUs.push((performance.now() - t0) * 1000);
    if (options.draft) await imp.addMtpPage(state.mtpPages[i]);
  }
  const t1 = performance.now();
  if (state.recurrent) await imp.setRecurrent(state.recurrent);
  if (state.swa) await imp.setSwa(state.swa);
  if (state.mtpHidden) imp.setMtpHidden(state.mtpHidden);
  if (options.commit ?? true) await imp.commit();
  return { imp, pageImportUs, finalImportUs: (performance.now() - t1) * 1000 };
}

/** Greedy continuation: the logits of each of `steps` decode steps (copies). */
export async function greedyLogits(
  ctx: LlamaContext,
  firstToken: number,
  pos: number,
  steps: number,
): Promise<Float32Array[]> {
  const out: Float32Array[] = [];
  const batch = new LlamaBatch(1);
  let token = firstToken;
  for (let k = 0; k < steps; k++) {
    batch.fill([token], pos + k);
    await ctx.decode(batch);
    const logits = ctx.logits();
    out.push(logits);
    token = argmax(logits);
  }
  return out;
}

/** Index of the largest value (first on ties). */
export function argmax(values: Float32Array): number {
  let best = 0;
  for (let i = 1; i < values.length; i++) if (values[i] > values[best]) best = i;
  return best;
}
