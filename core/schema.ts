/**
 * The versioned continuation-state schema: which components exist, which a model family
 * requires, in what order they travel, and the size bounds a receiver enforces.
 *
 * Changelog of `STATE_SCHEMA_VERSION` (bump on any change to a rule, a kind, a codec or a
 * field a peer relies on; peers with different versions never exchange state):
 *
 * 1. First version. Kinds kv-page, swa-kv, conv, ssm, mtp-kv, mtp-hidden, positions,
 *    sampler, history, first-token. KV pages per layer range in token order from 0; snapshot
 *    kinds (swa-kv, conv, ssm, mtp-kv, mtp-hidden) once per layer after the last page;
 *    metadata kinds once, in any order; one ordered chunk stream per handoff.
 * 2. No component is bounded by one chunk: conv and ssm travel as several chunks whose layer
 *    ranges tile the trunk (each payload the snapshot's entries for its recurrent layers, the
 *    first conv chunk carrying the snapshot header); KV pages are cut into token sub-ranges
 *    that fit a chunk; mtp-kv is paged (streamed during prefill like kv-page, with its own
 *    lane), no longer one after-pages snapshot. Payload checksums are CRC-32C (8 hex digits)
 *    instead of SHA-256. The final manifest travels as its frame's payload.
 * 3. No piece of state is bounded by one chunk: a component that is not paged by tokens
 *    (swa-kv, conv, ssm, mtp-hidden, positions, sampler, history) may travel as byte pieces,
 *    chunks with the same kind, layer range and token range and a `piece` field (bytes
 *    `range` of the component's `of` bytes) whose ranges tile `[0, of)` in stream order. One
 *    recurrent layer larger than a chunk is cut this way; swa-kv is no longer one chunk.
 *
 * @module
 */
import { KV_CACHE_TYPES } from "./kv_types.ts";
import { UsageError } from "./errors.ts";

/** The state schema this build speaks. */
export const STATE_SCHEMA_VERSION = 3;
/** Schema versions this build can import (only the current one for now). */
export const SUPPORTED_STATE_SCHEMA_VERSIONS: readonly number[] = [STATE_SCHEMA_VERSION];

/** Every component kind, in the order they are listed in a manifest. */
export const COMPONENT_KINDS = [
  "kv-page",
  "swa-kv",
  "conv",
  "ssm",
  "mtp-kv",
  "mtp-hidden",
  "positions",
  "sampler",
  "history",
  "first-token",
] as const;
/** One typed part of the continuation state. */
export type ComponentKind = typeof COMPONENT_KINDS[number];

/** The model families the product handles (see `models/`). */
export const MODEL_FAMILIES = ["dense", "iswa", "recurrent", "hybrid", "hybrid-moe-mtp"] as const;
export type ModelFamily = typeof MODEL_FAMILIES[number];

/** A half-open range `[start, end)` of layers or token positions. */
export type Range = readonly [start: number, end: number];

/**
 * One byte piece of a component too large for one chunk (schema 3): the payload is bytes
 * `range` of the component's `of` bytes. The pieces of a component tile `[0, of)` in order.
 */
export interface BytePiece {
  range: Range;
  of: number;
}
/** The layer range of components that are not scoped to trunk layers (MTP, metadata). */
export const NO_LAYERS: Range = [0, 0];

/**
 * When a component may travel: `paged` (kv-page: streamed during prefill in token order),
 * `after-pages` (a snapshot: once per layer, after the last page), `any` (metadata: once).
 */
export type ComponentOrder = "paged" | "after-pages" | "any";

/**
 * How a component's token range relates to the final position n:
 * `page` a slice of [0, n); `prefix` exactly [0, n) (state as of n);
 * `last` exactly [n-1, n); `next` exactly [n, n+1) (the first sampled token).
 */
export type TokenRule = "page" | "prefix" | "last" | "next";

/** Per-kind rules a chunk and a manifest are checked against. */
export interface ComponentRule {
  readonly kind: ComponentKind;
  /** True when the component carries trunk layers and its layer ranges must tile [0, layers). */
  readonly layered: boolean;
  readonly order: ComponentOrder;
  readonly tokens: TokenRule;
  /** Codecs the payload may use. */
  readonly codecs: readonly string[];
  /** `kv` means a `"<k>/<v>"` pair of KV dtypes; otherwise the allowed dtype names. */
  readonly dtypes: "kv" | readonly string[];
  /** Exact payload bytes per token of the token range, or 0 when not fixed. */
  readonly bytesPerToken: number;
  /**
   * True when the component may travel as byte pieces (see `BytePiece`): every kind that is
   * not paged by tokens, except the 4-byte first token.
   */
  readonly pieces: boolean;
}

/** Tensor element types a KV cache may use (llama.cpp `ggml_type` names). */
export const KV_DTYPES: readonly string[] = Object.keys(KV_CACHE_TYPES);
/** Bytes of one token id on the wire (little-endian i32). */
export const TOKEN_BYTES = 4;

