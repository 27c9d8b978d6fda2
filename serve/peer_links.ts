/**
 * PeerLinks: a coordinator's one authenticated connection per peer, reused by every request,
 * and what it knows of each peer's health. A request asks for a peer's link; it gets the live
 * one, or a fresh one (connect + authenticate, bounded by `connectTimeoutMs`), or at once a
 * PeerDeadError saying since when and why the peer is known dead, so a dead peer costs a
 * request nothing once it is known dead. A dead peer is tried again on the next use after a
 * backoff that doubles per consecutive failure, from `reconnectBackoffMs` up to
 * `reconnectBackoffMsMax`.
 *
 * Requests share the link's control stream: one reader moves each message to the mailbox of
 * the request it names (`handoffId`), so concurrent requests never read each other's
 * messages. When the connection ends, every mailbox fails with the reason, and the peer is
 * marked dead; a dead connection is closed without waiting for its close timeout.
 */
import { BoundedQueue, PeerError } from "../core/mod.ts";
import type { Capabilities, PeerConnection } from "../transport/mod.ts";
import type { PeerAddress } from "./messages.ts";
import { within } from "./_deadline.ts";

/** Bounds of the links, each named with its unit. */
export interface PeerLinkOptions {
  /** A connect (QUIC handshake plus authentication) that takes longer fails: the peer is dead. */
  connectTimeoutMs: number;
  /** A peer found dead is skipped this long before the next use tries it again. */
  reconnectBackoffMs: number;
  /** The backoff doubles per consecutive failure, up to this. */
  reconnectBackoffMsMax: number;
  /** Messages buffered per request before the link's reader waits for that request. */
  requestQueueMessagesMax: number;
}

export const DEFAULT_PEER_LINKS: Readonly<PeerLinkOptions> = {
  connectTimeoutMs: 2_000,
  reconnectBackoffMs: 500,
  reconnectBackoffMsMax: 10_000,
  requestQueueMessagesMax: 1024,
};

/** What this node knows of one peer (no content). */
export interface PeerHealth {
  nodeId: string;
  /** `host:port`. */
  address: string;
  /** `unknown`: never connected. */
  state: "alive" | "dead" | "unknown";
  /** Wall clock (ms since the epoch) of the last change of state; null while unknown. */
  sinceEpochMs: number | null;
  /** Why it is dead (one line), or null. */
  reason: string | null;
  /** Consecutive failures (connects or connections lost) since it was last alive. */
  failures: number;
  /** While dead: how long until the next use tries it again (0: now). */
  retryInMs: number;
}

/** The peer is known dead: the request did not wait for it. */
export class PeerDeadError extends PeerError {
  constructor(readonly health: PeerHealth) {
    super(
      `The peer ${health.nodeId} at ${health.address} is dead since ${
        new Date(health.sinceEpochMs ?? 0).toISOString()
      } (${health.reason}); next try in ${Math.ceil(health.retryInMs)} ms`,
      { hint: "restart that worker, or wait: it is tried again after the backoff" },
    );
  }
}

interface Entry {
  health: PeerHealth;
  /** When (performance.now()) the next use may try again. */
  retryAt: number;
  link: PeerLink | null;
  connecting: Promise<PeerLink> | null;
}

export class PeerLinks {
  readonly #entries = new Map<string, Entry>();
  #closed = false;

  constructor(
    readonly connect: (to: PeerAddress) => Promise<PeerConnection>,
    readonly options: PeerLinkOptions = DEFAULT_PEER_LINKS,
  ) {}

