/**
 * The `model info` report: what a GGUF file is (architecture, layer pattern, dimensions) and
 * the state sizes its metadata implies. A runtime measurement can be added through a
 * `RuntimeStateProbe`, so the computed and the measured numbers sit side by side.
 */
import { UsageError } from "../core/errors.ts";
import {
  expectedStateBytes,
  type KvType,
  LAYER_LETTERS,
  layerCounts,
  type LayerKind,
  layerPattern,
  type ModelSpec,
  MTP_LETTER,
  readGgufFile,
  specFromGguf,
  type StateBytes,
} from "../models/mod.ts";

/** State sizes as the runtime reports them (e.g. from `llama_state_seq_get_size`). */
export interface RuntimeStateBytes {
  /** Attention-KV bytes added per prompt token, including per-cell metadata. */
  readonly bytesPerToken: number;
  /** Bytes that do not grow with the prompt (recurrent snapshot, framing). */
  readonly fixedBytes: number;
  /** `bytesPerToken` less the per-cell metadata: the attention K+V rows of one token. */
  readonly kvBytesPerToken?: number;
  /** Conv + SSM rows of the recurrent snapshot, framing excluded (recurrent models). */
  readonly recurrentBytes?: number;
  /** MTP draft context bytes per token, for models with nextn layers. */
  readonly mtpBytesPerToken?: number;
  /** How the numbers were obtained, for the report. */
  readonly method: string;
}

/** Measures a model's state sizes at runtime. Supplied by a caller that can load models. */
export type RuntimeStateProbe = (
  path: string,
  spec: ModelSpec,
  kvType: KvType,
) => Promise<RuntimeStateBytes>;

export interface ModelInfoReport {
  readonly path: string;
  readonly fileBytes: number;
  readonly ggufVersion: number;
  readonly tensorCount: number;
  readonly tensorTypes: Readonly<Record<string, number>>;
  readonly spec: ModelSpec;
  readonly layerPattern: string;
  readonly layerCounts: Partial<Record<LayerKind | "mtp", number>>;
  readonly kvType: KvType;
  readonly state: StateBytes;
  readonly runtime?: RuntimeStateBytes;
}

/** Reads `path` and builds the report; runs `probe` too when given. */
export async function modelInfo(
  path: string,
  kvType: KvType,
  probe?: RuntimeStateProbe,
): Promise<ModelInfoReport> {
  const header = await readGgufFile(path);
  const spec = specFromGguf(header, path);
  const tensorTypes: Record<string, number> = {};
  for (const t of header.tensors) tensorTypes[t.typeName] = (tensorTypes[t.typeName] ?? 0) + 1;
  const counts: Partial<Record<LayerKind | "mtp", number>> = layerCounts(spec);
  if (spec.nextnLayers > 0) counts.mtp = spec.nextnLayers;
  return {
    path,
    fileBytes: header.fileBytes,
    ggufVersion: header.version,
    tensorCount: header.tensors.length,
    tensorTypes,
    spec,
    layerPattern: layerPattern(spec),
    layerCounts: counts,
    kvType,
    state: stateFor(spec, kvType),
    ...(probe ? { runtime: await probe(path, spec, kvType) } : {}),
  };
}

function stateFor(spec: ModelSpec, kvType: KvType): StateBytes {
  try {
    return expectedStateBytes(spec, kvType);
  } catch (error) {
    if (!(error instanceof RangeError)) throw error;
    throw new UsageError(`K/V type "${kvType}" does not fit this model: ${error.message}`, {
      hint: "use f16, bf16 or f32",
    });
  }
}