const RULES: Record<ComponentKind, ComponentRule> = {
  "kv-page": rule("kv-page", true, "paged", "page", ["llama-kv-cells"], "kv"),
  "swa-kv": rule("swa-kv", true, "after-pages", "prefix", [
    "llama-kv-cells",
    "llama-seq-partial",
  ], "kv"),
  "conv": rule("conv", true, "after-pages", "prefix", ["llama-recurrent-rows"], [
    "f32",
    "f16",
    "bf16",
  ]),
  "ssm": rule("ssm", true, "after-pages", "prefix", ["llama-recurrent-rows"], ["f32"]),
  "mtp-kv": rule("mtp-kv", false, "paged", "page", [
    "llama-kv-cells",
    "llama-seq-state",
  ], "kv"),
  "mtp-hidden": rule("mtp-hidden", false, "after-pages", "last", ["f32-rows"], ["f32"]),
  "positions": rule("positions", false, "any", "prefix", ["msgpack"], ["none"]),
  "sampler": rule("sampler", false, "any", "prefix", ["msgpack"], ["none"]),
  "history": rule("history", false, "any", "prefix", ["i32-le"], ["i32"], TOKEN_BYTES),
  "first-token": rule(
    "first-token",
    false,
    "after-pages",
    "next",
    ["i32-le"],
    ["i32"],
    TOKEN_BYTES,
  ),
};

function rule(
  kind: ComponentKind,
  layered: boolean,
  order: ComponentOrder,
  tokens: TokenRule,
  codecs: readonly string[],
  dtypes: "kv" | readonly string[],
  bytesPerToken = 0,
): ComponentRule {
  const pieces = order !== "paged" && kind !== "first-token";
  return { kind, layered, order, tokens, codecs, dtypes, bytesPerToken, pieces };
}

/**
 * The rules for `kind`.
 *
 * @example
 * ```ts
 * componentRule("ssm").order; // "after-pages"
 * ```
 */
export function componentRule(kind: ComponentKind): ComponentRule {
  return RULES[kind];
}

const STATE_KINDS: Record<ModelFamily, readonly ComponentKind[]> = {
  "dense": ["kv-page"],
  "iswa": ["kv-page", "swa-kv"],
  "recurrent": ["conv", "ssm"],
  "hybrid": ["kv-page", "conv", "ssm"],
  "hybrid-moe-mtp": ["kv-page", "conv", "ssm", "mtp-kv", "mtp-hidden"],
};
const LOGICAL_KINDS: readonly ComponentKind[] = ["positions", "sampler", "history", "first-token"];

/**
 * Component kinds an exact handoff of `family` must carry, in manifest order.
 *
 * @example
 * ```ts
 * requiredComponents("hybrid"); // ["kv-page", "conv", "ssm", "positions", ...]
 * ```
 */
export function requiredComponents(family: ModelFamily): readonly ComponentKind[] {
  return [...STATE_KINDS[family], ...LOGICAL_KINDS];
}

/** True when `kind` may appear in a handoff of `family` (required ones only, for now). */
export function allowedInFamily(family: ModelFamily, kind: ComponentKind): boolean {
  return requiredComponents(family).includes(kind);
}

/** Type guard for component kinds received from a peer. */
export function isComponentKind(x: unknown): x is ComponentKind {
  return typeof x === "string" && (COMPONENT_KINDS as readonly string[]).includes(x);
}

/** Type guard for model family names. */
export function isModelFamily(x: unknown): x is ModelFamily {
  return typeof x === "string" && (MODEL_FAMILIES as readonly string[]).includes(x);
}

/** True when `dtype` is allowed for `kind` (for kv kinds, a `"<k>/<v>"` pair). */
export function dtypeAllowed(kind: ComponentKind, dtype: string): boolean {
  const allowed = RULES[kind].dtypes;
  if (allowed !== "kv") return allowed.includes(dtype);
  const parts = dtype.split("/");
  return parts.length === 2 && parts.every((p) => KV_DTYPES.includes(p));
}

/** The dtype string of a KV component: `kvDtype("f16", "q8_0")` is `"f16/q8_0"`. */
export function kvDtype(k: string, v: string): string {
  return `${k}/${v}`;
}

/** Size and count bounds a receiver enforces; every limit is an explicit option. */
export interface StateBounds {
  /**
   * Largest payload of one chunk. A component larger than this is split by token (pages), by
   * layer (conv, ssm), or into byte pieces (schema 3).
   */
  chunkPayloadBytesMax: number;
  /** Largest total state of one handoff (all chunks together). */
  stateBytesMax: number;
  /** Largest payload of a metadata component (positions, sampler). */
  metaBytesMax: number;
  /** Most chunks (and manifest components) in one handoff. */
  chunksMax: number;
  /** Highest token position a range may reach (a context size no model here exceeds). */
  tokenPositionMax: number;
  /** Most trunk layers a layer range may reach. */
  layersMax: number;
  /** Longest handoff id, tenant id or node id, in characters. */
  idLengthMax: number;
}

const MIB = 1024 * 1024;
const GIB = 1024 * MIB;

