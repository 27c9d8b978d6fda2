/**
 * The coordinator of one request (the `handoff` command, and the HTTP API): over the node's
 * shared links (one authenticated connection per peer, serve/peer_links.ts), it checks the
 * prefill and decode workers can hand off to each other, asks the prefill worker to prefill
 * and hand the state over, and then asks the decode worker to generate, which now owns the
 * request.
 *
 * No request is lost while a node that can serve it is left; each fallback is named in the
 * result (`fallbacks`, `fallbackReason`) and its telemetry:
 * - prefill worker dead, unreachable or lost before it reported, or the pair not eligible:
 *   the decode worker recomputes the prompt (`colocated-on-decoder`; a partial handoff never
 *   commits: the decoder wipes it);
 * - decode worker unreachable at the start: the prefill worker runs it alone
 *   (`colocated-on-prefill`);
 * - decode worker lost before CommitAck: the prefill worker, which kept the state, continues
 *   generating from it (`completed-on-prefill`, no recompute);
 * - the worker generating lost mid-generation: the next node alive (the decoder, any
 *   `decodeAlternates`, then the prefill worker) recomputes the prompt, regenerates the
 *   tokens the client already has, checks them, and streams on (`resumed`).
 * A request fails only when no node is left (NoNodeLeftError, naming each and why). Deadline:
 * a node dying mid-request is noticed within the link's idle timeout (`maxIdleTimeoutMs`),
 * and each further candidate costs at most `connectTimeoutMs` (none for one known dead), so
 * the error comes within maxIdleTimeoutMs + candidates x connectTimeoutMs of the last death.
 *
 * The first token comes from the prefill worker the moment prefill ends (FirstToken), so the
 * client's time to first token does not include the handoff; the decode worker (committed or
 * colocated) generates it again, checks it is the same, and streams from the second.
 *
 * Every wait is bounded by `timeoutMs` of no progress (see IdleTimeout): tokens, progress
 * reports and outcomes push it back, so the bound holds a silent worker to account without
 * capping a long valid request.
 */
import { HandoffAbortedError, PeerError } from "../core/mod.ts";
import { deriveTelemetry, type FallbackRecord, type HandoffTelemetry } from "../core/telemetry.ts";
import { eligibleForHandoff, roleCovers } from "../transport/mod.ts";
import {
  type FirstToken,
  type GenerateRequest,
  parseMessage,
  type PeerAddress,
  type PrefillOutcome,
  type PrefillRequest,
  type SamplingSpec,
} from "./messages.ts";
import type { Node } from "./node.ts";
import { IdleTimeout } from "./_idle_timeout.ts";
import {
  type ClientStream,
  type Generation,
  readGeneration,
  RequestChannel,
  RequestPeers,
  type Wait,
  type WorkerRole,
} from "./_request_io.ts";

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
  /** Further decode workers a request may resume on when its decode worker is lost. */
  decodeAlternates?: PeerAddress[];
}

