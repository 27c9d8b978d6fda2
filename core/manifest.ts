/**
 * The final manifest: the complete list of components a handoff carried, with sizes and
 * checksums, the logical state they continue from, the checks the decoder must pass before
 * commit, and a binding tag. The prefiller builds it from the headers it sent; the decoder
 * compares it with what its `StagingLedger` accepted.
 *
 * Token values are content and never appear here: the first sampled token travels as its own
 * `first-token` component.
 *
 * @module
 */
import { isHex, SHA256_BYTES } from "./bytes.ts";
import { CHECKSUM_BYTES, type ChunkHeader } from "./chunk.ts";
import { StateValidationError } from "./errors.ts";
import { joinPieces, pieceShapeOk } from "./_pieces.ts";
import {
  type BytePiece,
  type ComponentKind,
  componentRule,
  DEFAULT_STATE_BOUNDS,
  describeComponent,
  firstTilingFault,
  formatRange,
  isComponentKind,
  isModelFamily,
  type ModelFamily,
  NO_LAYERS,
  quoteValue,
  type Range,
  rangeWithin,
  requiredComponents,
  STATE_SCHEMA_VERSION,
  type StateBounds,
  SUPPORTED_STATE_SCHEMA_VERSIONS,
  type TilingFault,
} from "./schema.ts";

/** Checks a decoder runs before commit; the manifest lists those the prefiller asks for. */
export const VERIFY_STEPS = [
  "identity",
  "binding-tag",
  "components-complete",
  "checksums",
  "kv-contiguous",
  "recurrent-position",
  "mtp-ready",
  "continuation-probe",
] as const;
export type VerifyStep = typeof VERIFY_STEPS[number];

/** One component as listed in the manifest. */
export interface ManifestComponent {
  kind: ComponentKind;
  layerRange: Range;
  tokenRange: Range;
  bytes: number;
  /** CRC-32C (8 hex digits) of the payload. Never printed. */
  checksum: string;
  /** Set on a byte piece (schema 3): `bytes` is the piece's, `piece.of` the component's. */
  piece?: BytePiece;
}

/** The logical state the components continue from. No token values. */
export interface LogicalState {
  /** n_past: the position the next token is decoded at. */
  position: number;
  /** Committed tokens in the history component. */
  tokenCount: number;
}

/** The manifest without its binding tag. */
export interface UnsignedManifest {
  handoffId: string;
  identityDigest: string;
  schemaVersion: number;
  family: ModelFamily;
  components: ManifestComponent[];
  logical: LogicalState;
  verify: VerifyStep[];
  /**
   * The exact continuation probe: SHA-256 (hex) of the logits the prefiller got by decoding the
   * first sampled token at `logical.position`. The decoder decodes the same token after import
   * and must get the same digest before it commits. `null`: the digest follows the manifest in
   * its own signed `ProbeDigest` message (`signProbeDigest`), so the prefiller's probe decode is
   * off the manifest's path. Never printed.
   */
  probe?: { logitsSha256: string | null };
}

/** What the prefiller sends after the last chunk. */
export interface FinalManifest extends UnsignedManifest {
  /** Binding tag (hex) over the canonical unsigned manifest. */
  tag: string;
}

/**
 * Checks the decoder must always run for `family`, whatever the manifest asks for.
 *
 * @example
 * ```ts
 * mandatoryVerifySteps("recurrent"); // [..., "recurrent-position"]
 * ```
 */
export function mandatoryVerifySteps(family: ModelFamily): VerifyStep[] {
  const kinds = requiredComponents(family);
  const steps: VerifyStep[] = ["identity", "binding-tag", "components-complete", "checksums"];
  if (kinds.includes("kv-page")) steps.push("kv-contiguous");
  if (kinds.includes("conv")) steps.push("recurrent-position");
  if (kinds.includes("mtp-kv")) steps.push("mtp-ready");
  return steps;
}

/**
 * The manifest entry for a chunk the prefiller sent.
 *
 * @example
 * ```ts
 * const components = sentHeaders.map(componentOf);
 * ```
 */
export function componentOf(h: ChunkHeader): ManifestComponent {
  return {
    kind: h.kind,
    layerRange: h.layerRange,
    tokenRange: h.tokenRange,
    bytes: h.payloadBytes,
    checksum: h.checksum,
    ...(h.piece ? { piece: h.piece } : {}),
  };
}

/**
 * Builds an unsigned manifest; `verify` defaults to the mandatory steps of `family`.
 *
 * @example
 * ```ts
 * const unsigned = buildManifest({ handoffId, identityDigest, family: "hybrid",
 *   components: sent.map(componentOf), logical: { position: 4096, tokenCount: 4096 } });
 * const { manifest, bytes } = await sealManifest(unsigned, binding);
 * ```
 */
