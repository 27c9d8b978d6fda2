/**
 * What a handoff is bound to. The *numerical identity* decides whether state exported by one
 * worker continues on another. Its fields fall in three groups:
 *
 * - *must-match* (`EXACT_IDENTITY_FIELDS`, in the digest): model, numerics and layout; a
 *   mismatch is refused before any state byte is accepted;
 * - `nCtx`: the decoder's must be large enough for the request (see `contextTokensNeeded`);
 * - *parity-only* (`PARITY_ONLY_FIELDS`, not in the digest): the compute device model. Two
 *   devices of one backend (an M3 Ultra and an M1 Ultra, both Metal) read and write the same
 *   state format, so the handoff is accepted, but their kernels may round differently, so
 *   bitwise parity with the decoder's own colocated run is claimed only when these are equal
 *   (`parityVerdict`).
 *
 * *Placement fields* (host, port, role, node id) say where a worker runs and may differ.
 *
 * Model and tokenizer digests are computed once per loaded model by the caller and passed in
 * as hex strings; nothing here reads files.
 *
 * @module
 */
import { canonicalEncode, sha256Hex } from "./bytes.ts";
import { IdentityMismatchError } from "./errors.ts";
import type { ModelFamily } from "./schema.ts";

/** Bumped when the canonical identity encoding below changes (not the state schema). */
export const IDENTITY_ENCODING_VERSION = 1;
/** Hex characters of a digest shown in a mismatch message: enough to tell files apart. */
export const DIGEST_PREFIX_CHARS = 12;

/** Per-layer kinds, as the runtime reports them for the trunk and MTP blocks. */
export type LayerKind = "attention" | "attention-swa" | "recurrent" | "mlp" | "moe" | "mtp";

/** Fields that decide numerics; all but `nCtx` are covered by the identity digest. */
export interface NumericalIdentity {
  /** SHA-256 (hex) of the model file, computed once by the caller. */
  modelDigest: string;
  /** SHA-256 (hex) of the tokenizer definition. */
  tokenizerDigest: string;
  /** GGUF `general.architecture`, e.g. `"nemotron_h_moe"`. */
  architecture: string;
  family: ModelFamily;
  /** Trunk layers plus MTP blocks, as `block_count`. */
  layerCount: number;
  /** One entry per layer; its length equals `layerCount`. */
  layerKinds: readonly LayerKind[];
  /** Context size of the worker. Not in the digest: the decoder's must be >= what is needed. */
  nCtx: number;
  /** K and V cache element types (`"f16"`, `"q8_0"`, ...). */
  kType: string;
  vType: string;
  flashAttention: boolean;
  /** A unified KV cache (one stream) or one stream per sequence; import refuses a mismatch. */
  kvUnified: boolean;
  /**
   * Sliding-window cache sized to the whole context (true) or to the window plus one
   * micro-batch (false). Cell placement in that cache changes summation order.
   */
  swaFull: boolean;
  /** Physical micro-batch: sizes the sliding-window ring when `swaFull` is false. */
  nUbatch: number;
  /** Decode threads: 1 vs 2 threads already change logits with flash attention on CPU. */
  threadCount: number;
  /** The CPU backend variant ggml picked (`"haswell"`, `"zen4"`, ...). */
  cpuBackendVariant: string;
  /**
   * Layers offloaded to a GPU (0: all on the CPU). Must match: it decides which backend's
   * kernels produced each layer's state and which one continues from it.
   */
  gpuLayers: number;
  /**
   * Backend the offloaded layers run on (`"CPU"` when none, `"CUDA"`, `"Metal"`, `"Vulkan"`).
   * Must match: kernels, buffer layout and padding differ between backends.
   */
  computeBackend: string;
  /**
   * Device model (`"CPU"` when nothing is offloaded, `"NVIDIA H200"`, `"Apple M3 Ultra"`).
   * Parity-only: same backend, same state format, but kernels may round differently.
   */
  computeDevice: string;
  stateSchemaVersion: number;
  /** llama.cpp tag plus library build id, e.g. `"v0.5.0+3f2a..."`. */
  llamaBuild: string;
  /** ABI version of the native page shim, or 0 when the public-API path is used. */
  shimAbiVersion: number;
}

/** Where a worker runs. Free to differ between the two sides of a handoff. */
export interface PlacementFields {
  host: string;
  port: number;
  role: "prefill" | "decode" | "prefill+decode";
  /** Ed25519 node identity, as the transport names it. */
  nodeId: string;
}

/** A worker's full identity. */
export interface WorkerIdentity {
  numerical: NumericalIdentity;
  placement: PlacementFields;
}