export interface HandoffResult {
  handoffId: string;
  /** `disaggregated`: the state moved; `colocated`: the decode worker recomputed the prompt. */
  placement: "disaggregated" | "colocated";
  /** Why it ran colocated, or null. */
  fallbackReason: string | null;
  /** Every fallback taken, in order (empty: none); also in `telemetry.fallbacks`. */
  fallbacks: FallbackRecord[];
  /** The worker that generated the end of the stream. */
  completedBy: { nodeId: string; role: WorkerRole };
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

/** No node that could serve the request is left: each one tried, and why it could not. */
export class NoNodeLeftError extends PeerError {
  constructor(readonly tried: string[]) {
    super(`No node can serve this request: ${tried.join("; ")}`, {
      hint: "restart the workers (a request fails only when every one is dead or unreachable)",
    });
  }
}

/** The first token as the prefill worker sent it, and when it arrived. */
interface First {
  message: FirstToken;
  ttftMs: number;
  afterPrefillMs: number;
}

/** Where the rest of the stream comes from: a GenerateRequest to send, or one already running. */
interface Source {
  channel: RequestChannel;
  mode: "committed" | "local" | "running";
}

/** Runs one request end to end. Throws HandoffAbortedError / PeerError on a clear failure. */
export async function runHandoff(node: Node, req: HandoffRequest): Promise<HandoffResult> {
  const handoffId = req.handoffId ?? crypto.randomUUID();
  const t0 = performance.now();
  const idle = new IdleTimeout(req.timeoutMs);
  const deadline = AbortSignal.any([idle.signal, ...(req.signal ? [req.signal] : [])]);
  const wait: Wait = { deadline, idle, timeoutMs: req.timeoutMs };
  const peers = new RequestPeers(node, handoffId);
  const out: ClientStream = { tokens: [], text: "", logitsSha256: [], ttftMs: null };
  const fallbacks: FallbackRecord[] = [];
  const fallback = (f: Omit<FallbackRecord, "tokensBefore">) =>
    fallbacks.push({ ...f, tokensBefore: out.tokens.length });
  try {
    // Both links at once; a peer known dead answers at once, so it costs nothing.
    const [prefill, decode] = await Promise.all([
      req.colocated
        ? { lost: "colocated placement requested" }
        : peers.open(req.prefill, "prefill"),
      peers.open(req.decode, "decode"),
    ]);
    if (prefill instanceof RequestChannel) {
      const roles = prefill.link.peerCapabilities?.roles ?? [];
      if (!roles.some((r) => roleCovers(r, "prefill"))) {
        throw new PeerError(`The peer ${prefill.nodeId} does not serve the prefill role`, {
          hint: "pass a worker started with --role prefill (or prefill+decode) as --prefill",
        });
      }
    }
    let outcome: PrefillOutcome | null = null;
    let first: First | null = null;
    let source: Source;
    if (prefill instanceof RequestChannel && decode instanceof RequestChannel) {
      const eligible = eligibleForHandoff(
        prefill.link.peerCapabilities ?? {},
        decode.link.peerCapabilities,
        "decode",
      );
      if (!eligible.ok) {
        const reason = `decode worker not eligible for a handoff: ${eligible.reason}`;
        fallback({ kind: "colocated-on-decoder", reason, nodeId: decode.nodeId });
        source = { channel: decode, mode: "local" };
      } else {
        const onFirst = (message: FirstToken) => {
          const now = performance.now();
          first = {
            message,
            ttftMs: now - t0,
            afterPrefillMs: performance.timeOrigin + now - message.prefillEndEpochMs,
          };
          out.tokens.push(message.token);
          out.text += message.text;
          if (req.probe && message.logitsSha256) out.logitsSha256.push(message.logitsSha256);
          out.ttftMs = first.ttftMs;
          if (message.text) req.onText?.(message.text);
        };
        outcome = await prefillAndHandOff(prefill, peers, handoffId, req, wait, onFirst);
        source = afterPrefill(outcome, prefill, decode, fallback, out.tokens.length > 0);
      }
    } else if (decode instanceof RequestChannel) {
      // Colocated as requested is no fallback; a prefill worker that cannot be reached is.
      const lost = (prefill as { lost: string }).lost;
      const reason = `the prefill worker is unreachable (${lost})`;
      if (!req.colocated) fallback({ kind: "colocated-on-decoder", reason, nodeId: decode.nodeId });
      source = { channel: decode, mode: "local" };
    } else if (prefill instanceof RequestChannel) {
      const reason = `the decode worker is unreachable (${decode.lost}); ran on the prefill worker`;
      fallback({ kind: "colocated-on-prefill", reason, nodeId: prefill.nodeId });
      source = { channel: prefill, mode: "local" };
    } else {
      throw new NoNodeLeftError([
        ...(req.colocated ? [] : [`prefill worker ${req.prefill.nodeId}: ${prefill.lost}`]),
        `decode worker ${req.decode.nodeId}: ${decode.lost}`,
      ]);
    }
    const { generation, channel } = await generateWithRecovery(
      peers,
      source,
      req,
      handoffId,
      wait,
      out,
      t0,
      fallback,
    );
    const got = first as First | null;
    const firstTokenAfterPrefillMs = got?.afterPrefillMs ?? null;
    const ttftMs = out.ttftMs ?? NaN;
    const fallbackReason = fallbacks.length > 0
      ? fallbacks.map((f) => f.reason).join("; then ")
      : req.colocated
      ? "colocated placement requested"
      : null;
    return {
      handoffId,
      placement: outcome?.outcome === "committed" ? "disaggregated" : "colocated",
      fallbackReason,
      fallbacks,
      completedBy: { nodeId: channel.nodeId, role: channel.role },
      text: out.text,
      tokens: out.tokens,
      logitsSha256: req.probe ? out.logitsSha256 : [],
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
        fallbacks,
      },
      ttftMs,
      firstTokenAfterPrefillMs,
      e2eMs: performance.now() - t0,
      mtpReady: generation.done.mtpReady,
    };
  } finally {
    idle.clear();
    // The links stay open for the next request: nothing here waits on a close.
    peers.close();
  }
}

