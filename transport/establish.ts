/**
 * Establishing a PeerConnection on any RawConnection: the client opens the control stream,
 * both sides authenticate (auth.ts) and exchange one CapabilitiesOffer each way, all within
 * `handshakeTimeoutMs`; on the server each step (the control stream, then each frame) must
 * also come within `handshakeStepMs` of the last. On failure the connection is closed with a
 * code saying why.
 */
import { LimitExceededError, PeerError, ProtocolError, SkippyError } from "../core/errors.ts";
import { authenticateAsClient, authenticateAsServer, refusalWasSent } from "./auth.ts";
import { parseCapabilities } from "./capabilities.ts";
import { LINK_PROBE_VERSION } from "./link_probe.ts";
import { CloseCode, type RawConnection } from "./channel.ts";
import { describeEnd, sleep } from "./_connection_end.ts";
import { FrameReader, FrameWriter } from "./framed_stream.ts";
import {
  DEFAULT_CLOSE_TIMEOUT_MS,
  DEFAULT_CONTROL_FRAME_LIMITS,
  DEFAULT_HANDSHAKE_STEP_MS,
  DEFAULT_HANDSHAKE_TIMEOUT_MS,
  PeerConnection,
  type PeerOptions,
} from "./peer.ts";

/**
 * What the listener learns while a server-side handshake runs (see handshake_gate.ts): each
 * completed step, and the moment the peer is authenticated (it then stops being half-open).
 */
export interface HandshakeProgress {
  progress(): void;
  authenticated(): void;
}

/**
 * Authenticates `raw` and exchanges capabilities. The client opens the control stream.
 * On failure the connection is closed and PeerError, ProtocolError or LimitExceededError
 * (handshake timeout, or on the server a step that made no progress within
 * `handshakeStepMs`) is thrown.
 */
export async function establishPeer(
  raw: RawConnection,
  side: "client" | "server",
  options: PeerOptions & { expectedServerNodeId?: string },
  progress?: HandshakeProgress,
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
  const handshake = _handshake(raw, side, options, progress);
  handshake.catch(() => {}); // after a timeout its rejection is expected and unobserved
  try {
    return await Promise.race([handshake, timeout]);
  } catch (error) {
    // A server gives a refused peer one step to read the refusal, not a whole close timeout:
    // a peer that never closes must not keep the connection (and its slot) for long.
    const closeMs = options.closeTimeoutMs ?? DEFAULT_CLOSE_TIMEOUT_MS;
    const refusalWaitMs = side === "server" ? Math.min(closeMs, _stepMs(options)) : closeMs;
    throw await _failHandshake(raw, error, refusalWaitMs);
  } finally {
    clearTimeout(timer);
  }
}

function _stepMs(options: PeerOptions): number {
  return options.handshakeStepMs ?? DEFAULT_HANDSHAKE_STEP_MS;
}

/**
 * Waits for `work`, failing with LimitExceededError if it takes longer than `stepMs`: the
 * server's defence against openers that send a few bytes and stall.
 */
async function _step<T>(work: Promise<T>, stepMs: number, address: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      reject(
        new LimitExceededError(
          `Handshake with ${address} made no progress within handshakeStepMs (${stepMs} ms)`,
          { hint: "a peer that stalls mid-handshake is cut; on a slow link raise handshakeStepMs" },
        ),
      );
    }, stepMs);
  });
  try {
    return await Promise.race([work, deadline]);
  } finally {
    clearTimeout(timer);
  }
}

async function _handshake(
  raw: RawConnection,
  side: "client" | "server",
  options: PeerOptions & { expectedServerNodeId?: string },
  progress?: HandshakeProgress,
): Promise<PeerConnection> {
  const stepMs = _stepMs(options);
  const channel = side === "client"
    ? await raw.openChannel()
    : await _step(raw.acceptChannel(), stepMs, raw.remoteAddress);
  if (!channel) {
    throw new PeerError(`Connection from ${raw.remoteAddress} closed before authentication`);
  }
  const limits = options.controlFrameLimits ?? DEFAULT_CONTROL_FRAME_LIMITS;
  const reader = new FrameReader(channel.readable, { limits });
  const writer = new FrameWriter(channel.writable, { limits });
  // On the server every frame of the handshake must arrive within one step of the last.
  const stepped = side === "client" ? reader : {
    read: async () => {
      const frame = await _step(reader.read(), stepMs, raw.remoteAddress);
      progress?.progress();
      return frame;
    },
  };
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
    : await authenticateAsServer({ reader: stepped, writer }, ctx);
  progress?.authenticated();
  // Every node of this build answers link pings and probes (peer.ts), whatever it serves.
  const mine = { ...options.capabilities, linkProbeVersion: LINK_PROBE_VERSION };
  await writer.write({ type: "CapabilitiesOffer", capabilities: mine });
  const offer = await stepped.read();
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
