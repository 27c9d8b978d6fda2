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
import type { TokenLogprob } from "../core/logprobs.ts";
import { HandoffAbortedError, PeerError } from "../core/mod.ts";
import { deriveTelemetry, type FallbackRecord, type HandoffTelemetry } from "../core/telemetry.ts";
import { eligibleForHandoff, roleCovers } from "../transport/mod.ts";
import {
  type FirstToken,
  type LinkLossReport,
  type PeerAddress,
  type PrefillOutcome,
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
  type Unreachable,
  type Wait,
  type WorkerRole,
} from "./_request_io.ts";
import type { SpeculationMode } from "../core/speculation.ts";
import { generateRequest, prefillAndHandOff } from "./_worker_requests.ts";

export interface HandoffRequest {
  prefill: PeerAddress;
  decode: PeerAddress;
  prompt: string;
  /** The chat template's special-token markers in `prompt` (see serve/prompt_tokens.ts). */
  promptSpecialSpans?: number[];
  /** Log probabilities of each token, with this many alternatives (0..20); absent: none. */
  logprobs?: number;
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
  /**
   * Called with each run of generated token ids as it arrives (before its onText), and their
   * log probabilities when `logprobs` asked for them.
   */
  onTokens?: (tokens: number[], logprobs?: (TokenLogprob | null)[]) => void;
  /** Cancels the request (client gave up). */
  signal?: AbortSignal;
  /** Skip the handoff: the decode worker prefills the prompt itself (the baseline). */
  colocated?: boolean;
  handoffId?: string;
  /** Further decode workers a request may resume on when its decode worker is lost. */
  decodeAlternates?: PeerAddress[];
  /** Speculative decoding on the decoder for this request (absent: the decode worker's own). */
  speculation?: SpeculationMode;
  /** UTF-16 offsets into `prompt` where a chat template's user turns end (prefix checkpoints). */
  turnEnds?: number[];
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
  /** With `logprobs`: one per token, in order (null where no worker had its logits). */
  logprobs: (TokenLogprob | null)[] | null;
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
  /**
   * The prefill worker's newest datagram loss probe of its link to the decode worker (null:
   * none yet, or no prefill worker): what the coordinator's placement knows of that link's loss.
   */
  linkLoss: LinkLossReport | null;
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
  const r: Running = {
    req,
    handoffId,
    t0,
    wait: { deadline, idle, timeoutMs: req.timeoutMs },
    peers: new RequestPeers(node, handoffId),
    out: { tokens: [], text: "", logitsSha256: [], logprobs: [], ttftMs: null },
    fallbacks: [],
    first: null,
    outcome: null,
  };
  try {
    const source = await start(r);
    const { generation, channel } = await generateWithRecovery(r, source);
    return resultOf(r, generation, channel);
  } finally {
    idle.clear();
    // The links stay open for the next request: nothing here waits on a close.
    r.peers.close();
  }
}

/** One request while it runs: what the client has, and what happened on the way. */
interface Running {
  req: HandoffRequest;
  handoffId: string;
  t0: number;
  wait: Wait;
  peers: RequestPeers;
  out: ClientStream;
  fallbacks: FallbackRecord[];
  first: First | null;
  outcome: PrefillOutcome | null;
}

function fallback(r: Running, f: Omit<FallbackRecord, "tokensBefore">): void {
  r.fallbacks.push({ ...f, tokensBefore: r.out.tokens.length });
}

/**
 * Opens both peers (at once; a peer known dead answers at once, so it costs nothing), runs
 * the handoff when both are there and eligible, and says where generation continues.
 */
async function start(r: Running): Promise<Source> {
  const { req, peers } = r;
  const [prefill, decode] = await Promise.all([
    req.colocated ? { lost: "colocated placement requested" } : peers.open(req.prefill, "prefill"),
    peers.open(req.decode, "decode"),
  ]);
  if (prefill instanceof RequestChannel) {
    const roles = prefill.link.peerCapabilities?.roles ?? [];
    if (!roles.some((role) => roleCovers(role, "prefill"))) {
      throw new PeerError(`The peer ${prefill.nodeId} does not serve the prefill role`, {
        hint: "pass a worker started with --role prefill (or prefill+decode) as --prefill",
      });
    }
  }
  if (prefill instanceof RequestChannel && decode instanceof RequestChannel) {
    const eligible = eligibleForHandoff(
      prefill.link.peerCapabilities ?? {},
      decode.link.peerCapabilities,
      "decode",
    );
    if (!eligible.ok) {
      const reason = `decode worker not eligible for a handoff: ${eligible.reason}`;
      fallback(r, { kind: "colocated-on-decoder", reason, nodeId: decode.nodeId });
      return { channel: decode, mode: "local" };
    }
    r.outcome = await prefillAndHandOff(prefill, r, (message) => onFirstToken(r, message));
    return afterPrefill(r, r.outcome, prefill, decode);
  }
  if (decode instanceof RequestChannel) {
    // Colocated as requested is no fallback; a prefill worker that cannot be reached is.
    const reason = `the prefill worker is unreachable (${(prefill as Unreachable).lost})`;
    if (!req.colocated) {
      fallback(r, { kind: "colocated-on-decoder", reason, nodeId: decode.nodeId });
    }
    return { channel: decode, mode: "local" };
  }
  if (prefill instanceof RequestChannel) {
    const reason = `the decode worker is unreachable (${decode.lost}); ran on the prefill worker`;
    fallback(r, { kind: "colocated-on-prefill", reason, nodeId: prefill.nodeId });
    return { channel: prefill, mode: "local" };
  }
  throw new NoNodeLeftError([
    ...(req.colocated ? [] : [`prefill worker ${req.prefill.nodeId}: ${prefill.lost}`]),
    `decode worker ${req.decode.nodeId}: ${decode.lost}`,
  ]);
}

