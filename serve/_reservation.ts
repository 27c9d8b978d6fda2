/**
 * The decoder's admission checks on a ReserveRequest, before any context is touched: the
 * message's shape, the authenticated peer it came from, the destination, the numerical
 * identity and the context size. Each failure is a typed error with a message naming the
 * field (never its content).
 */
import {
  compareIdentity,
  formatIdentityMismatches,
  IdentityMismatchError,
  LimitExceededError,
  type NumericalIdentity,
  type ParityVerdict,
  parityVerdict,
  type ReserveRequest,
  StateValidationError,
} from "../core/mod.ts";
import type { PeerConnection } from "../transport/mod.ts";
import type { ResolvedIdentity } from "./identity.ts";

const _str = (v: unknown, max: number) => typeof v === "string" && v.length > 0 && v.length <= max;
const _count = (v: unknown) => Number.isSafeInteger(v) && (v as number) >= 0;

/** The first malformed field of a reservation, or null. */
function _malformedField(r: ReserveRequest): string | null {
  if (!_str(r.tenantId, 128)) return "tenantId";
  if (!_str(r.sourceNodeId, 64)) return "sourceNodeId";
  if (!_str(r.destNodeId, 64)) return "destNodeId";
  if (!_str(r.identityDigest, 128)) return "identityDigest";
  if (!_count(r.promptTokens) || r.promptTokens < 1) return "promptTokens";
  if (!_count(r.contextTokensNeeded)) return "contextTokensNeeded";
  return null;
}

/**
 * Throws unless this decoder (`nodeId`, `identity`, `nCtx`) may accept `r` from `peer`: every
 * must-match identity field is covered by the digest, so a mismatch is refused here, before
 * any state byte. An accepted reservation returns its parity verdict: whether the
 * continuation may claim bitwise parity with this decoder's own colocated run (parity-only
 * fields, such as the compute device, compared against the peer's announced identity).
 */
export function checkReservation(
  r: ReserveRequest,
  peer: PeerConnection,
  own: { nodeId: string; identity: ResolvedIdentity; nCtx: number },
): ParityVerdict {
  const bad = _malformedField(r);
  if (bad) throw new StateValidationError(`Malformed ReserveRequest: field "${bad}" is invalid`);
  if (r.sourceNodeId !== peer.peerNodeId) {
    throw new StateValidationError(
      `Reservation names source worker "${r.sourceNodeId}" but came from "${peer.peerNodeId}"`,
    );
  }
  if (r.destNodeId !== own.nodeId) {
    throw new StateValidationError("Reservation is addressed to another decode worker");
  }
  if (r.identityDigest !== own.identity.digest) {
    throw new IdentityMismatchError(_mismatchMessage(peer, own.identity));
  }
  if (r.contextTokensNeeded > own.nCtx) {
    throw new LimitExceededError(
      `Request needs ${r.contextTokensNeeded} context tokens, this decoder has ${own.nCtx}`,
      { hint: "start the decode worker with a larger --ctx" },
    );
  }
  return parityVerdict(own.identity.numerical, _announcedIdentity(peer));
}

function _announcedIdentity(peer: PeerConnection): Partial<NumericalIdentity> | undefined {
  const remote = peer.peerCapabilities?.numericalIdentity;
  return remote && typeof remote === "object"
    ? remote as unknown as Partial<NumericalIdentity>
    : undefined;
}

function _mismatchMessage(peer: PeerConnection, own: ResolvedIdentity): string {
  const remote = _announcedIdentity(peer);
  if (remote) {
    const mismatches = compareIdentity(own.numerical, remote as NumericalIdentity);
    if (mismatches.length > 0) {
      return `Numerical identity differs: ${formatIdentityMismatches(mismatches)}`;
    }
  }
  return "Numerical identity digest differs from this decode worker's";
}
