/**
 * The coordinator of one scripted handoff (the `handoff` command): it connects to a prefill
 * worker and a decode worker, checks they can hand off to each other, asks the prefill worker
 * to prefill and hand the state over, and then asks the decode worker to generate, which now
 * owns the request. When the handoff falls back, the decode worker recomputes the prompt
 * itself (colocated); so it does when the prefill worker is lost before it reported (its
 * partial state never commits: the decoder wipes it). When the handoff fails, the client
 * gets a clear error.
 *
 * The first token comes from the prefill worker the moment prefill ends (FirstToken), so the
 * client's time to first token does not include the handoff; the decode worker (committed or
 * colocated) generates it again, checks it is the same, and streams from the second.
 *
 * Every wait is bounded by `timeoutMs` of no progress (see IdleTimeout): tokens, progress
 * reports and outcomes push it back, so the bound holds a silent worker to account without
 * capping a long valid request.
 */
import { HandoffAbortedError, LimitExceededError, PeerError } from "../core/mod.ts";
import {
  type DecoderTelemetrySummary,
  deriveTelemetry,
  type HandoffTelemetry,
} from "../core/telemetry.ts";
import { eligibleForHandoff, type PeerConnection, roleCovers } from "../transport/mod.ts";
import {
  type FirstToken,
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
import { IdleTimeout } from "./_idle_timeout.ts";
import type { SpeculationMode } from "../core/speculation.ts";

export interface HandoffRequest {
  prefill: PeerAddress;
  decode: PeerAddress;
  prompt: string;
  generateTokens: number;
  sampling: SamplingSpec;
  tenantId: string;
  probe: boolean;
  /**
   * The request fails when no worker reports progress for this long (an idle timeout, not a
   * cap on the request's length: a long generation streams tokens the whole time).
   */
  timeoutMs: number;
  /** Called with each piece of generated text as it arrives. */
  onText?: (text: string) => void;
  /** Cancels the request (client gave up). */
  signal?: AbortSignal;
  /** Skip the handoff: the decode worker prefills the prompt itself (the baseline). */
  colocated?: boolean;
  handoffId?: string;
  /** Speculative decoding on the decoder for this request (absent: the decode worker's own). */
  speculation?: SpeculationMode;
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
  /**
   * End of prefill (prefill worker's wall clock) to the first token received (this process's
   * wall clock): meaningful on one host or with synchronized clocks; null without a handoff.
   */
  firstTokenAfterPrefillMs: number | null;
  e2eMs: number;
  mtpReady: boolean | null;
}

/** The first token as the prefill worker sent it, and when it arrived. */
interface First {
  message: FirstToken;
  ttftMs: number;
  afterPrefillMs: number;
}

/** Runs one handoff end to end. Throws HandoffAbortedError / PeerError on a clear failure. */
export async function runHandoff(node: Node, req: HandoffRequest): Promise<HandoffResult> {
  const handoffId = req.handoffId ?? crypto.randomUUID();
  const t0 = performance.now();
  const idle = new IdleTimeout(req.timeoutMs);
  const deadline = AbortSignal.any([idle.signal, ...(req.signal ? [req.signal] : [])]);
  const wait: Wait = { deadline, idle, timeoutMs: req.timeoutMs };
  // A prefill worker that cannot be reached costs the request nothing but the handoff: the
  // decode worker, which can serve it alone, recomputes the prompt (a named fallback). A peer
  // missing from the trust list is a configuration error, not a fallback.
  let prefillLost: string | null = null;
  const connectPrefill = async () => {
    if (req.colocated) return null;
    try {
      return await node.connect(req.prefill);
    } catch (error) {
      const trusted = node.trust.lookup(req.prefill.nodeId)?.certificateSha256;
      if (!(error instanceof PeerError) || !trusted) throw error;
      prefillLost = `the prefill worker is unreachable (${error.message})`;
      return null;
    }
  };
  const [prefillSettled, decodeSettled] = await Promise.allSettled([
    connectPrefill(),
    node.connect(req.decode),
  ]);
  if (prefillSettled.status === "rejected") {
    if (decodeSettled.status === "fulfilled") await decodeSettled.value.close().catch(() => {});
    throw prefillSettled.reason;
  }
  if (decodeSettled.status === "rejected") {
    await prefillSettled.value?.close().catch(() => {});
    throw decodeSettled.reason;
  }
  const prefillPeer = prefillSettled.value;
  const decodePeer = decodeSettled.value;
  try {
    let outcome: PrefillOutcome | null = null;
    let fallbackReason: string | null = null;
    let first: First | null = null;
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
      fallbackReason = prefillLost ?? "colocated placement requested";
    } else if (!eligible.ok) {
      fallbackReason = `decode worker not eligible for a handoff: ${eligible.reason}`;
    } else {
      const onFirst = (message: FirstToken) => {
        const now = performance.now();
        first = {
          message,
          ttftMs: now - t0,
          afterPrefillMs: performance.timeOrigin + now - message.prefillEndEpochMs,
        };
        if (message.text) req.onText?.(message.text);
      };
      outcome = await prefillAndHandOff(prefillPeer!, handoffId, req, wait, onFirst);
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
    const got = first as First | null;
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
        sentTokens: got ? [got.message.token] : [],
        ...(req.speculation ? { speculation: req.speculation } : {}),
      },
      wait,
      req.onText,
      t0,
    );
    const firstDigest = got?.message.logitsSha256;
    const firstTokenAfterPrefillMs = got?.afterPrefillMs ?? null;
    const ttftMs = got?.ttftMs ?? generation.ttftMs;
    return {
      handoffId,
      placement: fallbackReason === null ? "disaggregated" : "colocated",
      fallbackReason,
      text: (got?.message.text ?? "") + generation.text,
      tokens: got ? [got.message.token, ...generation.tokens] : generation.tokens,
      logitsSha256: req.probe && firstDigest
        ? [firstDigest, ...generation.logitsSha256]
        : generation.logitsSha256,
      promptTokens: outcome?.promptTokens ?? 0,
      telemetry: {
        ...deriveTelemetry({
          prefiller: outcome?.telemetry ?? [],
          decoder: generation.done.telemetry ?? [],
          firstTokenAfterPrefillMs,
        }),
        // The client's own clock: request sent to first token received.
        ttftMs,
        // The prefiller's clock, from the last chunk computed (not as recorded after its page
        // export) to the FirstToken message sent.
        ...(got ? { firstTokenDelayMs: got.message.sentAfterPrefillMs } : {}),
      },
      ttftMs,
      firstTokenAfterPrefillMs,
      e2eMs: performance.now() - t0,
      mtpReady: generation.done.mtpReady,
    };
  } finally {
    idle.clear();
    await Promise.allSettled([prefillPeer?.close(), decodePeer.close()]);
  }
}