/** Human-readable lines of the report. */
export function formatModelInfo(r: ModelInfoReport): string[] {
  const s = r.spec;
  const types = Object.entries(r.tensorTypes).map(([t, n]) => `${t} ${n}`).join(", ");
  const origin = s.family ? ` (skippy ${s.family} ${s.preset ?? "?"}, seed ${s.seed ?? "?"})` : "";
  const lines = [
    `file          ${r.path} (${formatBytes(r.fileBytes)}, GGUF v${r.ggufVersion}, ` +
    `${r.tensorCount} tensors: ${types})`,
    `architecture  ${s.architecture}${origin}`,
    `layers        ${layersLine(r)}`,
    `pattern       ${[...r.layerPattern].join(" ")}`,
    `dims          n_embd ${s.nEmbd}, vocab ${s.nVocab}, context ${s.contextLength}`,
  ];
  const a = s.attention;
  if (a) {
    const swa = a.slidingWindow
      ? `, sliding window ${a.slidingWindow} (period ${a.swaPeriod})`
      : "";
    lines.push(
      `attention     ${a.nHead} heads, ${a.nHeadKv} KV heads, head dim ${a.headDim}${swa}`,
    );
  }
  const m = s.ssm;
  if (m) {
    lines.push(
      `ssm           d_inner ${m.dInner}, d_state ${m.dState}, groups ${m.nGroup}, ` +
        `heads ${m.nHead}, conv kernel ${m.dConv}`,
    );
  }
  if (s.nFf) lines.push(`mlp           n_ff ${s.nFf}`);
  if (s.moe) {
    lines.push(
      `moe           ${s.moe.nExpert} experts, ${s.moe.nExpertUsed} used, expert n_ff ` +
        `${s.moe.nFfExp}, shared n_ff ${s.moe.nFfShexp}`,
    );
  }
  return [...lines, ...stateLines(r)];
}

function layersLine(r: ModelInfoReport): string {
  const trunk = r.spec.layers.length;
  const mtp = r.spec.nextnLayers > 0 ? ` + ${r.spec.nextnLayers} MTP` : "";
  const parts = Object.entries(r.layerCounts).map(([kind, n]) => {
    const letter = kind === "mtp" ? MTP_LETTER : LAYER_LETTERS[kind as LayerKind];
    return `${n} ${kind} (${letter})`;
  });
  return `${trunk}${mtp}: ${parts.join(", ")}`;
}

function stateLines(r: ModelInfoReport): string[] {
  const st = r.state;
  const lines = [`state         per sequence, ${r.kvType} K/V, computed from the metadata:`];
  const row = (label: string, value: string) => lines.push(`  ${label.padEnd(22)}${value}`);
  if (st.layers.attention > 0) row("kv per token", `${fmt(st.kvBytesPerToken)} B`);
  if (st.layers.slidingWindow > 0) {
    row("swa kv per token", `${fmt(st.swaKvBytesPerToken)} B (window ${st.slidingWindow})`);
  }
  if (st.layers.recurrent > 0) {
    row("conv (fixed)", `${fmt(st.convBytes)} B`);
    row("ssm (fixed)", `${fmt(st.ssmBytes)} B`);
    const equiv = st.kvBytesPerToken > 0
      ? ` = KV of ${fmt(Math.round(st.recurrentTokenEquivalent))} tokens`
      : "";
    row(
      "recurrent (fixed)",
      `${fmt(st.recurrentBytes)} B (${formatBytes(st.recurrentBytes)})${equiv}`,
    );
  }
  if (st.layers.mtp > 0) row("mtp kv per token", `${fmt(st.mtpKvBytesPerToken)} B`);
  if (r.runtime) {
    lines.push(`runtime       measured (${r.runtime.method}):`);
    row("bytes per token", `${fmt(r.runtime.bytesPerToken)} B`);
    if (r.runtime.kvBytesPerToken !== undefined) {
      row("kv per token", `${fmt(r.runtime.kvBytesPerToken)} B`);
    }
    row("fixed", `${fmt(r.runtime.fixedBytes)} B`);
    if (r.runtime.recurrentBytes !== undefined) {
      row("recurrent (fixed)", `${fmt(r.runtime.recurrentBytes)} B`);
    }
    if (r.runtime.mtpBytesPerToken !== undefined) {
      row("mtp bytes per token", `${fmt(r.runtime.mtpBytesPerToken)} B`);
    }
  }
  return lines;
}

function fmt(n: number): string {
  return n.toLocaleString("en-US");
}

/** Bytes in binary units with one decimal: "62.8 MiB". */
export function formatBytes(n: number): string {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return unit === 0 ? `${n} B` : `${value.toFixed(1)} ${units[unit]}`;
}
