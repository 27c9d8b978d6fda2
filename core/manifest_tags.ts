/**
 * The manifest's binding tags: what the prefiller signs and the decoder checks. The
 * FinalManifest frame carries the exact bytes its tag covers (`sealManifest`), so the decoder
 * checks the tag over the bytes it received before it parses them (`openManifest`), and
 * neither side encodes the component list twice.
 *
 * @module
 */
import { type BindingContext, computeBindingTag, verifyBindingTag } from "./binding.ts";
import { canonicalEncode, decodeMsgpack, isHex, SHA256_BYTES } from "./bytes.ts";
import type { FinalManifest, UnsignedManifest } from "./manifest.ts";

/** Canonical bytes of the unsigned part of a manifest (what the tag covers). */
export function canonicalManifestBytes(m: UnsignedManifest): Uint8Array {
  return canonicalEncode({
    handoffId: m.handoffId,
    identityDigest: m.identityDigest,
    schemaVersion: m.schemaVersion,
    family: m.family,
    components: m.components.map((c) => ({
      kind: c.kind,
      layerRange: [c.layerRange[0], c.layerRange[1]],
      tokenRange: [c.tokenRange[0], c.tokenRange[1]],
      bytes: c.bytes,
      checksum: c.checksum,
      ...(c.piece
        ? { piece: { range: [c.piece.range[0], c.piece.range[1]], of: c.piece.of } }
        : {}),
    })),
    logical: { position: m.logical.position, tokenCount: m.logical.tokenCount },
    verify: [...m.verify],
    ...(m.probe ? { probe: { logitsSha256: m.probe.logitsSha256 } } : {}),
  });
}

/** A signed manifest and the bytes its tag covers: what a FinalManifest frame carries. */
export interface SealedManifest {
  manifest: FinalManifest;
  /** `canonicalManifestBytes(manifest)`: the frame's payload. */
  bytes: Uint8Array;
}

/**
 * Signs an unsigned manifest and keeps the bytes the tag covers, to send as they are.
 *
 * @example
 * ```ts
 * const { manifest, bytes } = await sealManifest(unsigned, binding);
 * await stream.send({ type: "FinalManifest", handoffId, attempt, tag: manifest.tag }, bytes);
 * ```
 */
export async function sealManifest(
  m: UnsignedManifest,
  ctx: BindingContext,
): Promise<SealedManifest> {
  const bytes = canonicalManifestBytes(m);
  return { manifest: { ...m, tag: await computeBindingTag(ctx, "final-manifest", bytes) }, bytes };
}

/**
 * Opens a FinalManifest frame's payload: checks `tag` over the bytes as received, then parses
 * them. Returns the manifest with its tag, still to be checked by `validateManifest`, or null
 * when the tag does not verify. Throws ProtocolError when verified bytes are not MessagePack.
 *
 * @example
 * ```ts
 * const raw = await openManifest(frame.payload, header.tag, binding);
 * if (raw === null) abort("binding-tag");
 * const manifest = validateManifest(raw, { trunkLayers });
 * ```
 */
export async function openManifest(
  bytes: Uint8Array,
  tag: unknown,
  ctx: BindingContext,
): Promise<unknown> {
  if (typeof tag !== "string" || !await verifyBindingTag(ctx, "final-manifest", bytes, tag)) {
    return null;
  }
  const raw = decodeMsgpack(bytes);
  return typeof raw === "object" && raw !== null && !Array.isArray(raw) ? { ...raw, tag } : raw;
}

/**
 * The binding tag of a probe digest sent after its manifest (`probe.logitsSha256: null`). The
 * key is per reservation, so a digest cannot be replayed into another attempt or handoff.
 *
 * @example
 * ```ts
 * const tag = await signProbeDigest(binding, digest); // send ProbeDigest { logitsSha256, tag }
 * ```
 */
export function signProbeDigest(ctx: BindingContext, logitsSha256: string): Promise<string> {
  return computeBindingTag(ctx, "probe-digest", canonicalEncode({ logitsSha256 }));
}

/**
 * True when `logitsSha256` is SHA-256 hex and `tag` is its binding tag under `ctx`.
 *
 * @example
 * ```ts
 * if (!await verifyProbeDigest(binding, msg.logitsSha256, msg.tag)) abort("binding-tag");
 * ```
 */
export async function verifyProbeDigest(
  ctx: BindingContext,
  logitsSha256: unknown,
  tag: unknown,
): Promise<boolean> {
  if (!isHex(logitsSha256, SHA256_BYTES) || typeof tag !== "string") return false;
  return await verifyBindingTag(ctx, "probe-digest", canonicalEncode({ logitsSha256 }), tag);
}
