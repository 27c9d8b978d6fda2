/**
 * Establishing a PeerConnection on any RawConnection: the client opens the control stream,
 * both sides authenticate (auth.ts) and exchange one CapabilitiesOffer each way, all within
 * `handshakeTimeoutMs`. On failure the connection is closed with a code saying why.
 */
import { LimitExceededError, PeerError, ProtocolError, SkippyError } from "../core/errors.ts";
import { authenticateAsClient, authenticateAsServer, refusalWasSent } from "./auth.ts";
import { parseCapabilities } from "./capabilities.ts";
import { CloseCode, type RawConnection } from "./channel.ts";
import { describeEnd, sleep } from "./_connection_end.ts";
import { FrameReader, FrameWriter } from "./framed_stream.ts";
import {
  DEFAULT_CLOSE_TIMEOUT_MS,
  DEFAULT_CONTROL_FRAME_LIMITS,
  DEFAULT_HANDSHAKE_TIMEOUT_MS,
  PeerConnection,
  type PeerOptions,
} from "./peer.ts";

/**
 * Authenticates `raw` and exchanges capabilities. The client opens the control stream.
 * On failure the connection is closed and PeerError, ProtocolError or LimitExceededError
 * (handshake timeout) is thrown.
 */
export async function establishPeer(
  raw: RawConnection,
  side: "client" | "server",
  options: PeerOptions & { expectedServerNodeId?: string },
): Promise<PeerConnection> {
  const timeoutMs = options.handshakeTimeoutMs ?? DEFAULT_HANDSHAKE_TIMEOUT_MS;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      reject(
        new LimitExceededError(
          `Handshake with ${raw.remoteAddress} did not finish within handshakeTimeoutMs (${timeoutMs} ms)`,
          {
            hint: "check that the peer runs skippy-disagg and is not overloaded",
          },
        ),
      );
    }, timeoutMs);
  });
  const handshake = _handshake(raw, side, options);
  handshake.catch(() => {}); // after a timeout its rejection is expected and unobserved
  try {
    return await Promise.race([handshake, timeout]);
  } catch (error) {
    throw await _failHandshake(raw, error, options.closeTimeoutMs ?? DEFAULT_CLOSE_TIMEOUT_MS);
  } finally {
    clearTimeout(timer);
  }
}

async function _handshake(
  raw: RawConnection,
  side: "client" | "server",
  options: PeerOptions & { expectedServerNodeId?: string },
): Promise<PeerConnection> {
  const channel = side === "client" ? await raw.openChannel() : await raw.acceptChannel();
  if (!channel) {
    throw new PeerError(`Connection from ${raw.remoteAddress} closed before authentication`);
  }
  const limits = options.controlFrameLimits ?? DEFAULT_CONTROL_FRAME_LIMITS;
  const reader = new FrameReader(channel.readable, { limits });
  const writer = new FrameWriter(channel.writable, { limits });
  const ctx = {
    identity: options.identity,
    trust: options.trust,
    serverCertificateSha256: raw.serverCertificateSha256,
    remoteAddress: raw.remoteAddress,
  };
  const peer = side === "client"
    ? await authenticateAsClient({ reader, writer }, ctx, {
      expectedServerNodeId: options.expectedServerNodeId,
    })
    : await authenticateAsServer({ reader, writer }, ctx);
  await writer.write({ type: "CapabilitiesOffer", capabilities: options.capabilities ?? {} });
  const offer = await reader.read();
  if (offer?.header.type !== "CapabilitiesOffer") {
    throw new ProtocolError(
      `Peer ${peer.nodeId} sent "${String(offer?.header.type)}" instead of its capabilities`,
    );
  }
  return new PeerConnection(
    raw,
    reader,
    writer,
    peer,
    parseCapabilities(offer.header.capabilities),
    options,
  );
}

async function _failHandshake(
  raw: RawConnection,
  error: unknown,
  closeTimeoutMs: number,
): Promise<Error> {
  if (refusalWasSent(error)) {
    // Give the peer time to read our AuthRefused and close; closing first could drop it.
    await Promise.race([raw.closed, sleep(closeTimeoutMs)]);
  }
  let failure = error instanceof Error ? error : new Error(String(error));
  if (!(error instanceof SkippyError)) {
    // A runtime error (stream reset, connection lost): say what the peer said when closing.
    const end = await Promise.race([raw.closed, sleep(200).then(() => null)]);
    const how = describeEnd(raw.remoteAddress, end, raw.maxIdleTimeoutMs, failure.message);
    failure = end?.closeCode === CloseCode.authenticationFailed
      ? new PeerError(`Peer at ${raw.remoteAddress} refused this node: ${end.reason}`, {
        hint:
          "ask the peer's operator to run `skippy-disagg trust add` with this node's public key",
        cause: error,
      })
      : new PeerError(`Connection to ${raw.remoteAddress} failed during the handshake: ${how}`, {
        cause: error,
      });
  }
  const code = failure instanceof LimitExceededError
    ? CloseCode.handshakeTimeout
    : failure instanceof PeerError
    ? CloseCode.authenticationFailed
    : CloseCode.protocolError;
  raw.close(code, failure.message.slice(0, 120));
  return failure;
}