export function buildManifest(input: {
  handoffId: string;
  identityDigest: string;
  family: ModelFamily;
  components: readonly ManifestComponent[];
  logical: LogicalState;
  verify?: readonly VerifyStep[];
  schemaVersion?: number;
  probe?: { logitsSha256: string | null };
}): UnsignedManifest {
  const verify = new Set<VerifyStep>([
    ...mandatoryVerifySteps(input.family),
    ...input.verify ?? [],
    ...(input.probe ? ["continuation-probe" as const] : []),
  ]);
  return {
    ...(input.probe ? { probe: { logitsSha256: input.probe.logitsSha256 } } : {}),
    handoffId: input.handoffId,
    identityDigest: input.identityDigest,
    schemaVersion: input.schemaVersion ?? STATE_SCHEMA_VERSION,
    family: input.family,
    components: input.components.map((c) => ({ ...c })),
    logical: { ...input.logical },
    verify: VERIFY_STEPS.filter((s) => verify.has(s)),
  };
}

/** Total payload bytes the manifest lists. */
export function manifestStateBytes(m: Pick<UnsignedManifest, "components">): number {
  return m.components.reduce((sum, c) => sum + c.bytes, 0);
}

/**
 * Checks a manifest received from a peer (shape, bounds, completeness for its family) and
 * returns it typed; throws StateValidationError naming the first problem.
 *
 * @example
 * ```ts
 * const manifest = validateManifest(raw, { trunkLayers: 48, bounds });
 * ```
 */
export function validateManifest(
  raw: unknown,
  options: { trunkLayers: number; bounds?: StateBounds },
): FinalManifest {
  const bounds = options.bounds ?? DEFAULT_STATE_BOUNDS;
  const m = raw as Partial<FinalManifest> | null;
  const fail = (detail: string): never => {
    throw new StateValidationError(`Invalid final manifest: ${detail}`);
  };
  if (typeof m !== "object" || m === null) return fail("not a record");
  if (typeof m.handoffId !== "string" || m.handoffId.length === 0) fail("handoff id missing");
  if (m.handoffId!.length > bounds.idLengthMax) fail("handoff id too long");
  if (!isHex(m.identityDigest, SHA256_BYTES)) fail("identity digest is not SHA-256 hex");
  if (!SUPPORTED_STATE_SCHEMA_VERSIONS.includes(m.schemaVersion as number)) {
    fail(`unsupported state schema version ${quoteValue(m.schemaVersion)}`);
  }
  if (!isModelFamily(m.family)) fail(`unknown family ${quoteValue(m.family)}`);
  if (!isHex(m.tag, SHA256_BYTES)) fail("binding tag missing");
  const logical = m.logical;
  const posOk = typeof logical === "object" && logical !== null &&
    Number.isSafeInteger(logical.position) && logical.position >= 1 &&
    logical.position <= bounds.tokenPositionMax && Number.isSafeInteger(logical.tokenCount) &&
    logical.tokenCount >= 1 && logical.tokenCount <= logical.position;
  if (!posOk) fail("logical state invalid");
  if (!Array.isArray(m.verify) || !m.verify.every((s) => VERIFY_STEPS.includes(s))) {
    fail("verify list invalid");
  }
  const digest = m.probe?.logitsSha256;
  if (m.probe !== undefined && digest !== null && !isHex(digest, SHA256_BYTES)) {
    fail("continuation probe is not SHA-256 hex (or null: it follows)");
  }
  if (m.verify!.includes("continuation-probe") && m.probe === undefined) {
    fail("verify list asks for a continuation probe but the manifest carries none");
  }
  const missingStep = mandatoryVerifySteps(m.family!).find((s) => !m.verify!.includes(s));
  if (missingStep) fail(`verify list lacks mandatory step "${missingStep}"`);
  _checkComponentShapes(m.components, bounds, fail);
  const error = findIncompleteness(m as FinalManifest, options.trunkLayers);
  if (error) throw error;
  return m as FinalManifest;
}

function _checkComponentShapes(
  components: unknown,
  bounds: StateBounds,
  fail: (detail: string) => never,
): void {
  if (!Array.isArray(components)) return fail("components missing");
  if (components.length > bounds.chunksMax) fail(`more than ${bounds.chunksMax} components`);
  let total = 0;
  for (const [i, c] of components.entries()) {
    const ok = typeof c === "object" && c !== null && isComponentKind(c.kind) &&
      rangeWithin(c.layerRange, bounds.layersMax) &&
      rangeWithin(c.tokenRange, bounds.tokenPositionMax) && Number.isSafeInteger(c.bytes) &&
      c.bytes >= 1 && c.bytes <= bounds.chunkPayloadBytesMax && isHex(c.checksum, CHECKSUM_BYTES) &&
      (c.piece === undefined || pieceShapeOk(c, bounds));
    if (!ok) fail(`component ${i} malformed`);
    total += c.bytes;
  }
  if (total > bounds.stateBytesMax) {
    fail(`state of ${total} bytes exceeds stateBytesMax ${bounds.stateBytesMax}`);
  }
}

