/**
 * How the two-phase handoff's messages travel: ReserveRequest, ReserveAccepted,
 * TransferCredit, CommitAck and AbortNotice on the control stream; StateChunk frames (header,
 * binding tag, raw payload) and the FinalManifest as the final frame on a dedicated handoff
 * stream per attempt, so the manifest can never overtake a chunk.
 */

/** Core handoff messages carried on the control stream. */
export const CORE_MESSAGE_TYPES: ReadonlySet<string> = new Set([
  "ReserveRequest",
  "ReserveAccepted",
  "TransferCredit",
  "CommitAck",
  "AbortNotice",
]);

/** Frame types on a handoff stream. */
export const STREAM_MESSAGE_TYPES: ReadonlySet<string> = new Set(["StateChunk", "FinalManifest"]);
