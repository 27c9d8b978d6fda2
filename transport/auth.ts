/**
 * Mutual node authentication on the control stream, at the application level: Deno's QUIC
 * has no client certificates, so TLS only authenticates the server's certificate (pinned by
 * hash) and this exchange proves both node keys.
 *
 * Wire exchange (frames on the first bidirectional stream, which the client opens):
 *
 *   client -> server  ClientHello      { protocol, nonce(32), publicKey(32), pinnedCertificateSha256(32) }
 *   server -> client  ServerChallenge  { nonce(32), publicKey(32), signature(64) }
 *   client -> server  ClientProof      { signature(64) }
 *   server -> client  AuthAccepted     {}
 *   either way        AuthRefused      { reason, message }   (final frame; then the connection closes)
 *
 * The server signs ("skippy-disagg/1 server proof", client nonce, server nonce, certificate
 * hash, server node id, client node id); the client signs the same with its own label and the
 * nonces swapped. Fresh nonces on both sides stop replay, distinct labels stop reflection, and
 * the certificate hash binds both proofs to the TLS session the client pinned, so a relay
 * that terminates TLS with a different certificate cannot forward them. Each side then checks
 * the other's full public key against its trust list.
 */
import { PeerError, ProtocolError } from "../core/errors.ts";
import { bytesEqual } from "./_encoding.ts";
import type { FrameHeader } from "./frame.ts";
import type { FrameReader, FrameWriter } from "./framed_stream.ts";
import {
  formatPublicKey,
  type NodeIdentity,
  nodeIdOf,
  signAsNode,
  verifyNodeSignature,
} from "./node_identity.ts";
import type { TrustList } from "./trust.ts";
import { formatFingerprint } from "./tls.ts";

/** The protocol label in ALPN, in ClientHello and in every signed transcript. */
export const PROTOCOL_LABEL = "skippy-disagg/1";
const NONCE_BYTES = 32;

/** What each side knows going into the exchange. */
export interface AuthContext {
  identity: NodeIdentity;
  trust: TrustList;
  /** Client: the pinned hash; server: the hash of its own certificate. */
  serverCertificateSha256: Uint8Array;
  /** The peer's address, for messages. */
  remoteAddress: string;
}

/** The authenticated peer. */
export interface AuthenticatedPeer {
  nodeId: string;
  publicKey: Uint8Array;
  label?: string;
}

/** Reasons carried by AuthRefused. */
export type AuthRefusal = "untrusted" | "bad-signature" | "certificate-mismatch" | "protocol";

interface Channel {
  /** Only `read()` is used, so establish.ts can put a per-step deadline in front of it. */
  reader: Pick<FrameReader, "read">;
  writer: FrameWriter;
}

/** Builds the signed transcript: the label, then each field with a 2-byte length. */
function _transcript(label: string, fields: (Uint8Array | string)[]): Uint8Array {
  const parts = [label, ...fields].map((f) =>
    typeof f === "string" ? new TextEncoder().encode(f) : f
  );
  const out = new Uint8Array(parts.reduce((n, p) => n + 2 + p.length, 0));
  let at = 0;
  for (const part of parts) {
    out[at] = part.length >>> 8;
    out[at + 1] = part.length & 0xff;
    out.set(part, at + 2);
    at += 2 + part.length;
  }
  return out;
}

/** Reads the next frame and checks its type; AuthRefused becomes a PeerError. */
async function _expect(channel: Channel, type: string, ctx: AuthContext): Promise<FrameHeader> {
  const frame = await channel.reader.read();
  if (frame === null) {
    throw new ProtocolError(
      `Peer at ${ctx.remoteAddress} ended the control stream during authentication`,
    );
  }
  const header = frame.header;
  if (header.type === "AuthRefused") {
    const reason = typeof header.reason === "string" ? header.reason : "unknown";
    throw new PeerError(
      `Peer at ${ctx.remoteAddress} refused this node (${ctx.identity.nodeId}): ${
        String(header.message ?? reason).slice(0, 200)
      }`,
      {
        hint: reason === "untrusted"
          ? `on that peer, run: skippy-disagg trust add ${ctx.identity.publicKeyText}`
          : "check that both peers run the same skippy-disagg version and pin the right certificate",
      },
    );
  }
  if (header.type !== type) {
    throw new ProtocolError(
      `Peer at ${ctx.remoteAddress} sent "${
        String(header.type)
      }" during authentication (expected "${type}")`,
    );
  }
  return header;
}

