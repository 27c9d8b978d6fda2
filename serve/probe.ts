/**
 * The exact continuation probe. The prefiller decodes the first sampled token after exporting
 * everything and sends the SHA-256 of the resulting logits in the signed manifest; the decoder,
 * after importing, decodes the same token at the same position and must get the same digest
 * before it sends CommitAck. The decoder needs those logits anyway (the second token is
 * sampled from them), so the probe costs it nothing; the prefiller pays one decode step.
 * The digest travels encrypted and is never logged.
 */
import { sha256Hex } from "../core/mod.ts";
import type { DecodeEngine } from "./engine.ts";

/** SHA-256 (hex) of a logits row, bit for bit. */
export function logitsDigest(logits: Float32Array): Promise<string> {
  return sha256Hex(new Uint8Array(logits.buffer, logits.byteOffset, logits.byteLength));
}

/**
 * Decodes `token` at the engine's position, alone (on a shared context no other sequence is
 * in that step, which keeps it bitwise equal to the prefiller's own run); returns the logits
 * and their digest.
 */
export async function probeStep(
  engine: Pick<DecodeEngine, "step">,
  token: number,
): Promise<{ logits: Float32Array; digest: string }> {
  const logits = await engine.step(token, true);
  return { logits, digest: await logitsDigest(logits) };
}
