/**
 * Message-level binding tags. At reservation the decoder draws a fresh 32-byte `bindingKey`
 * and returns it to the prefiller over the encrypted, authenticated channel. Every state chunk
 * and the final manifest then carry HMAC-SHA256(bindingKey, handoff id | destination node id
 * | tenant id | canonical body). A chunk replayed into another handoff, sent to another
 * destination or attributed to another tenant fails verification, because the key, the ids or
 * both differ. Replays inside one handoff are caught by the staging ledger's sequence check.
 *
 * @module
 */
import {
  canonicalEncode,
  hmacSha256,
  isHex,
  randomBytes,
  toHex,
  verifyHmacSha256,
} from "./bytes.ts";
import { fromHex } from "./bytes.ts";

/** Bytes of a binding key. */
export const BINDING_KEY_BYTES = 32;
/** Bytes of a binding tag (HMAC-SHA256). */
export const BINDING_TAG_BYTES = 32;

/** What a tag binds a message to. Both sides build it from the reservation. */
export interface BindingContext {
  /** The per-reservation key; never logged, erased with the reservation. */
  bindingKey: Uint8Array;
  handoffId: string;
  /** Node id of the decoder the state is meant for. */
  destNodeId: string;
  tenantId: string;
}

/** The kinds of message a tag can cover; part of the tagged bytes so tags never cross kinds. */
export type BindingDomain = "state-chunk" | "final-manifest" | "probe-digest";

/**
 * A fresh random binding key (the decoder calls this once per reservation).
 *
 * @example
 * ```ts
 * const bindingKey = newBindingKey(); // 32 random bytes
 * ```
 */
export function newBindingKey(): Uint8Array {
  return randomBytes(BINDING_KEY_BYTES);
}

function _tagged(ctx: BindingContext, domain: BindingDomain, body: Uint8Array): Uint8Array {
  return canonicalEncode({
    domain: `skippy-binding/${domain}`,
    handoffId: ctx.handoffId,
    destNodeId: ctx.destNodeId,
    tenantId: ctx.tenantId,
    body,
  });
}

/**
 * Hex HMAC-SHA256 tag of `body` bound to the handoff, destination and tenant in `ctx`.
 *
 * @example
 * ```ts
 * const tag = await computeBindingTag(ctx, "state-chunk", canonicalHeaderBytes(header));
 * ```
 */
export async function computeBindingTag(
  ctx: BindingContext,
  domain: BindingDomain,
  body: Uint8Array,
): Promise<string> {
  return toHex(await hmacSha256(ctx.bindingKey, _tagged(ctx, domain, body)));
}

/**
 * True when `tag` is the binding tag of `body` under `ctx` (constant-time comparison).
 *
 * @example
 * ```ts
 * if (!await verifyBindingTag(ctx, "state-chunk", bytes, tag)) throw new PeerError("...");
 * ```
 */
export async function verifyBindingTag(
  ctx: BindingContext,
  domain: BindingDomain,
  body: Uint8Array,
  tag: string,
): Promise<boolean> {
  if (!isHex(tag, BINDING_TAG_BYTES)) return false;
  return await verifyHmacSha256(ctx.bindingKey, _tagged(ctx, domain, body), fromHex(tag));
}
