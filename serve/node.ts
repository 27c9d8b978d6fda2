/**
 * A node: its Ed25519 identity, TLS certificate and trust list from the state folder, and the
 * two ways it meets peers (listen, connect by node id with the certificate pin from the trust
 * list). Workers and the coordinator both start here.
 */
import {
  type CongestionControl,
  type CongestionControlMode,
  PeerError,
  startingController,
} from "../core/mod.ts";
import {
  type Capabilities,
  connectQuic,
  listenQuic,
  loadOrCreateNodeIdentity,
  loadOrCreateTlsCertificate,
  type NodeIdentity,
  parseFingerprint,
  type PeerConnection,
  type PeerListener,
  type PeerOptions,
  type RawConnection,
  resolveStateDir,
  type TlsCertificate,
  TrustList,
} from "../transport/mod.ts";
import { CONTROL_FRAME_LIMITS, type PeerAddress } from "./messages.ts";
import { DEFAULT_PEER_LINKS, type PeerLinkOptions, PeerLinks } from "./peer_links.ts";
import { DEFAULT_BBR_LOSS_FRACTION_MIN } from "./congestion_choice.ts";

/** Transport bounds a node applies to every peer, each a named option with its unit. */
export interface NodeLinkOptions {
  /** A peer silent this long is declared dead. */
  maxIdleTimeoutMs: number;
  handshakeTimeoutMs: number;
  /** Bytes a handoff stream may have in flight (credit window). */
  inflightBytesMax: number;
  /**
   * The controller this node sends with: "cubic" (best on clean fast links), "bbr" (holds its
   * rate under random loss), or "auto": Cubic, and BBR on a prefill worker's link to a decode
   * worker whose loss probe found loss (serve/congestion_choice.ts). A prefill worker announces
   * it; placement predicts a lossy link's rate by it.
   */
  congestionControl: CongestionControlMode;
  /** `auto`: the loss fraction (loss events over probe datagrams) from which a link goes BBR. */
  bbrLossFractionMin: number;
  /** The coordinator's shared links to its peers: connect bound and reconnect backoff. */
  peerLinks: PeerLinkOptions;
}

/** NodeLinkOptions as callers pass them: any field may be left out. */
export type NodeLinkOverrides = Partial<Omit<NodeLinkOptions, "peerLinks">> & {
  peerLinks?: Partial<PeerLinkOptions>;
};

export const DEFAULT_NODE_LINK: Readonly<NodeLinkOptions> = {
  maxIdleTimeoutMs: 2_000,
  handshakeTimeoutMs: 5_000,
  inflightBytesMax: 64 * 1024 * 1024,
  congestionControl: "auto",
  bbrLossFractionMin: DEFAULT_BBR_LOSS_FRACTION_MIN,
  peerLinks: DEFAULT_PEER_LINKS,
};

/**
 * Test hooks: wrap each raw connection before authentication (fault injection with
 * `withFaults`, taps). `index` counts this node's outgoing (or accepted) connections from 0.
 * Nothing in the product sets them.
 */
export interface NodeFaults {
  connect?: (raw: RawConnection, index: number) => RawConnection;
  accept?: (raw: RawConnection, index: number) => RawConnection;
}

export class Node {
  #connects = 0;
  #accepts = 0;
  #links: PeerLinks | null = null;

  private constructor(
    readonly stateDir: string,
    readonly identity: NodeIdentity,
    readonly certificate: TlsCertificate,
    readonly trust: TrustList,
    readonly link: NodeLinkOptions,
    readonly faults: NodeFaults,
  ) {}

  /** Loads (or creates on first start) the node in `stateDir` (default: per-user folder). */
  static async open(
    stateDir?: string,
    link: NodeLinkOverrides = {},
    hostnames: string[] = [],
    faults: NodeFaults = {},
  ): Promise<Node> {
    const dir = resolveStateDir(stateDir);
    const { identity } = await loadOrCreateNodeIdentity(dir);
    const { certificate } = await loadOrCreateTlsCertificate(dir, { hostnames });
    const trust = await TrustList.load(dir);
    const options = {
      ...DEFAULT_NODE_LINK,
      ...link,
      peerLinks: { ...DEFAULT_PEER_LINKS, ...link.peerLinks },
    };
    return new Node(dir, identity, certificate, trust, options, faults);
  }

  /**
   * This node's one authenticated connection per peer, shared by its requests (the
   * coordinator's), with each peer's health. Created on first use; `close()` ends it.
   */
  get links(): PeerLinks {
    this.#links ??= new PeerLinks((to) => this.connect(to), this.link.peerLinks);
    return this.#links;
  }

  /** Closes the shared links (each bounded by its close timeout). */
  async close(): Promise<void> {
    const links = this.#links;
    this.#links = null;
    await links?.close();
  }

  peerOptions(capabilities?: Capabilities): PeerOptions {
    return {
      identity: this.identity,
      trust: this.trust,
      capabilities,
      handshakeTimeoutMs: this.link.handshakeTimeoutMs,
      controlFrameLimits: CONTROL_FRAME_LIMITS,
      handoff: { inflightBytesMax: this.link.inflightBytesMax },
    };
  }

  listen(hostname: string, port: number, capabilities?: Capabilities): PeerListener {
    return listenQuic({
      hostname,
      port,
      certificate: this.certificate,
      maxIdleTimeoutMs: this.link.maxIdleTimeoutMs,
      congestionControl: startingController(this.link.congestionControl),
      ...this.peerOptions(capabilities),
      wrapRaw: this.faults.accept && ((raw) => this.faults.accept!(raw, this.#accepts++)),
    });
  }

  /**
   * Connects to a trusted peer; its certificate is pinned from the trust list. `sendWith`: the
   * controller for this connection (default: the node's, Cubic under `auto`).
   */
  async connect(
    to: PeerAddress,
    capabilities?: Capabilities,
    sendWith?: CongestionControl,
  ): Promise<PeerConnection> {
    const entry = this.trust.lookup(to.nodeId);
    if (!entry) {
      throw new PeerError(`Peer "${to.nodeId}" at ${to.host}:${to.port} is not in the trust list`, {
        hint:
          `add it with \`skippy-disagg trust add <its identity card> --state-dir ${this.stateDir}\``,
      });
    }
    if (!entry.certificateSha256) {
      throw new PeerError(`No certificate pin for peer "${to.nodeId}": cannot connect to it`, {
        hint: "re-add it from its `skippy-disagg identity show --json` card, which has the pin",
      });
    }
    return await connectQuic({
      hostname: to.host,
      port: to.port,
      serverCertificateSha256: parseFingerprint(entry.certificateSha256),
      maxIdleTimeoutMs: this.link.maxIdleTimeoutMs,
      congestionControl: sendWith ?? startingController(this.link.congestionControl),
      expectedServerNodeId: to.nodeId,
      ...this.peerOptions(capabilities),
      wrapRaw: this.faults.connect && ((raw) => this.faults.connect!(raw, this.#connects++)),
    });
  }
}

/** Parses `host:port` (IPv6 as `[::1]:port`). */
export function parseHostPort(text: string): { host: string; port: number } | null {
  const m = /^(?:\[([^\]]+)\]|([^:\s]+)):(\d{1,5})$/.exec(text.trim());
  if (!m) return null;
  const port = Number(m[3]);
  if (port < 0 || port > 65535) return null;
  return { host: m[1] ?? m[2], port };
}
