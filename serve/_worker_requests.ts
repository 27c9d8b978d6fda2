/**
 * What a worker is asked to do for one request. The coordinator's (serve/coordinator.ts): the
 * PrefillRequest to a prefill worker, read until its PrefillOutcome (the first token passed on
 * the moment it arrives), and the GenerateRequest that streams the rest from a committed
 * session or from the prompt. And the GenerateRequest a prefill worker runs for itself when it
 * cannot reach the decode worker (serve/prefill_role.ts).
 */
import { PeerError } from "../core/mod.ts";
import {
  type FirstToken,
  type GenerateRequest,
  parseMessage,
  type PrefillOutcome,
  type PrefillRequest,
} from "./messages.ts";
import type { RequestChannel, RequestPeers, Wait } from "./_request_io.ts";
import type { HandoffRequest } from "./coordinator.ts";

/** The GenerateRequest that continues `req`, after the `sent` tokens the client already has. */
export function generateRequest(
  req: HandoffRequest,
  handoffId: string,
  mode: "committed" | "local",
  sent: number[],
): GenerateRequest {
  return {
    type: "GenerateRequest",
    handoffId,
    tenantId: req.tenantId,
    generateTokens: req.generateTokens,
    mode,
    prompt: mode === "local" ? req.prompt : null,
    ...(mode === "local" && req.promptSpecialSpans?.length
      ? { promptSpecialSpans: req.promptSpecialSpans }
      : {}),
    sampling: mode === "local" ? req.sampling : null,
    probe: req.probe,
    sentTokens: [...sent],
    ...(req.logprobs !== undefined ? { logprobs: req.logprobs } : {}),
    ...(req.speculation ? { speculation: req.speculation } : {}),
  };
}

/**
 * Asks the prefill worker to prefill and hand the state to the decode worker, and waits for
 * its outcome. A prefill worker lost meanwhile is marked dead and answers as a fallback (the
 * decode worker recomputes); a cancel is passed on to it.
 */
export async function prefillAndHandOff(
  channel: RequestChannel,
  r: { req: HandoffRequest; handoffId: string; wait: Wait; peers: RequestPeers },
  onFirst: (message: FirstToken) => void,
): Promise<PrefillOutcome> {
  const { req, handoffId, wait, peers } = r;
  const request: PrefillRequest = {
    type: "PrefillRequest",
    handoffId,
    tenantId: req.tenantId,
    prompt: req.prompt,
    ...(req.promptSpecialSpans?.length ? { promptSpecialSpans: req.promptSpecialSpans } : {}),
    generateTokens: req.generateTokens,
    sampling: req.sampling,
    decode: req.decode,
    probe: req.probe,
    completeOnDecoderLoss: true,
    ...(req.logprobs !== undefined ? { logprobs: req.logprobs } : {}),
    ...(req.turnEnds?.length ? { turnEnds: req.turnEnds } : {}),
  };
  const onAbort = () =>
    channel.send({ type: "CancelRequest", handoffId, tenantId: req.tenantId }).catch(() => {});
  wait.deadline.addEventListener("abort", onAbort, { once: true });
  try {
    await channel.sendRequest(request);
    for (;;) {
      const header = await channel.receive(wait);
      if (header.type === "FirstToken") onFirst(parseMessage<FirstToken>(header));
      if (header.type === "PrefillOutcome") return parseMessage<PrefillOutcome>(header);
    }
  } catch (error) {
    if (!(error instanceof PeerError)) throw error;
    // The prefill worker died or dropped us: recompute on the decode worker.
    peers.markDead(channel, error.message);
    return {
      type: "PrefillOutcome",
      handoffId,
      outcome: "fallback",
      reason: "connection-lost",
      message: `the prefill worker was lost: ${error.message}`,
      promptTokens: 0,
      telemetry: null,
    };
  } finally {
    wait.deadline.removeEventListener("abort", onAbort);
  }
}

/** The GenerateRequest a prefill worker runs for itself when no decode worker can be reached. */
export function localRequest(request: PrefillRequest): GenerateRequest {
  return {
    type: "GenerateRequest",
    handoffId: request.handoffId,
    tenantId: request.tenantId,
    generateTokens: request.generateTokens,
    mode: "local",
    prompt: request.prompt,
    ...(request.promptSpecialSpans ? { promptSpecialSpans: request.promptSpecialSpans } : {}),
    ...(request.logprobs !== undefined ? { logprobs: request.logprobs } : {}),
    sampling: request.sampling,
    probe: request.probe,
  };
}