function _bytes(header: FrameHeader, field: string, length: number, ctx: AuthContext): Uint8Array {
  const value = header[field];
  if (!(value instanceof Uint8Array) || value.length !== length) {
    throw new ProtocolError(
      `Peer at ${ctx.remoteAddress} sent ${String(header.type)} with a malformed "${field}"`,
    );
  }
  return value;
}

const _refusalsSent = new WeakSet<object>();

/**
 * Whether `error` came with an AuthRefused sent to the peer: the caller should then give the
 * peer a moment to read it before closing the connection (a close can drop unread frames).
 */
export function refusalWasSent(error: unknown): boolean {
  return typeof error === "object" && error !== null && _refusalsSent.has(error);
}

/** Sends AuthRefused (best effort) and returns the error to throw locally. */
async function _refuse(
  channel: Channel,
  reason: AuthRefusal,
  message: string,
  error: Error,
): Promise<Error> {
  await channel.writer.write({ type: "AuthRefused", reason, message }, undefined, { final: true })
    .catch(() => {});
  _refusalsSent.add(error);
  return error;
}

async function _checkTrusted(
  channel: Channel,
  ctx: AuthContext,
  publicKey: Uint8Array,
  nodeId: string,
): Promise<AuthenticatedPeer> {
  const entry = await ctx.trust.lookupKey(publicKey);
  if (entry) return { nodeId, publicKey, label: entry.label };
  throw await _refuse(
    channel,
    "untrusted",
    `node ${ctx.identity.nodeId} does not trust node ${nodeId}`,
    new PeerError(
      `Refused peer ${nodeId} at ${ctx.remoteAddress}: its node key is not in the trust list`,
      {
        hint: `if you trust it, run: skippy-disagg trust add ${formatPublicKey(publicKey)}`,
      },
    ),
  );
}

/** Client side of the exchange. Throws PeerError (refused/untrusted) or ProtocolError. */
export async function authenticateAsClient(
  channel: Channel,
  ctx: AuthContext,
  options: { expectedServerNodeId?: string } = {},
): Promise<AuthenticatedPeer> {
  const clientNonce = crypto.getRandomValues(new Uint8Array(NONCE_BYTES));
  await channel.writer.write({
    type: "ClientHello",
    protocol: PROTOCOL_LABEL,
    nonce: clientNonce,
    publicKey: ctx.identity.publicKey,
    pinnedCertificateSha256: ctx.serverCertificateSha256,
  });
  const challenge = await _expect(channel, "ServerChallenge", ctx);
  const serverNonce = _bytes(challenge, "nonce", NONCE_BYTES, ctx);
  const serverKey = _bytes(challenge, "publicKey", 32, ctx);
  const serverNodeId = await nodeIdOf(serverKey);
  const signed = _transcript(`${PROTOCOL_LABEL} server proof`, [
    clientNonce,
    serverNonce,
    ctx.serverCertificateSha256,
    serverNodeId,
    ctx.identity.nodeId,
  ]);
  if (!await verifyNodeSignature(serverKey, _bytes(challenge, "signature", 64, ctx), signed)) {
    throw await _refuse(
      channel,
      "bad-signature",
      "server proof does not verify",
      new PeerError(
        `Peer ${serverNodeId} at ${ctx.remoteAddress} failed authentication: its signature does not verify`,
        { hint: "the peer may be misconfigured or an impostor; check the address" },
      ),
    );
  }
  if (options.expectedServerNodeId && options.expectedServerNodeId !== serverNodeId) {
    throw await _refuse(
      channel,
      "untrusted",
      "unexpected node",
      new PeerError(
        `Peer at ${ctx.remoteAddress} is node ${serverNodeId}, not the expected ${options.expectedServerNodeId}`,
        { hint: "check the address and port of the peer" },
      ),
    );
  }
  const peer = await _checkTrusted(channel, ctx, serverKey, serverNodeId);
  const proof = _transcript(`${PROTOCOL_LABEL} client proof`, [
    serverNonce,
    clientNonce,
    ctx.serverCertificateSha256,
    ctx.identity.nodeId,
    serverNodeId,
  ]);
  await channel.writer.write({
    type: "ClientProof",
    signature: await signAsNode(ctx.identity, proof),
  });
  await _expect(channel, "AuthAccepted", ctx);
  return peer;
}