/** The prefiller's first token: to the client at once (the rest continues after it). */
function onFirstToken(r: Running, message: FirstToken): void {
  const now = performance.now();
  r.first = {
    message,
    ttftMs: now - r.t0,
    afterPrefillMs: performance.timeOrigin + now - message.prefillEndEpochMs,
  };
  r.out.tokens.push(message.token);
  r.out.text += message.text;
  if (r.req.probe && message.logitsSha256) r.out.logitsSha256.push(message.logitsSha256);
  if (r.req.logprobs !== undefined) r.out.logprobs.push(message.logprob ?? null);
  r.out.ttftMs = r.first.ttftMs;
  r.req.onTokens?.(
    [message.token],
    r.req.logprobs !== undefined ? [message.logprob ?? null] : undefined,
  );
  if (message.text) r.req.onText?.(message.text);
}

function resultOf(r: Running, generation: Generation, channel: RequestChannel): HandoffResult {
  const { req, out, fallbacks, first, outcome } = r;
  const firstTokenAfterPrefillMs = first?.afterPrefillMs ?? null;
  const ttftMs = out.ttftMs ?? NaN;
  const fallbackReason = fallbacks.length > 0
    ? fallbacks.map((f) => f.reason).join("; then ")
    : req.colocated
    ? "colocated placement requested"
    : null;
  return {
    handoffId: r.handoffId,
    placement: outcome?.outcome === "committed" ? "disaggregated" : "colocated",
    fallbackReason,
    fallbacks,
    completedBy: { nodeId: channel.nodeId, role: channel.role },
    text: out.text,
    tokens: out.tokens,
    logitsSha256: req.probe ? out.logitsSha256 : [],
    logprobs: req.logprobs !== undefined ? out.logprobs : null,
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
      ...(first ? { firstTokenDelayMs: first.message.sentAfterPrefillMs } : {}),
      ...(generation.done.decodePath ? { decodePath: generation.done.decodePath } : {}),
      fallbacks,
    },
    ttftMs,
    firstTokenAfterPrefillMs,
    e2eMs: performance.now() - r.t0,
    mtpReady: generation.done.mtpReady,
    linkLoss: outcome?.linkLoss ?? null,
  };
}

/** Where generation continues once the prefill worker has reported. */
function afterPrefill(
  r: Running,
  outcome: PrefillOutcome,
  prefill: RequestChannel,
  decode: RequestChannel,
): Source {
  if (outcome.outcome === "failed") {
    throw new HandoffAbortedError(
      outcome.reason ?? "failed",
      `Handoff failed: ${outcome.message ?? outcome.reason}`,
      { hint: "check both workers are running and trust each other; see their logs" },
    );
  }
  if (outcome.outcome === "committed") return { channel: decode, mode: "committed" };
  // A busy prefill worker (its queue full, or the wait too long) is a named colocated
  // fallback on the decode worker, never a failure.
  const reason = outcome.outcome === "busy"
    ? `prefill-busy: ${outcome.message}`
    : outcome.message ?? outcome.reason ?? "fallback";
  if (outcome.completedHere) {
    // With a first token, the prefill worker continues from its state; without one it had
    // not prefilled yet (no decode worker reachable) and runs the whole request.
    const kind = r.first ? "completed-on-prefill" : "colocated-on-prefill";
    fallback(r, { kind, reason, nodeId: prefill.nodeId });
    return { channel: prefill, mode: "running" };
  }
  fallback(r, { kind: "colocated-on-decoder", reason, nodeId: decode.nodeId });
  return { channel: decode, mode: "local" };
}

/**
 * Streams the rest of the request from `source`; when that worker is lost, resumes on the
 * next node alive (recompute of the prompt and the tokens already streamed, checked there),
 * until one completes or none is left.
 */
async function generateWithRecovery(
  r: Running,
  first: Source,
): Promise<{ generation: Generation; channel: RequestChannel }> {
  const { req, handoffId, wait, out, peers } = r;
  const candidates: [PeerAddress, WorkerRole][] = [
    [req.decode, "decode"],
    ...(req.decodeAlternates ?? []).map((a) => [a, "decode"] as [PeerAddress, WorkerRole]),
    [req.prefill, "prefill"],
  ];
  const tried: string[] = [];
  const failed = new Set<string>();
  let source = first;
  for (;;) {
    const onAbort = () =>
      source.channel.send({ type: "CancelRequest", handoffId, tenantId: req.tenantId }).catch(
        () => {},
      );
    if (wait.deadline.aborted) {
      // Cancelled before generation started: a committed session there is released now,
      // not when its committedIdleMs runs out.
      onAbort();
      throw new HandoffAbortedError("cancelled", "The request was cancelled");
    }
    wait.deadline.addEventListener("abort", onAbort, { once: true });
    try {
      if (source.mode !== "running") {
        await source.channel.sendRequest(generateRequest(req, handoffId, source.mode, out.tokens));
      }
      const generation = await readGeneration(source.channel, wait, out, r.t0, req);
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
      fallback(r, {
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
