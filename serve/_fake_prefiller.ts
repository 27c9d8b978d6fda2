/**
 * Test-only: a prefiller written by hand, speaking the wire protocol to a real decode worker
 * so a test can send what no honest prefiller would: chunks of another handoff, attempt,
 * tenant or model, replays, malformed and oversized frames. Every wait is bounded.
 */
import {
  type AbortReason,
  type BindingContext,
  type ChunkHeader,
  computeChunkTag,
  encodePositions,
  NO_LAYERS,
  payloadChecksum,
  type ReserveRequest,
  STATE_SCHEMA_VERSION,
} from "../core/mod.ts";
import {
  connectQuic,
  type HandoffSender,
  parseFingerprint,
  type PeerConnection,
  type PeerOptions,
} from "../transport/mod.ts";
import { IDLE_MS, withTimeout } from "./_failure_harness.ts";
import type { PeerAddress } from "./messages.ts";
import type { Node } from "./node.ts";

/** Connects `node` to `to` like Node.connect, with some peer options replaced. */
export async function connectWith(
  node: Node,
  to: PeerAddress,
  overrides: Partial<PeerOptions> = {},
): Promise<PeerConnection> {
  const entry = node.trust.lookup(to.nodeId);
  if (!entry?.certificateSha256) throw new Error(`no certificate pin for ${to.nodeId}`);
  return await connectQuic({
    hostname: to.host,
    port: to.port,
    serverCertificateSha256: parseFingerprint(entry.certificateSha256),
    maxIdleTimeoutMs: IDLE_MS,
    expectedServerNodeId: to.nodeId,
    ...node.peerOptions(),
    ...overrides,
  });
}

/** What a reservation came back with. */
export type Reservation =
  | { ok: true; bindingKey: Uint8Array; creditBytes: number }
  | { ok: false; reason: AbortReason };

export class FakePrefiller {
  constructor(
    readonly conn: PeerConnection,
    readonly sourceNodeId: string,
    readonly decode: { nodeId: string; identityDigest: string },
  ) {}

  /** A ReserveRequest as the real prefiller sends it, with `over` replacing fields. */
  request(handoffId: string, attempt: number, over: Partial<ReserveRequest> = {}): ReserveRequest {
    return {
      type: "ReserveRequest",
      handoffId,
      attempt,
      tenantId: "tenant-a",
      sourceNodeId: this.sourceNodeId,
      destNodeId: this.decode.nodeId,
      identityDigest: this.decode.identityDigest,
      schemaVersion: STATE_SCHEMA_VERSION,
      family: "hybrid",
      promptTokens: 8,
      stateBytesEstimate: 0,
      contextTokensNeeded: 64,
      ...over,
    };
  }

  /** Sends a reservation and waits for ReserveAccepted or AbortNotice. */
  async reserve(r: ReserveRequest): Promise<Reservation> {
    await this.conn.send({ ...r } as unknown as Record<string, unknown>);
    const h = await this.next(r.handoffId, r.attempt, ["ReserveAccepted", "AbortNotice"]);
    if (h.type === "AbortNotice") return { ok: false, reason: h.reason as AbortReason };
    return {
      ok: true,
      bindingKey: h.bindingKey as Uint8Array,
      creditBytes: Number(h.creditBytes),
    };
  }

  /** The binding context a chunk for reservation `r` is tagged with. */
  binding(r: ReserveRequest, bindingKey: Uint8Array): BindingContext {
    return { bindingKey, handoffId: r.handoffId, destNodeId: r.destNodeId, tenantId: r.tenantId };
  }

  openStream(handoffId: string, attempt: number): Promise<HandoffSender> {
    return this.conn.openHandoffStream({ handoffId, attempt });
  }

  /** Sends one StateChunk frame; `frame` replaces the frame's own fields. */
  async sendChunk(
    stream: HandoffSender,
    chunk: { header: ChunkHeader; payload: Uint8Array },
    binding: BindingContext,
    frame: { handoffId?: string; attempt?: number } = {},
  ): Promise<void> {
    const tag = await computeChunkTag(binding, chunk.header);
    await stream.send({
      type: "StateChunk",
      handoffId: chunk.header.handoffId,
      attempt: 0,
      ...frame,
      header: chunk.header,
      tag,
    } as unknown as Record<string, unknown>, chunk.payload);
  }

  /** The next control message of `types` for this handoff attempt, within `ms`. */
  async next(
    handoffId: string,
    attempt: number,
    types: string[],
    ms = 5_000,
  ): Promise<Record<string, unknown>> {
    const deadline = performance.now() + ms;
    for (;;) {
      const left = deadline - performance.now();
      const msg = await withTimeout(this.conn.receive(), Math.max(1, left), types.join(" or "));
      if (msg === null) throw new Error("the decode worker closed the connection");
      const h = msg.header as Record<string, unknown>;
      if (h.handoffId === handoffId && h.attempt === attempt && types.includes(String(h.type))) {
        return h;
      }
    }
  }

  /** The reason of the next AbortNotice for this attempt, within `ms`. */
  async abortReason(handoffId: string, attempt: number, ms = 5_000): Promise<string> {
    return String((await this.next(handoffId, attempt, ["AbortNotice"], ms)).reason);
  }
}

/** A valid `positions` chunk (seq 0) of a handoff of `promptTokens` tokens. */
export function positionsChunk(
  handoffId: string,
  identityDigest: string,
  promptTokens = 8,
  seq = 0,
): { header: ChunkHeader; payload: Uint8Array } {
  const payload = encodePositions({ nPast: promptTokens, seqId: 0, nPosPerToken: 1 });
  const header: ChunkHeader = {
    handoffId,
    identityDigest,
    schemaVersion: STATE_SCHEMA_VERSION,
    kind: "positions",
    layerRange: NO_LAYERS,
    tokenRange: [0, promptTokens],
    codec: "msgpack",
    dtype: "none",
    positionConfig: { seqId: 0, nPosPerToken: 1 },
    payloadBytes: payload.byteLength,
    checksum: payloadChecksum(payload),
    seq,
    final: false,
  };
  return { header, payload };
}
