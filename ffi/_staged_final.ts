/**
 * The end of a staged import: the public path's one assembled import, and the readiness check
 * both paths run before commit. llama.cpp decodes partial state without complaint (a hole in
 * the attention positions, or attention without recurrent state, gives garbage, not an error),
 * so this check is what stands between a partial import and generation.
 */
import { IdentityMismatchError, StateValidationError } from "../core/errors.ts";
import { formatRange, type Range } from "../core/schema.ts";
import type { LlamaContext } from "./context.ts";
import { GGML_TYPE } from "./llama.ts";
import { SHIM_PAGE } from "./shim/abi.ts";
import { pageRows, readPageHeader } from "./_state_page.ts";
import { assembleSeqBlob, type StagedPage } from "./_state_public.ts";
import type { StateBackend } from "./state.ts";

/** One context an import writes into: the target, or the MTP draft. */
export interface Target {
  ctx: LlamaContext;
  backend: StateBackend;
  component: "kv-page" | "mtp-kv";
  /** Token ranges staged so far (bounded by `pagesMax`). */
  ranges: Range[];
  /** Public path only: the staged pages themselves. */
  pages: StagedPage[];
}

const SEQ_HEADER_BYTES = 8; // u32 magic, i32 seq id

function streams(ctx: LlamaContext, seq: number): { nStream: number; stream: number } {
  const unified = ctx.options.kvUnified ?? true;
  return unified ? { nStream: 1, stream: 0 } : { nStream: ctx.options.nSeqMax ?? 1, stream: seq };
}

function sameLayout(a: StagedPage, b: StagedPage): boolean {
  const heads = (p: StagedPage) => [...p.rows.k, ...p.rows.v].map((x) => x.head);
  const ha = heads(a);
  const hb = heads(b);
  return a.rows.vTrans === b.rows.vTrans && ha.length === hb.length &&
    ha.every((h, i) => h.every((byte, j) => byte === hb[i][j]));
}

/** The sliding-window section to append after the base cache's pages. */
function swaSection(ctx: LlamaContext, seq: number, swa: Uint8Array): Uint8Array {
  const header = readPageHeader(swa, "swa-kv");
  const page: StagedPage = { header, page: swa, rows: pageRows(swa, header, "swa-kv") };
  const { nStream, stream } = streams(ctx, seq);
  return assembleSeqBlob([page], seq, nStream, stream, new Uint8Array()).subarray(SEQ_HEADER_BYTES);
}

/**
 * Public path: assembles the staged pages (plus the recurrent or sliding-window section for the
 * target) into one sequence blob and imports it with one `llama_state_seq_set_data`.
 */
export async function assembleFinal(
  t: Target,
  seq: number,
  tail: { recurrent?: Uint8Array | null; swa?: Uint8Array | null },
): Promise<void> {
  if (t.backend.kind === "recurrent") return; // imported when it arrived
  const pages = [...t.pages].sort((a, b) => a.header.p0 - b.header.p0);
  const odd = pages.find((p) => !sameLayout(p, pages[0]));
  if (odd) {
    throw new StateValidationError(
      `Cannot commit: ${t.component} tokens ${
        formatRange([odd.header.p0, odd.header.p1])
      } has another K/V layout`,
    );
  }
  const end = tail.recurrent
    ? tail.recurrent.subarray(SEQ_HEADER_BYTES)
    : tail.swa
    ? swaSection(t.ctx, seq, tail.swa)
    : new Uint8Array();
  const { nStream, stream } = streams(t.ctx, seq);
  const blob = assembleSeqBlob(pages, seq, nStream, stream, end);
  const n = pages.reduce((m, p) => Math.max(m, p.header.p1), 0);
  try {
    await t.ctx.stateSeqSet(blob, seq, 0);
  } catch (error) {
    throw new StateValidationError(
      `Cannot commit: llama.cpp refused ${t.component} tokens [0, ${n}): ${
        (error as Error).message
      }`,
      {
        cause: error,
        hint: "both sides need the same numerical identity (n_ctx, K/V types, flash attention)",
      },
    );
  }
}

/** Throws unless `t` holds exactly positions [0, n) in every part its memory has. */
export function checkReadiness(t: Target, seq: number, n: number): void {
  const refuse = (what: string, detail: string) =>
    new StateValidationError(`Cannot commit: ${what} ${detail}`, {
      hint: "the import is incomplete or inconsistent; abort it and retry the handoff",
    });
  const kind = t.backend.kind;
  const attention = kind === "kv" || kind === "hybrid" || kind === "iswa";
  if (!t.backend.shim) {
    const max = t.ctx.seqPosMax(seq);
    const min = t.ctx.seqPosMin(seq);
    if (max !== n - 1 || (kind === "kv" && min !== 0)) {
      throw refuse(`${t.component} tokens [0, ${n})`, `imported as positions [${min}, ${max}]`);
    }
    return;
  }
  const f = t.backend.shim.facts(t.ctx, seq);
  if (attention && (f.main.count !== n || f.main.min !== 0 || f.main.max !== n - 1)) {
    throw refuse(
      `${t.component} tokens [0, ${n})`,
      `holds ${f.main.count} positions in [${f.main.min}, ${f.main.max}]`,
    );
  }
  if ((kind === "hybrid" || kind === "recurrent") && f.recurrentPos !== n - 1) {
    throw refuse(
      `conv/ssm tokens [0, ${n})`,
      `is at position ${f.recurrentPos}, expected ${n - 1}`,
    );
  }
  if (kind === "iswa" && (f.swa.count === 0 || f.swa.max !== n - 1)) {
    throw refuse(`swa-kv tokens [0, ${n})`, `ends at position ${f.swa.max}, expected ${n - 1}`);
  }
}

/** Refuses a page whose layout cannot match `ctx` (flash attention, n_ctx, K/V types). */
export function checkLayout(
  ctx: LlamaContext,
  flags: number,
  kvSize: number,
  k: number[],
  v: number[],
  what: string,
) {
  const hint = "both sides need the same numerical identity (n_ctx, K/V types, flash attention)";
  const vTrans = (flags & SHIM_PAGE.FLAG_VTRANS) !== 0;
  if (vTrans === ctx.options.flashAttention) {
    const here = ctx.options.flashAttention ? "on" : "off";
    throw new IdentityMismatchError(
      `Cannot stage ${what}: flash attention is ${here} here and ${
        vTrans ? "off" : "on"
      } at the source`,
      { hint },
    );
  }
  const cells = ctx.model.lib.symbols.llama_n_ctx_seq(ctx.ptr);
  if (kvSize > cells) {
    throw new IdentityMismatchError(
      `Cannot stage ${what}: the source cache has ${kvSize} cells, this one ${cells}`,
      {
        hint: `use the same n_ctx on both sides (--ctx ${kvSize})`,
      },
    );
  }
  const typeK = GGML_TYPE[ctx.options.typeK];
  const typeV = GGML_TYPE[ctx.options.typeV];
  const badK = k.findIndex((t) => t !== typeK);
  const badV = v.findIndex((t) => t !== typeV);
  if (badK >= 0 || badV >= 0) {
    const [side, layer, mine] = badK >= 0
      ? ["K", badK, ctx.options.typeK]
      : ["V", badV, ctx.options.typeV];
    throw new IdentityMismatchError(
      `Cannot stage ${what}: ${side} type of KV layer ${layer} differs from this context's ${mine}`,
      { hint },
    );
  }
}