/**
 * Defaults sized for contexts up to ~1M tokens of a Nemotron-Super-like model (8,192 B/token
 * of KV, 172,687,360 B of recurrent state): at the lab's limit of 262,144 prompt tokens a
 * handoff is 2 GiB of KV in 128+ chunks plus the snapshot in about 44 chunks, far inside
 * every bound. One chunk fits one frame (transport's 16 MiB payload bound).
 */
export const DEFAULT_STATE_BOUNDS: Readonly<StateBounds> = {
  chunkPayloadBytesMax: 16 * MIB,
  stateBytesMax: 64 * GIB,
  metaBytesMax: 64 * 1024,
  chunksMax: 65_536,
  tokenPositionMax: 1 << 22,
  layersMax: 4096,
  idLengthMax: 128,
};

/**
 * Fills in defaults and checks the bounds are positive integers that fit together.
 *
 * @example
 * ```ts
 * const bounds = resolveStateBounds({ chunkPayloadBytesMax: 16 * 1024 * 1024 });
 * ```
 */
export function resolveStateBounds(partial: Partial<StateBounds> = {}): StateBounds {
  const bounds: StateBounds = { ...DEFAULT_STATE_BOUNDS, ...partial };
  for (const [name, value] of Object.entries(bounds)) {
    if (!Number.isSafeInteger(value) || value <= 0) {
      throw new UsageError(`Invalid state bound ${name} ${JSON.stringify(value)}`, {
        hint: "use a positive whole number",
      });
    }
  }
  if (bounds.chunkPayloadBytesMax > bounds.stateBytesMax) {
    throw new UsageError(
      `Invalid state bounds: chunkPayloadBytesMax ${bounds.chunkPayloadBytesMax} exceeds stateBytesMax ${bounds.stateBytesMax}`,
    );
  }
  return bounds;
}

/**
 * A peer-sent field value for an error message: JSON where possible, and never a throw
 * (msgpack decodes 64-bit integers as BigInt, which JSON.stringify refuses).
 *
 * @example
 * ```ts
 * quoteValue(2n ** 60n); // "1152921504606846976n"
 * ```
 */
export function quoteValue(value: unknown): string {
  if (typeof value === "bigint") return `${value}n`;
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return `(${typeof value})`;
  }
}

/**
 * `" bytes [a, b) of n"` for a piece, `""` for a whole component: for messages. Never throws,
 * whatever a peer sent (headers are named before their fields are checked).
 */
export function formatPiece(piece: BytePiece | undefined): string {
  if (piece === undefined) return "";
  const range = (piece as Partial<BytePiece> | null)?.range;
  if (!rangeWithin(range, Number.MAX_SAFE_INTEGER)) return " (malformed piece)";
  return ` bytes ${formatRange(range)} of ${quoteValue(piece.of)}`;
}

/** `"[a, b)"`, the notation every message uses for ranges. */
export function formatRange(range: Range): string {
  return `[${range[0]}, ${range[1]})`;
}

/**
 * Names a component for messages, never its content.
 *
 * @example
 * ```ts
 * describeComponent("kv-page", [0, 8], [2048, 4096]); // "kv-page layers [0, 8) tokens [2048, 4096)"
 * ```
 */
export function describeComponent(kind: ComponentKind, layers: Range, tokens: Range): string {
  const layerPart = RULES[kind]?.layered ? ` layers ${formatRange(layers)}` : "";
  return `${kind}${layerPart} tokens ${formatRange(tokens)}`;
}

/** True when two half-open ranges share at least one element. */
export function rangesOverlap(a: Range, b: Range): boolean {
  return a[0] < b[1] && b[0] < a[1];
}

/** True when `r` is a range of integers with 0 <= start <= end <= max. */
export function rangeWithin(r: unknown, max: number): r is Range {
  return Array.isArray(r) && r.length === 2 && Number.isSafeInteger(r[0]) &&
    Number.isSafeInteger(r[1]) && r[0] >= 0 && r[0] <= r[1] && r[1] <= max;
}

/** Where a set of ranges fails to tile `[0, end)`: a `gap` (missing) or an `overlap`. */
export interface TilingFault {
  fault: "gap" | "overlap";
  range: Range;
}

/**
 * Returns the first gap or overlap when `ranges` do not tile `[0, end)` exactly, or null.
 *
 * @example
 * ```ts
 * firstTilingFault([[0, 4], [6, 8]], 8); // { fault: "gap", range: [4, 6] }
 * ```
 */
export function firstTilingFault(ranges: readonly Range[], end: number): TilingFault | null {
  const sorted = [...ranges].sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  let at = 0;
  for (const r of sorted) {
    if (r[0] > at) return { fault: "gap", range: [at, r[0]] };
    if (r[0] < at) return { fault: "overlap", range: [r[0], Math.min(at, r[1])] };
    at = r[1];
  }
  if (at < end) return { fault: "gap", range: [at, end] };
  if (at > end) return { fault: "overlap", range: [end, at] };
  return null;
}
