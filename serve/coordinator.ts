/**
 * The coordinator of one scripted handoff (the `handoff` command): it connects to a prefill
 * worker and a decode worker, checks they can hand off to each other, asks the prefill worker
 * to prefill and hand the state over, and then asks the decode worker to generate, which now
 * owns the request. When the handoff falls back, the decode worker recomputes the prompt
 * itself (colocated); so it does when the prefill worker is lost before it reported (its
 * partial state never commits: the decoder wipes it). When the handoff fails, the client
 * gets a clear error. Every wait is bounded.
 */
import { HandoffAbortedError, LimitExceededError, PeerError } from "../core/mod.ts";
import { deriveTelemetry, type HandoffTelemetry } from "../core/telemetry.ts";
import { eligibleForHandoff, type PeerConnection, roleCovers } from "../transport/mod.ts";
import {
  type GenerateDone,
  type GenerateRequest,
  parseMessage,
  type PeerAddress,
  type PrefillOutcome,
  type PrefillRequest,
  type SamplingSpec,
  type TokenBatch,
} from "./messages.ts";
import type { Node } from "./node.ts";

export interface HandoffRequest {
  prefill: PeerAddress;
  decode: PeerAddress;
  prompt: string;
  generateTokens: number;
  sampling: SamplingSpec;
  tenantId: string;
  probe: boolean;
  /** The whole request (handoff and generation) must finish within this. */
  timeoutMs: number;
  /** Called with each piece of generated text as it arrives. */
  onText?: (text: string) => void;
  /** Cancels the request (client gave up). */
  signal?: AbortSignal;
  /** Skip the handoff: the decode worker prefills the prompt itself (the baseline). */
  colocated?: boolean;
  handoffId?: string;
}

export interface HandoffResult {
  handoffId: string;
  /** `disaggregated`: the state moved; `colocated`: the decode worker recomputed the prompt. */
  placement: "disaggregated" | "colocated";
  /** Why it ran colocated, or null. */
  fallbackReason: string | null;
  text: string;
  tokens: number[];
  /** With `probe`: SHA-256 of each token's logits (first from the prefill worker). */
  logitsSha256: string[];
  promptTokens: number;
  telemetry: HandoffTelemetry;
  /** On the coordinator's clock: request sent to first token received, and to the end. */
  ttftMs: number;
  e2eMs: number;
  mtpReady: boolean | null;
}

/** Runs one handoff end to end. Throws HandoffAbortedError / PeerError on a clear failure. */
export async function runHandoff(node: Node, req: HandoffRequest): Promise<HandoffResult> {
  const handoffId = req.handoffId ?? crypto.randomUUID();
  const t0 = performance.now();
  const deadline = AbortSignal.any([
    AbortSignal.timeout(req.timeoutMs),
    ...(req.signal ? [req.signal] : []),
  ]);
  const [prefillPeer, decodePeer] = await Promise.all([
    req.colocated ? null : node.connect(req.prefill),
    node.connect(req.decode),
  ]);
  try {
    let outcome: PrefillOutcome | null = null;
    let fallbackReason: string | null = null;
    const eligible = eligibleForHandoff(
      prefillPeer?.peerCapabilities ?? {},
      decodePeer.peerCapabilities,
      "decode",
    );
    const prefillRoles = prefillPeer?.peerCapabilities?.roles ?? [];
    if (prefillPeer && !prefillRoles.some((r) => roleCovers(r, "prefill"))) {
      throw new PeerError(`The peer ${prefillPeer.peerNodeId} does not serve the prefill role`, {
        hint: "pass a worker started with --role prefill (or prefill+decode) as --prefill",
      });
    }
    if (!prefillPeer) {
      fallbackReason = "colocated placement requested";
    } else if (!eligible.ok) {
      fallbackReason = `decode worker not eligible for a handoff: ${eligible.reason}`;
    } else {
      outcome = await prefillAndHandOff(prefillPeer!, handoffId, req, deadline);
      if (outcome.outcome === "failed") {
        throw new HandoffAbortedError(
          outcome.reason ?? "failed",
          `Handoff failed: ${outcome.message ?? outcome.reason}`,
          {
            hint: "check both workers are running and trust each other; see their logs",
          },
        );
      }
      if (outcome.outcome === "fallback") fallbackReason = outcome.message ?? outcome.reason;
    }
    const generation = await generate(
      decodePeer,
      {
        type: "GenerateRequest",
        handoffId,
        tenantId: req.tenantId,
        generateTokens: req.generateTokens,
        mode: fallbackReason === null ? "committed" : "local",
        prompt: fallbackReason === null ? null : req.prompt,
        sampling: fallbackReason === null ? null : req.sampling,
        probe: req.probe,
      },
      deadline,
      req.onText,
      t0,
    );
    const prefillEvents = outcome?.events ?? [];
    return {
      handoffId,
      placement: fallbackReason === null ? "disaggregated" : "colocated",
      fallbackReason,
      text: generation.text,
      tokens: generation.tokens,
      logitsSha256: fallbackReason === null && outcome?.firstLogitsSha256
        ? [outcome.firstLogitsSha256, ...generation.logitsSha256]
        : generation.logitsSha256,
      promptTokens: outcome?.promptTokens ?? 0,
      telemetry: {
        ...deriveTelemetry({ prefiller: prefillEvents, decoder: generation.done.events }),
        // The client's own clock: request sent to first token received.
        ttftMs: generation.ttftMs,
      },
      ttftMs: generation.ttftMs,
      e2eMs: performance.now() - t0,
      mtpReady: generation.done.mtpReady,
    };
  } finally {
    await Promise.allSettled([prefillPeer?.close(), decodePeer.close()]);
  }
}