/** One field that differs, with printable values (never content). */
export interface IdentityMismatch {
  field: keyof NumericalIdentity;
  label: string;
  expected: string;
  found: string;
}

const LABELS: Record<keyof NumericalIdentity, string> = {
  modelDigest: "model file digest",
  tokenizerDigest: "tokenizer digest",
  architecture: "architecture",
  family: "model family",
  layerCount: "layer count",
  layerKinds: "layer kinds",
  nCtx: "context size",
  kType: "K cache type",
  vType: "V cache type",
  flashAttention: "flash attention",
  kvUnified: "unified KV cache",
  swaFull: "full-size sliding-window cache",
  nUbatch: "micro-batch size",
  threadCount: "thread count",
  cpuBackendVariant: "CPU backend variant",
  gpuLayers: "GPU layers",
  computeBackend: "compute backend",
  computeDevice: "compute device",
  stateSchemaVersion: "state schema version",
  llamaBuild: "llama.cpp build",
  shimAbiVersion: "native shim ABI version",
};

/** Fields that only decide whether bitwise parity can be claimed; not in the digest. */
export const PARITY_ONLY_FIELDS: readonly (keyof NumericalIdentity)[] = ["computeDevice"];

/** The fields that must be equal, in digest order. `nCtx` follows its own rule. */
export const EXACT_IDENTITY_FIELDS: readonly (keyof NumericalIdentity)[] = (
  Object.keys(LABELS) as (keyof NumericalIdentity)[]
).filter((f) => f !== "nCtx" && !PARITY_ONLY_FIELDS.includes(f));

/**
 * Canonical bytes of the exact-match part of `identity` (no `nCtx`, no placement).
 *
 * @example
 * ```ts
 * const bytes = canonicalIdentityBytes(identity.numerical);
 * ```
 */
export function canonicalIdentityBytes(identity: NumericalIdentity): Uint8Array {
  const fields: Record<string, unknown> = {};
  for (const f of EXACT_IDENTITY_FIELDS) fields[f] = identity[f];
  return canonicalEncode({
    domain: "skippy-identity",
    version: IDENTITY_ENCODING_VERSION,
    fields,
  });
}

/**
 * SHA-256 (hex) of the canonical numerical identity: what chunks and manifests carry.
 *
 * @example
 * ```ts
 * const digest = await identityDigest(identity.numerical); // 64 hex characters
 * ```
 */
export function identityDigest(identity: NumericalIdentity): Promise<string> {
  return sha256Hex(canonicalIdentityBytes(identity));
}

/**
 * Context tokens a decoder needs to continue a handoff: the prompt, every token it may
 * generate, and the draft tokens a speculative step may place beyond the last one.
 *
 * @example
 * ```ts
 * contextTokensNeeded({ promptTokens: 8000, generateTokensMax: 512, draftTokensMax: 8 }); // 8520
 * ```
 */
export function contextTokensNeeded(
  need: { promptTokens: number; generateTokensMax: number; draftTokensMax?: number },
): number {
  return need.promptTokens + need.generateTokensMax + (need.draftTokensMax ?? 0);
}

/** Options of `compareIdentity`. */
export interface CompareIdentityOptions {
  /** When set, the decoder's `nCtx` must be at least this many tokens. */
  contextTokensNeeded?: number;
  /** Which side decodes (whose `nCtx` is checked). Default `"remote"`. */
  decoder?: "local" | "remote";
}

/**
 * Lists every must-match field where `remote` differs from `local` (expected = local).
 * Placement and parity-only fields are never compared here (see `parityVerdict`). An empty
 * list means state may move between them.
 *
 * @example
 * ```ts
 * compareIdentity(mine, theirs);
 * // [{ field: "kType", label: "K cache type", expected: "f16", found: "q8_0" }]
 * ```
 */
export function compareIdentity(
  local: NumericalIdentity,
  remote: NumericalIdentity,
  options: CompareIdentityOptions = {},
): IdentityMismatch[] {
  const out: IdentityMismatch[] = [];
  for (const field of EXACT_IDENTITY_FIELDS) {
    const a = _show(field, local[field]);
    const b = _show(field, remote[field]);
    if (a !== b) out.push({ field, label: LABELS[field], expected: a, found: b });
  }
  if (options.contextTokensNeeded !== undefined) {
    const decoder = options.decoder === "local" ? local : remote;
    if (decoder.nCtx < options.contextTokensNeeded) {
      out.push({
        field: "nCtx",
        label: LABELS.nCtx,
        expected: `>= ${options.contextTokensNeeded}`,
        found: String(decoder.nCtx),
      });
    }
  }
  return out;
}