  /**
   * The live link to `to`, connecting if there is none. Throws PeerDeadError at once while the
   * peer is in its backoff, PeerError when the connect fails (the peer is then marked dead),
   * and whatever `connect` throws for a configuration error (an untrusted peer, unmarked).
   */
  async get(to: PeerAddress): Promise<PeerLink> {
    if (this.#closed) throw new PeerError("The node is closing: no new connections");
    const entry = this.#entry(to);
    if (entry.link && !entry.link.lost.aborted) return entry.link;
    if (entry.connecting) return await entry.connecting;
    const now = performance.now();
    if (entry.health.state === "dead" && now < entry.retryAt) {
      throw new PeerDeadError({ ...entry.health, retryInMs: entry.retryAt - now });
    }
    entry.connecting = this.#open(to, entry);
    try {
      return await entry.connecting;
    } finally {
      entry.connecting = null;
    }
  }

  /**
   * A fresh link to `to` after `stale` failed a request (a handoff stream or a send broke):
   * `stale` is dropped if it is still the current link (a connection that failed once is not
   * trusted again), and a connect is tried now, whatever the backoff says, because the caller
   * retries one request once and bounds that itself. Concurrent callers share one connect.
   */
  async reconnect(to: PeerAddress, stale: PeerLink | null): Promise<PeerLink> {
    if (this.#closed) throw new PeerError("The node is closing: no new connections");
    const entry = this.#entry(to);
    if (stale !== null && entry.link === stale) this.markDead(to, "a request on it failed");
    if (entry.link && !entry.link.lost.aborted) return entry.link;
    if (entry.connecting) return await entry.connecting;
    entry.connecting = this.#open(to, entry);
    try {
      return await entry.connecting;
    } finally {
      entry.connecting = null;
    }
  }

  /**
   * Replaces the live links to the peer `nodeId` (its congestion controller changed): the next
   * request connects afresh, and the requests on the old link finish there; it closes once the
   * last of them ends. The peer's health is unchanged.
   */
  retire(nodeId: string): void {
    for (const entry of this.#entries.values()) {
      if (entry.health.nodeId !== nodeId || !entry.link) continue;
      const old = entry.link;
      entry.link = null;
      old.closeWhenIdle();
    }
  }

  /** Drops every link without waiting (tests: the next request connects afresh). */
  dropAll(reason: string): void {
    for (const entry of this.#entries.values()) {
      const link = entry.link;
      entry.link = null;
      link?.drop(reason);
    }
    this.#entries.clear();
  }

  /** Health of one peer (unknown if never used). */
  health(to: PeerAddress): PeerHealth {
    const entry = this.#entry(to);
    const retryInMs = Math.max(0, entry.retryAt - performance.now());
    return { ...entry.health, retryInMs: entry.health.state === "dead" ? retryInMs : 0 };
  }

  /** Health of every peer used so far. */
  all(): PeerHealth[] {
    return [...this.#entries.values()].map((e) => this.health(addressOf(e.health)));
  }

  /**
   * Marks `to` dead now (a request saw it fail in a way the connection has not noticed yet,
   * e.g. a request that got no answer); its link is dropped without waiting.
   */
  markDead(to: PeerAddress, reason: string): void {
    const entry = this.#entry(to);
    const link = entry.link;
    entry.link = null;
    if (link) link.drop(reason);
    this.#dead(entry, reason);
  }

  /**
   * Forgets what is known of `to` (an operator restarted it, or the peers file changed): the
   * next use connects at once instead of waiting out a backoff.
   */
  forget(to: PeerAddress): void {
    const entry = this.#entry(to);
    entry.link?.drop("forgotten");
    this.#entries.delete(`${to.nodeId}@${to.host}:${to.port}`);
  }

  /** Closes every live link gracefully (each bounded by its close timeout), in parallel. */
  async close(): Promise<void> {
    this.#closed = true;
    const links = [...this.#entries.values()].map((e) => e.link).filter((l) => l !== null);
    for (const e of this.#entries.values()) e.link = null;
    await Promise.allSettled(links.map((l) => l!.close()));
  }

  async #open(to: PeerAddress, entry: Entry): Promise<PeerLink> {
    const ms = this.options.connectTimeoutMs;
    const connecting = this.connect(to);
    let conn: PeerConnection;
    try {
      conn = await within(connecting, ms, () => {
        connecting.then((late) => late.close(), () => {}).catch(() => {});
        return new PeerError(
          `Cannot connect to ${to.nodeId} at ${to.host}:${to.port}: no authenticated connection within connectTimeoutMs (${ms} ms)`,
        );
      });
    } catch (error) {
      // Not in the trust list, or no pin: a configuration error, not a dead peer.
      if (error instanceof PeerError && /trust list|certificate pin/.test(error.message)) {
        throw error;
      }
      // Anything else (refused, timed out, a handshake broken off) leaves the peer unusable.
      const lost = error instanceof PeerError ? error : new PeerError(
        `Cannot connect to ${to.nodeId} at ${to.host}:${to.port}: ${(error as Error)?.message}`,
        { cause: error },
      );
      this.#dead(entry, lost.message);
      throw lost;
    }
    const link = new PeerLink(conn, this.options.requestQueueMessagesMax, (reason) => {
      if (entry.link !== link) return;
      entry.link = null;
      this.#dead(entry, reason);
    });
    if (this.#closed) {
      await conn.close().catch(() => {});
      throw new PeerError("The node is closing: no new connections");
    }
    entry.link = link;
    entry.health = {
      ...entry.health,
      state: "alive",
      sinceEpochMs: Date.now(),
      reason: null,
      failures: 0,
    };
    return link;
  }

  #dead(entry: Entry, reason: string): void {
    const h = entry.health;
    const failures = h.failures + 1;
    const { reconnectBackoffMs: base, reconnectBackoffMsMax: max } = this.options;
    entry.retryAt = performance.now() + Math.min(max, base * 2 ** Math.min(30, failures - 1));
    const since = h.state === "dead" ? h.sinceEpochMs : Date.now();
    entry.health = { ...h, state: "dead", sinceEpochMs: since, reason, failures };
  }

  #entry(to: PeerAddress): Entry {
    const address = `${to.host}:${to.port}`;
    const key = `${to.nodeId}@${address}`;
    let entry = this.#entries.get(key);
    if (!entry) {
      entry = {
        health: {
          nodeId: to.nodeId,
          address,
          state: "unknown",
          sinceEpochMs: null,
          reason: null,
          failures: 0,
          retryInMs: 0,
        },
        retryAt: 0,
        link: null,
        connecting: null,
      };
      this.#entries.set(key, entry);
    }
    return entry;
  }
}

function addressOf(h: PeerHealth): PeerAddress {
  const cut = h.address.lastIndexOf(":");
  return {
    nodeId: h.nodeId,
    host: h.address.slice(0, cut),
    port: Number(h.address.slice(cut + 1)),
  };
}

/** A control message for one request: its header, and its payload (often empty). */
export interface LinkMessage {
  header: Record<string, unknown>;
  payload: Uint8Array;
}

/** One request's messages on a link; `next()` rejects with PeerError once the link is lost. */
export interface Mailbox {
  next(): Promise<LinkMessage>;
}

/** One authenticated connection shared by requests; each reads its own mailbox. */
export class PeerLink {
  readonly #mailboxes = new Map<string, BoundedQueue<LinkMessage>>();
  readonly #lost = new AbortController();
  #closeWhenIdle = false;

  constructor(
    readonly conn: PeerConnection,
    readonly queueMessagesMax: number,
    readonly onLost: (reason: string) => void,
  ) {
    this.#pump();
  }

  get peerNodeId(): string {
    return this.conn.peerNodeId;
  }

  get peerCapabilities(): Capabilities {
    return this.conn.peerCapabilities;
  }

  /** Aborted (reason: a one-line string) once the connection has ended. */
  get lost(): AbortSignal {
    return this.#lost.signal;
  }

  /**
   * The mailbox of request `id`: messages naming it, from now on. Call `unsubscribe(id)` when
   * the request ends. One subscriber per id.
   */
  subscribe(id: string): Mailbox {
    if (this.#lost.signal.aborted) throw this.#lostError();
    if (this.#mailboxes.has(id)) {
      throw new PeerError(`Request ${id} is already running on this link`);
    }
    const box = new BoundedQueue<LinkMessage>(this.queueMessagesMax);
    this.#mailboxes.set(id, box);
    return {
      next: async () => {
        // Messages that arrived before the connection ended are still delivered, in order.
        const message = await box.shift();
        if (message === undefined) throw this.#lostError();
        return message;
      },
    };
  }

  unsubscribe(id: string): void {
    this.#mailboxes.get(id)?.close();
    this.#mailboxes.delete(id);
    if (this.#closeWhenIdle && this.#mailboxes.size === 0) this.close();
  }

  /** Replaced by a fresh link (`PeerLinks.retire`): it closes once no request runs on it. */
  get retired(): boolean {
    return this.#closeWhenIdle;
  }

  /** Closes gracefully once no request runs on the link (now, if none does). */
  closeWhenIdle(): void {
    this.#closeWhenIdle = true;
    if (this.#mailboxes.size === 0) this.close();
  }

  async send(header: Record<string, unknown>, payload?: Uint8Array): Promise<void> {
    if (this.#lost.signal.aborted) throw this.#lostError();
    await this.conn.send(header, payload);
  }

  /** Closes gracefully (bounded by the connection's close timeout). */
  async close(): Promise<void> {
    this.#end("closed by this node");
    await this.conn.close().catch(() => {});
  }

  /** Drops a connection believed dead: closed without waiting for an answer. */
  drop(reason: string): void {
    this.#end(reason);
    this.conn.close().catch(() => {});
  }

  async #pump(): Promise<void> {
    let reason = `the peer ${this.peerNodeId} closed the connection`;
    try {
      for (;;) {
        const msg = await this.conn.receive();
        if (msg === null) break;
        const header = msg.header as Record<string, unknown>;
        const box = this.#mailboxes.get(String(header.handoffId ?? header.requestId ?? ""));
        // Nobody waits for it (a request that ended, a late Progress): dropped.
        if (box) await box.push({ header, payload: msg.payload });
      }
    } catch (error) {
      reason = (error as Error).message;
    }
    this.#end(reason);
  }

  #end(reason: string): void {
    if (this.#lost.signal.aborted) return;
    this.#lost.abort(reason);
    for (const box of this.#mailboxes.values()) box.close();
    this.onLost(reason);
  }

  #lostError(): PeerError {
    if (!this.#lost.signal.aborted) return new PeerError("The request ended");
    return new PeerError(
      `The connection to the worker ${this.peerNodeId} was lost: ${
        String(this.#lost.signal.reason)
      }`,
      { hint: "it may have stopped or crashed; see its log" },
    );
  }
}