async function prefillAndHandOff(
  peer: PeerConnection,
  handoffId: string,
  req: HandoffRequest,
  deadline: AbortSignal,
): Promise<PrefillOutcome> {
  const request: PrefillRequest = {
    type: "PrefillRequest",
    handoffId,
    tenantId: req.tenantId,
    prompt: req.prompt,
    generateTokens: req.generateTokens,
    sampling: req.sampling,
    decode: req.decode,
    probe: req.probe,
  };
  await sendWithPrompt(peer, request);
  const onAbort = () => {
    peer.send({ type: "CancelRequest", handoffId }).catch(() => {});
  };
  deadline.addEventListener("abort", onAbort, { once: true });
  try {
    const header = await receiveOne(peer, deadline, "PrefillOutcome", handoffId);
    return parseMessage<PrefillOutcome>(header);
  } catch (error) {
    if (!(error instanceof PeerError)) throw error;
    // The prefill worker died or dropped us: recompute on the decode worker.
    return {
      type: "PrefillOutcome",
      handoffId,
      outcome: "fallback",
      reason: "connection-lost",
      message: `the prefill worker was lost: ${error.message}`,
      promptTokens: 0,
      events: [],
      firstLogitsSha256: null,
    };
  } finally {
    deadline.removeEventListener("abort", onAbort);
  }
}

interface Generation {
  text: string;
  tokens: number[];
  logitsSha256: string[];
  done: GenerateDone;
  ttftMs: number;
}

async function generate(
  peer: PeerConnection,
  request: GenerateRequest,
  deadline: AbortSignal,
  onText: ((text: string) => void) | undefined,
  t0: number,
): Promise<Generation> {
  await sendWithPrompt(peer, request);
  const out: Generation = { text: "", tokens: [], logitsSha256: [], done: null!, ttftMs: NaN };
  for (;;) {
    const header = await receiveOne(peer, deadline, null, request.handoffId);
    if (header.type === "TokenBatch") {
      const batch = parseMessage<TokenBatch>(header);
      if (out.tokens.length === 0) out.ttftMs = performance.now() - t0;
      out.tokens.push(...batch.tokens);
      out.text += batch.text;
      out.logitsSha256.push(...(batch.logitsSha256 ?? []));
      if (batch.text) onText?.(batch.text);
      continue;
    }
    if (header.type === "GenerateDone") {
      out.done = parseMessage<GenerateDone>(header);
      if (!out.done.ok) {
        throw new HandoffAbortedError("decode-failed", `Generation failed: ${out.done.message}`);
      }
      return out;
    }
  }
}

/** Sends a request whose prompt travels as the frame's payload (headers are small). */
async function sendWithPrompt(
  peer: PeerConnection,
  request: PrefillRequest | GenerateRequest,
): Promise<void> {
  const { prompt, ...header } = request;
  const payload = prompt === null ? undefined : new TextEncoder().encode(prompt);
  await peer.send({ ...header, prompt: null } as unknown as Record<string, unknown>, payload);
}

/** The next control message of `type` (any serve type if null) for this handoff, bounded. */
async function receiveOne(
  peer: PeerConnection,
  deadline: AbortSignal,
  type: string | null,
  handoffId: string,
): Promise<Record<string, unknown>> {
  const aborted = new Promise<never>((_, reject) => {
    const fail = () =>
      reject(
        deadline.reason instanceof DOMException && deadline.reason.name === "TimeoutError"
          ? new LimitExceededError("The request did not finish within its timeout", {
            hint: "raise --timeout-ms, or check the workers' logs",
          })
          : new HandoffAbortedError("cancelled", "The request was cancelled"),
      );
    if (deadline.aborted) fail();
    deadline.addEventListener("abort", fail, { once: true });
  });
  for (;;) {
    const msg = await Promise.race([peer.receive(), aborted]);
    if (msg === null) {
      throw new PeerError(`The worker ${peer.peerNodeId} closed the connection`, {
        hint: "it may have stopped or crashed; see its log",
      });
    }
    const header = msg.header as Record<string, unknown>;
    if (header.handoffId !== handoffId) continue;
    if (type === null || header.type === type) return header;
  }
}