function _show(field: keyof NumericalIdentity, value: unknown): string {
  if (field === "modelDigest" || field === "tokenizerDigest") {
    return String(value).slice(0, DIGEST_PREFIX_CHARS);
  }
  if (field === "layerKinds" && Array.isArray(value)) return _summarizeKinds(value);
  return typeof value === "string" ? JSON.stringify(value) : String(value);
}

// "attention x8, recurrent x40" style, so a long per-layer list stays readable; the full
// list is still compared because the summary includes the position of each run.
function _summarizeKinds(kinds: readonly string[]): string {
  const runs: string[] = [];
  let i = 0;
  while (i < kinds.length) {
    let j = i;
    while (j < kinds.length && kinds[j] === kinds[i]) j++;
    runs.push(j - i === 1 ? `${i}:${kinds[i]}` : `${i}-${j - 1}:${kinds[i]}`);
    i = j;
  }
  return runs.join(",");
}

/**
 * Mismatches joined for error messages.
 *
 * @example
 * ```ts
 * formatIdentityMismatches(compareIdentity(a, b)); // 'K cache type: expected "f16", found "q8_0"'
 * ```
 */
export function formatIdentityMismatches(mismatches: readonly IdentityMismatch[]): string {
  return mismatches.map((m) => `${m.label}: expected ${m.expected}, found ${m.found}`).join("; ");
}

/**
 * Throws IdentityMismatchError naming every differing field; returns when state may move.
 *
 * @example
 * ```ts
 * const options = { contextTokensNeeded: 9000, decoder: "local" } as const;
 * assertIdentityMatch(decoder.numerical, prefiller.numerical, options);
 * ```
 */
export function assertIdentityMatch(
  local: NumericalIdentity,
  remote: NumericalIdentity,
  options: CompareIdentityOptions = {},
): void {
  const mismatches = compareIdentity(local, remote, options);
  if (mismatches.length === 0) return;
  throw new IdentityMismatchError(
    `Peer identity does not match: ${formatIdentityMismatches(mismatches)}`,
    { hint: "load the same model file with the same context, cache and thread settings on both" },
  );
}

/** Whether a handoff may claim bitwise parity with the decoder's own colocated run. */
export interface ParityVerdict {
  parity: "bitwise" | "not-claimed";
  /** Parity-only fields that differ, or that the peer did not announce. */
  differingFields: (keyof NumericalIdentity)[];
  /** Why parity is not claimed, one line without content; absent when bitwise. */
  reason?: string;
}

/**
 * The parity verdict of an accepted handoff (must-match fields already equal): bitwise when
 * both sides run every layer on the CPU (the CPU variant, a must-match field, fixes the
 * kernels) or every parity-only field is equal; `not-claimed` naming the fields when one
 * differs or when the peer's value is unknown (`remote` undefined or without the field).
 *
 * @example
 * ```ts
 * parityVerdict(mine, { ...mine, computeDevice: "Apple M1 Ultra" });
 * // { parity: "not-claimed", differingFields: ["computeDevice"], reason: "compute device: ..." }
 * ```
 */
export function parityVerdict(
  local: NumericalIdentity,
  remote: Partial<NumericalIdentity> | undefined,
): ParityVerdict {
  // All on the CPU, the kernels are fixed by the CPU variant, which must match already.
  if (local.gpuLayers === 0 && remote?.gpuLayers === 0) {
    return { parity: "bitwise", differingFields: [] };
  }
  const differing: (keyof NumericalIdentity)[] = [];
  const notes: string[] = [];
  for (const field of PARITY_ONLY_FIELDS) {
    const theirs = remote?.[field];
    if (theirs === undefined) {
      differing.push(field);
      notes.push(`${LABELS[field]}: the peer did not announce it`);
    } else if (_show(field, theirs) !== _show(field, local[field])) {
      differing.push(field);
      notes.push(
        `${LABELS[field]}: this worker ${_show(field, local[field])}, peer ${_show(field, theirs)}`,
      );
    }
  }
  if (differing.length === 0) return { parity: "bitwise", differingFields: [] };
  return { parity: "not-claimed", differingFields: differing, reason: notes.join("; ") };
}

/**
 * Trunk layers (all but MTP blocks): the layer space that layered components must tile.
 *
 * @example
 * ```ts
 * trunkLayerCount({ layerKinds: ["recurrent", "attention", "mtp"] }); // 2
 * ```
 */
export function trunkLayerCount(identity: Pick<NumericalIdentity, "layerKinds">): number {
  return identity.layerKinds.filter((k) => k !== "mtp").length;
}