/** What every wait of one request shares: its cancel/idle signal and the idle timer. */
interface Wait {
  deadline: AbortSignal;
  idle: IdleTimeout;
  timeoutMs: number;
}

async function prefillAndHandOff(
  peer: PeerConnection,
  handoffId: string,
  req: HandoffRequest,
  wait: Wait,
  onFirst: (message: FirstToken) => void,
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
  wait.deadline.addEventListener("abort", onAbort, { once: true });
  try {
    for (;;) {
      const header = await receiveOne(peer, wait, handoffId);
      if (header.type === "FirstToken") onFirst(parseMessage<FirstToken>(header));
      if (header.type === "PrefillOutcome") return parseMessage<PrefillOutcome>(header);
    }
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
      telemetry: null,
    };
  } finally {
    wait.deadline.removeEventListener("abort", onAbort);
  }
}

interface Generation {
  text: string;
  tokens: number[];
  logitsSha256: string[];
  done: GenerateDone & { telemetry: DecoderTelemetrySummary | null };
  ttftMs: number;
}

async function generate(
  peer: PeerConnection,
  request: GenerateRequest,
  wait: Wait,
  onText: ((text: string) => void) | undefined,
  t0: number,
): Promise<Generation> {
  await sendWithPrompt(peer, request);
  const out: Generation = { text: "", tokens: [], logitsSha256: [], done: null!, ttftMs: NaN };
  for (;;) {
    const header = await receiveOne(peer, wait, request.handoffId);
    if (header.type === "TokenBatch") {
      const batch = parseMessage<TokenBatch>(header);
      if (out.tokens.length === 0 && batch.tokens.length > 0) out.ttftMs = performance.now() - t0;
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

/**
 * The next control message for this handoff (any serve type), bounded by the request's idle
 * timeout, which every message for the handoff pushes back.
 */
async function receiveOne(
  peer: PeerConnection,
  wait: Wait,
  handoffId: string,
): Promise<Record<string, unknown>> {
  const { deadline } = wait;
  let fail: () => void = () => {};
  const aborted = new Promise<never>((_, reject) => {
    fail = () =>
      reject(
        deadline.reason instanceof DOMException && deadline.reason.name === "TimeoutError"
          ? new LimitExceededError(
            `The request made no progress for ${wait.timeoutMs} ms: no message from the worker ${peer.peerNodeId}`,
            { hint: "check the workers' logs, or raise --timeout-ms" },
          )
          : new HandoffAbortedError("cancelled", "The request was cancelled"),
      );
    if (deadline.aborted) fail();
    deadline.addEventListener("abort", fail, { once: true });
  });
  try {
    for (;;) {
      const msg = await Promise.race([peer.receive(), aborted]);
      if (msg === null) {
        throw new PeerError(`The worker ${peer.peerNodeId} closed the connection`, {
          hint: "it may have stopped or crashed; see its log",
        });
      }
      const header = msg.header as Record<string, unknown>;
      if (header.handoffId !== handoffId) continue;
      wait.idle.touch();
      return header;
    }
  } finally {
    deadline.removeEventListener("abort", fail);
  }
}