/**
 * Server side, first step: reads ClientHello and checks its protocol label and the certificate
 * hash the client pinned (refusing the client on either), then returns the client's nonce and key.
 */
async function _receiveClientHello(
  channel: Channel,
  ctx: AuthContext,
): Promise<{ clientNonce: Uint8Array; clientKey: Uint8Array; clientNodeId: string }> {
  const hello = await _expect(channel, "ClientHello", ctx);
  if (hello.protocol !== PROTOCOL_LABEL) {
    throw await _refuse(
      channel,
      "protocol",
      `unsupported protocol`,
      new ProtocolError(
        `Peer at ${ctx.remoteAddress} speaks "${
          String(hello.protocol).slice(0, 40)
        }", not "${PROTOCOL_LABEL}"`,
        { hint: "run the same skippy-disagg version on both peers" },
      ),
    );
  }
  const clientNonce = _bytes(hello, "nonce", NONCE_BYTES, ctx);
  const clientKey = _bytes(hello, "publicKey", 32, ctx);
  const clientNodeId = await nodeIdOf(clientKey);
  const pinned = _bytes(hello, "pinnedCertificateSha256", 32, ctx);
  if (!bytesEqual(pinned, ctx.serverCertificateSha256)) {
    throw await _refuse(
      channel,
      "certificate-mismatch",
      "client pinned a different certificate",
      new PeerError(
        `Peer ${clientNodeId} at ${ctx.remoteAddress} pinned a different TLS certificate ` +
          `(${formatFingerprint(pinned).slice(0, 16)}...)`,
        {
          hint:
            "the client has a stale fingerprint: re-share `skippy-disagg identity show --json` with it",
        },
      ),
    );
  }
  return { clientNonce, clientKey, clientNodeId };
}

/** Server side of the exchange. Throws PeerError (refused/untrusted) or ProtocolError. */
export async function authenticateAsServer(
  channel: Channel,
  ctx: AuthContext,
): Promise<AuthenticatedPeer> {
  const { clientNonce, clientKey, clientNodeId } = await _receiveClientHello(channel, ctx);
  const serverNonce = crypto.getRandomValues(new Uint8Array(NONCE_BYTES));
  const serverProof = _transcript(`${PROTOCOL_LABEL} server proof`, [
    clientNonce,
    serverNonce,
    ctx.serverCertificateSha256,
    ctx.identity.nodeId,
    clientNodeId,
  ]);
  await channel.writer.write({
    type: "ServerChallenge",
    nonce: serverNonce,
    publicKey: ctx.identity.publicKey,
    signature: await signAsNode(ctx.identity, serverProof),
  });
  const proof = await _expect(channel, "ClientProof", ctx);
  const expected = _transcript(`${PROTOCOL_LABEL} client proof`, [
    serverNonce,
    clientNonce,
    ctx.serverCertificateSha256,
    clientNodeId,
    ctx.identity.nodeId,
  ]);
  if (!await verifyNodeSignature(clientKey, _bytes(proof, "signature", 64, ctx), expected)) {
    throw await _refuse(
      channel,
      "bad-signature",
      "client proof does not verify",
      new PeerError(
        `Peer ${clientNodeId} at ${ctx.remoteAddress} failed authentication: its signature does not verify`,
      ),
    );
  }
  const peer = await _checkTrusted(channel, ctx, clientKey, clientNodeId);
  await channel.writer.write({ type: "AuthAccepted" });
  return peer;
}
