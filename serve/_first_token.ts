/**
 * The first token, from the prefill worker to the coordinator the moment prefill ends
 * (serve/prefill_role.ts), before the rest of the state moves: the client's time to first
 * token does not include the handoff.
 */
import { tokenLogprob } from "../core/logprobs.ts";
import type { PeerConnection } from "../transport/mod.ts";
import { PieceDecoder } from "../ffi/mod.ts";
import type { FirstToken, PrefillRequest } from "./messages.ts";
import type { Engine } from "./engine.ts";
import { logitsDigest } from "./probe.ts";
import { faultPoint } from "./fault_points.ts";

/**
 * Sends the first token to the coordinator. A first token that cannot be sent is not an
 * error: the coordinator then has no token, and the decode side streams it as usual.
 */
export async function sendFirstToken(
  peer: PeerConnection,
  request: PrefillRequest,
  engine: Engine,
  first: { token: number; logits: Float32Array; prefillEndMs: number },
): Promise<void> {
  const text = new PieceDecoder(engine.model.vocab).push(first.token);
  const logitsSha256 = request.probe ? await logitsDigest(first.logits) : null;
  const message: FirstToken = {
    type: "FirstToken",
    handoffId: request.handoffId,
    token: first.token,
    text,
    logitsSha256,
    sentAfterPrefillMs: performance.now() - first.prefillEndMs,
    prefillEndEpochMs: performance.timeOrigin + first.prefillEndMs,
    ...(request.logprobs !== undefined
      ? { logprob: tokenLogprob(first.logits, first.token, request.logprobs) }
      : {}),
  };
  await peer.send(message as unknown as Record<string, unknown>).catch(() => {});
  faultPoint("first-token-sent");
}
