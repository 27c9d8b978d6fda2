/**
 * One coordinator request's view of its peers: a channel per peer (the shared link and this
 * request's mailbox on it), sends with the prompt and sent tokens in the payload, and receives
 * bounded by the request's idle timeout. A peer found dead is reported to the node's links,
 * which then skip it for every request until its backoff has passed.
 */
import {
  HandoffAbortedError,
  LimitExceededError,
  PeerError,
  WorkerBusyError,
} from "../core/mod.ts";
import type { DecoderTelemetrySummary } from "../core/telemetry.ts";
import type { TokenLogprob } from "../core/logprobs.ts";
import {
  encodeRequestPayload,
  type GenerateDone,
  type GenerateRequest,
  parseMessage,
  type PeerAddress,
  type PrefillRequest,
  type TokenBatch,
} from "./messages.ts";
import type { Node } from "./node.ts";
import { type Mailbox, type PeerLink } from "./peer_links.ts";
import type { IdleTimeout } from "./_idle_timeout.ts";

/** What every wait of one request shares: its cancel/idle signal and the idle timer. */
export interface Wait {
  deadline: AbortSignal;
  idle: IdleTimeout;
  timeoutMs: number;
}

export type WorkerRole = "prefill" | "decode";

/** One request on one peer's link. */
export class RequestChannel {
  readonly #mailbox: Mailbox;

  constructor(
    readonly link: PeerLink,
    readonly address: PeerAddress,
    readonly role: WorkerRole,
    readonly handoffId: string,
  ) {
    this.#mailbox = link.subscribe(handoffId);
  }

  get nodeId(): string {
    return this.address.nodeId;
  }

  /** Sends a request; its prompt and sent tokens travel as the frame's payload. */
  async sendRequest(request: PrefillRequest | GenerateRequest): Promise<void> {
    const { header, payload } = encodeRequestPayload(request);
    await this.link.send(header, payload);
  }

  async send(header: Record<string, unknown>): Promise<void> {
    await this.link.send(header);
  }

  /**
   * The next message for this request, bounded by the request's idle timeout, which every
   * message pushes back. Rejects with PeerError once the link is lost.
   */
  async receive(wait: Wait): Promise<Record<string, unknown>> {
    const { deadline } = wait;
    let fail: () => void = () => {};
    const aborted = new Promise<never>((_, reject) => {
      fail = () =>
        reject(
          deadline.reason instanceof DOMException && deadline.reason.name === "TimeoutError"
            ? new LimitExceededError(
              `The request made no progress for ${wait.timeoutMs} ms: no message from the worker ${this.nodeId}`,
              { hint: "check the workers' logs, or raise --timeout-ms" },
            )
            : new HandoffAbortedError("cancelled", "The request was cancelled"),
        );
      if (deadline.aborted) fail();
      deadline.addEventListener("abort", fail, { once: true });
    });
    try {
      const { header } = await Promise.race([this.#mailbox.next(), aborted]);
      wait.idle.touch();
      return header;
    } finally {
      deadline.removeEventListener("abort", fail);
    }
  }

  close(): void {
    this.link.unsubscribe(this.handoffId);
  }
}

/** A peer this request could not use, and why (one line, no content). */
export interface Unreachable {
  lost: string;
}

/** The request's channels, opened once per peer and closed together when it ends. */
export class RequestPeers {
  /** Per peer: its channel (or the open in progress); one mailbox per peer and request. */
  readonly #channels = new Map<string, Promise<RequestChannel | Unreachable>>();
  readonly #opened: RequestChannel[] = [];

  constructor(readonly node: Node, readonly handoffId: string) {}

  /**
   * The channel to `to`, or why it cannot be used: known dead (at once), or the connect
   * failed. A peer missing from the trust list is a configuration error and throws. One peer
   * serving both roles (prefill+decode) gets one channel.
   */
  async open(to: PeerAddress, role: WorkerRole): Promise<RequestChannel | Unreachable> {
    const key = keyOf(to);
    const open = await this.#channels.get(key)?.catch(() => null);
    if (open instanceof RequestChannel && !open.link.lost.aborted) return open;
    const opening = this.#open(to, role);
    this.#channels.set(key, opening);
    return await opening;
  }

  async #open(to: PeerAddress, role: WorkerRole): Promise<RequestChannel | Unreachable> {
    try {
      const link = await this.node.links.get(to);
      const channel = new RequestChannel(link, to, role, this.handoffId);
      this.#opened.push(channel);
      return channel;
    } catch (error) {
      const trusted = this.node.trust.lookup(to.nodeId)?.certificateSha256;
      if (!(error instanceof PeerError) || !trusted) throw error;
      return { lost: error.message };
    }
  }

  /** The channel's peer failed this request: every request skips it until its backoff ends. */
  markDead(channel: RequestChannel, reason: string): void {
    if (!channel.link.lost.aborted) this.node.links.markDead(channel.address, reason);
  }

  /** Leaves every mailbox; the links stay open for the next request. */
  close(): void {
    for (const channel of this.#opened) channel.close();
    this.#opened.length = 0;
    this.#channels.clear();
  }
}

function keyOf(to: PeerAddress): string {
  return `${to.nodeId}@${to.host}:${to.port}`;
}

/** What the client has received so far, whichever worker it came from. */
export interface ClientStream {
  tokens: number[];
  text: string;
  logitsSha256: string[];
  /** With `logprobs`: one per token (null where the worker had no logits for it). */
  logprobs: (TokenLogprob | null)[];
  /** Coordinator's clock, request start to the first token received; null before it. */
  ttftMs: number | null;
}

export interface Generation {
  done: GenerateDone & { telemetry: DecoderTelemetrySummary | null };
}

/**
 * Reads TokenBatch messages into `out` (calling `onTokens` and `onText` with each batch) until GenerateDone.
 * Throws HandoffAbortedError when the worker reports a failure, PeerError when it is lost.
 */
export async function readGeneration(
  channel: RequestChannel,
  wait: Wait,
  out: ClientStream,
  t0: number,
  on: {
    onText?: (text: string) => void;
    onTokens?: (tokens: number[], logprobs?: (TokenLogprob | null)[]) => void;
  },
): Promise<Generation> {
  for (;;) {
    const header = await channel.receive(wait);
    if (header.type === "TokenBatch") {
      const batch = parseMessage<TokenBatch>(header);
      if (out.ttftMs === null && batch.tokens.length > 0) out.ttftMs = performance.now() - t0;
      out.tokens.push(...batch.tokens);
      out.text += batch.text;
      out.logitsSha256.push(...(batch.logitsSha256 ?? []));
      if (batch.logprobs) out.logprobs.push(...batch.logprobs);
      if (batch.tokens.length > 0) on.onTokens?.(batch.tokens, batch.logprobs);
      if (batch.text) on.onText?.(batch.text);
      continue;
    }
    if (header.type === "GenerateDone") {
      const done = parseMessage<GenerateDone>(header);
      if (!done.ok && done.busy) {
        throw new WorkerBusyError(`The ${channel.role} worker is busy: ${done.message}`, {
          hint: "retry later, or add decode workers",
        });
      }
      if (!done.ok) {
        throw new HandoffAbortedError("decode-failed", `Generation failed: ${done.message}`);
      }
      return { done };
    }
  }
}