/**
 * Returns a StateValidationError naming the first missing, duplicate or misplaced component
 * when `m.components` is not a complete state of `m.family` at `m.logical.position`, or null.
 * Layered kinds must tile `[0, trunkLayers)`; KV pages of each layer range must tile
 * `[0, position)`; the byte pieces of a component must tile `[0, of)`.
 *
 * @example
 * ```ts
 * const error = findIncompleteness(manifest, trunkLayerCount(identity));
 * if (error) throw error; // "Incomplete handoff state: conv missing"
 * ```
 */
export function findIncompleteness(
  m: Pick<UnsignedManifest, "family" | "components" | "logical">,
  trunkLayers: number,
): StateValidationError | null {
  const n = m.logical.position;
  const required = requiredComponents(m.family);
  const byKind = new Map<ComponentKind, ManifestComponent[]>();
  const joined = joinPieces(m.components);
  if (typeof joined === "string") return _incomplete(joined);
  for (const c of joined) {
    if (!required.includes(c.kind)) {
      return _incomplete(`unexpected ${c.kind} component for family "${m.family}"`);
    }
    byKind.set(c.kind, [...byKind.get(c.kind) ?? [], c]);
  }
  for (const kind of required) {
    const list = byKind.get(kind) ?? [];
    const rule = componentRule(kind);
    const problem = rule.layered
      ? _layeredProblem(kind, list, trunkLayers, n)
      : rule.tokens === "page"
      ? _pagedProblem(kind, list, n)
      : _singleProblem(kind, list, n);
    if (problem) return _incomplete(problem);
  }
  const history = byKind.get("history")?.[0];
  if (history && history.tokenRange[1] !== m.logical.tokenCount) {
    return _incomplete(
      `history covers ${history.tokenRange[1]} tokens, manifest says ${m.logical.tokenCount}`,
    );
  }
  return null;
}

function _incomplete(detail: string): StateValidationError {
  return new StateValidationError(`Incomplete handoff state: ${detail}`, {
    hint: "the decoder stays uncommitted; the handoff will be retried or recomputed",
  });
}

function _expectedTokens(kind: ComponentKind, n: number): Range | null {
  switch (componentRule(kind).tokens) {
    case "prefix":
      return [0, n];
    case "last":
      return [n - 1, n];
    case "next":
      return [n, n + 1];
    case "page":
      return null;
  }
}

function _faultWord(f: TilingFault): string {
  return f.fault === "gap" ? "missing" : "duplicated";
}

/** A paged kind not scoped to layers (mtp-kv): its pages must tile [0, n). */
function _pagedProblem(kind: ComponentKind, list: ManifestComponent[], n: number): string | null {
  if (list.length === 0) return `${kind} missing`;
  if (list.some((c) => c.layerRange[0] !== NO_LAYERS[0] || c.layerRange[1] !== NO_LAYERS[1])) {
    return `${kind} must not name layers`;
  }
  const fault = firstTilingFault(list.map((c) => c.tokenRange), n);
  return fault ? `${describeComponent(kind, NO_LAYERS, fault.range)} ${_faultWord(fault)}` : null;
}

function _singleProblem(kind: ComponentKind, list: ManifestComponent[], n: number): string | null {
  if (list.length === 0) return `${kind} missing`;
  if (list.length > 1) return `${kind} listed ${list.length} times`;
  const c = list[0];
  if (c.layerRange[0] !== NO_LAYERS[0] || c.layerRange[1] !== NO_LAYERS[1]) {
    return `${kind} must not name layers`;
  }
  const want = _expectedTokens(kind, n)!;
  if (c.tokenRange[0] !== want[0] || c.tokenRange[1] !== want[1]) {
    return `${kind} covers tokens ${formatRange(c.tokenRange)}, expected ${formatRange(want)}`;
  }
  return null;
}

function _layeredProblem(
  kind: ComponentKind,
  list: ManifestComponent[],
  trunkLayers: number,
  n: number,
): string | null {
  if (list.length === 0) return `${kind} missing`;
  const lanes = new Map<string, { layers: Range; tokens: Range[] }>();
  for (const c of list) {
    const key = formatRange(c.layerRange);
    const lane = lanes.get(key) ?? { layers: c.layerRange, tokens: [] };
    lane.tokens.push(c.tokenRange);
    lanes.set(key, lane);
  }
  const layerFault = firstTilingFault([...lanes.values()].map((l) => l.layers), trunkLayers);
  if (layerFault) {
    return `${kind} layers ${formatRange(layerFault.range)} ${_faultWord(layerFault)}`;
  }
  const want = _expectedTokens(kind, n);
  for (const lane of lanes.values()) {
    if (want === null) {
      const fault = firstTilingFault(lane.tokens, n);
      if (fault) return `${describeComponent(kind, lane.layers, fault.range)} ${_faultWord(fault)}`;
    } else if (
      lane.tokens.length !== 1 || lane.tokens[0][0] !== want[0] || lane.tokens[0][1] !== want[1]
    ) {
      const found = describeComponent(kind, lane.layers, lane.tokens[0]);
      return `${found} does not cover ${formatRange(want)}`;
    }
  }
  return null;
}