/** Where generation continues once the prefill worker has reported. */
function afterPrefill(
  outcome: PrefillOutcome,
  prefill: RequestChannel,
  decode: RequestChannel,
  fallback: (f: Omit<FallbackRecord, "tokensBefore">) => void,
  hadFirst: boolean,
): Source {
  if (outcome.outcome === "failed") {
    throw new HandoffAbortedError(
      outcome.reason ?? "failed",
      `Handoff failed: ${outcome.message ?? outcome.reason}`,
      { hint: "check both workers are running and trust each other; see their logs" },
    );
  }
  if (outcome.outcome === "committed") return { channel: decode, mode: "committed" };
  const reason = outcome.message ?? outcome.reason ?? "fallback";
  if (outcome.completedHere) {
    // With a first token, the prefill worker continues from its state; without one it had
    // not prefilled yet (no decode worker reachable) and runs the whole request.
    const kind = hadFirst ? "completed-on-prefill" : "colocated-on-prefill";
    fallback({ kind, reason, nodeId: prefill.nodeId });
    return { channel: prefill, mode: "running" };
  }
  fallback({ kind: "colocated-on-decoder", reason, nodeId: decode.nodeId });
  return { channel: decode, mode: "local" };
}

/**
 * Streams the rest of the request from `source`; when that worker is lost, resumes on the
 * next node alive (recompute of the prompt and the tokens already streamed, checked there),
 * until one completes or none is left.
 */
async function generateWithRecovery(
  peers: RequestPeers,
  first: Source,
  req: HandoffRequest,
  handoffId: string,
  wait: Wait,
  out: ClientStream,
  t0: number,
  fallback: (f: Omit<FallbackRecord, "tokensBefore">) => void,
): Promise<{ generation: Generation; channel: RequestChannel }> {
  const candidates: [PeerAddress, WorkerRole][] = [
    [req.decode, "decode"],
    ...(req.decodeAlternates ?? []).map((a) => [a, "decode"] as [PeerAddress, WorkerRole]),
    [req.prefill, "prefill"],
  ];
  const tried: string[] = [];
  const failed = new Set<string>();
  let source = first;
  for (;;) {
    const onAbort = () => source.channel.send({ type: "CancelRequest", handoffId }).catch(() => {});
    wait.deadline.addEventListener("abort", onAbort, { once: true });
    try {
      if (source.mode !== "running") {
        await source.channel.sendRequest(generateRequest(req, handoffId, source.mode, out.tokens));
      }
      const generation = await readGeneration(source.channel, wait, out, t0, req.onText);
      return { generation, channel: source.channel };
    } catch (error) {
      if (!(error instanceof PeerError) || wait.deadline.aborted) throw error;
      const lost = source.channel;
      peers.markDead(lost, error.message);
      failed.add(lost.nodeId);
      tried.push(`${lost.role} worker ${lost.nodeId}: ${error.message}`);
      const next = await nextAlive(peers, candidates, failed, tried);
      if (!next) throw new NoNodeLeftError(tried);
      const when = source.mode === "committed" ? "after the commit" : "while generating";
      fallback({
        kind: "resumed",
        reason:
          `the ${lost.role} worker was lost ${when} (${error.message}); resumed on the ${next.role} worker from the prompt and ${out.tokens.length} streamed tokens (recompute)`,
        nodeId: next.nodeId,
      });
      source = { channel: next, mode: "local" };
    } finally {
      wait.deadline.removeEventListener("abort", onAbort);
    }
  }
}

/** The first candidate not yet failed whose link is (or becomes) live; notes why others are not. */
async function nextAlive(
  peers: RequestPeers,
  candidates: [PeerAddress, WorkerRole][],
  failed: Set<string>,
  tried: string[],
): Promise<RequestChannel | null> {
  for (const [address, role] of candidates) {
    if (failed.has(address.nodeId)) continue;
    failed.add(address.nodeId);
    const channel = await peers.open(address, role);
    if (channel instanceof RequestChannel) return channel;
    tried.push(`${role} worker ${address.nodeId}: ${channel.lost}`);
  }
  return null;
}

function generateRequest(
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
    sampling: mode === "local" ? req.sampling : null,
    probe: req.probe,
    sentTokens: [...sent],
  };
}

async function prefillAndHandOff(
  channel: RequestChannel,
  peers: RequestPeers,
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
    completeOnDecoderLoss: true,
  };
  const onAbort = () => channel.send({ type: "CancelRequest", handoffId }).catch(() => {});
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
