/**
 * What one decode-side attempt (serve/decode_session.ts) stages between its reservation and
 * its commit: the binding and the ledger a reservation opens, each chunk checked (tag, header,
 * checksum, ledger) and staged as it arrives (a KV page imported at once, a recurrent run into
 * the staged import, any other component into the tail), and, once the probe has passed, the
 * committed session that generation continues from.
 */
import {
  type AbortReason,
  type BindingContext,
  type ChunkHeader,
  type HandoffEvent,
  IdentityMismatchError,
  LimitExceededError,
  newBindingKey,
  type ParityVerdict,
  type ReserveRequest,
  StagingLedger,
  StateValidationError,
  trunkLayerCount,
  validateChunkHeader,
  verifyChunkPayload,
  verifyChunkTag,
} from "../core/mod.ts";
import type { DecoderTelemetryEvent } from "../core/telemetry.ts";
import type { StagedImport } from "../ffi/staged_import.ts";
import type { StagedTail } from "./_decode_tail.ts";
import type { HeldFrame } from "./_frame_inbox.ts";
import type { CommittedSession } from "./generation.ts";
import type { DecodeHandoffInput } from "./decode_session.ts";

/**
 * The binding an accepted reservation opens, under a fresh key, and the ledger its chunks are
 * checked against (holding at most `creditBytes` staged).
 */
export function openStaging(
  request: ReserveRequest,
  input: DecodeHandoffInput,
  creditBytes: number,
): { bindingKey: Uint8Array; binding: BindingContext; ledger: StagingLedger } {
  const own = input.identity;
  const bindingKey = newBindingKey();
  const binding = {
    bindingKey,
    handoffId: request.handoffId,
    destNodeId: input.nodeId,
    tenantId: request.tenantId,
  };
  const ledger = new StagingLedger({
    handoffId: request.handoffId,
    identityDigest: own.digest,
    family: own.numerical.family,
    trunkLayers: trunkLayerCount(own.numerical),
    creditBytes,
  });
  return { bindingKey, binding, ledger };
}

/** Where an attempt stages its chunks. */
export interface Staging {
  binding: BindingContext;
  ledger: StagingLedger;
  staged: StagedImport;
  tail: StagedTail;
  /** This model's layer kinds without the MTP layers: where a recurrent run lands. */
  trunkKinds: readonly string[];
  telemetry: DecoderTelemetryEvent[];
}

/**
 * Checks and stages one chunk; returns the credit it gives back (a page's bytes are free again
 * once imported), or the event `fail` makes of why it was rejected.
 */
export async function stageChunk(
  s: Staging,
  raw: ChunkHeader,
  frame: HeldFrame | undefined,
  fail: (reason: AbortReason, error: unknown) => HandoffEvent,
): Promise<HandoffEvent> {
  try {
    if (!frame) throw new StateValidationError("State chunk without its payload");
    const header = validateChunkHeader(raw);
    if (!await verifyChunkTag(s.binding, header, frame.tag)) {
      return fail("binding-tag", "chunk binding tag does not verify");
    }
    verifyChunkPayload(header, frame.payload);
    s.ledger.accept(header);
    const t0 = performance.now();
    await stageComponent(s, header, frame.payload);
    s.telemetry.push({
      type: "import",
      atMs: performance.now(),
      kind: header.kind,
      bytes: header.payloadBytes,
      durationMs: performance.now() - t0,
      arrival: frame.arrival,
    });
    // Pages are imported as they arrive, so their bytes are free again at once; snapshot
    // chunks stay held until the import step.
    const paged = header.kind === "kv-page" || header.kind === "mtp-kv";
    const credit = paged ? header.payloadBytes : 0;
    s.ledger.grantCredit(credit);
    return { type: "ChunkStaged", creditBytes: credit };
  } catch (error) {
    const reason = error instanceof LimitExceededError
      ? "credit-exceeded"
      : error instanceof IdentityMismatchError
      ? "identity-mismatch"
      : "invalid-state";
    return fail(reason, error);
  }
}

async function stageComponent(s: Staging, h: ChunkHeader, payload: Uint8Array): Promise<void> {
  if (h.kind === "kv-page") return await s.staged.addPage(payload);
  if (h.kind === "mtp-kv") return await s.staged.addMtpPage(payload);
  if (h.kind === "conv" || h.kind === "ssm") {
    // Trunk layer range -> the run of recurrent layers it holds, by this model's own kinds.
    const before = (l: number) => s.trunkKinds.slice(0, l).filter((k) => k === "recurrent");
    const [a, b] = h.layerRange;
    const [r0, r1] = [before(a).length, before(b).length];
    const piece = h.piece && { offset: h.piece.range[0], of: h.piece.of };
    return await s.staged.addRecurrentLayers(h.kind, r0, r1, payload, piece);
  }
  s.tail.take(h, payload);
}

/**
 * The committed session generation continues from, with the commit and the readiness it
 * verified recorded in the attempt's telemetry.
 */
export function committedSession(
  input: DecodeHandoffInput,
  parts: {
    parity: ParityVerdict | null;
    tail: StagedTail;
    nextLogits: Float32Array;
    telemetry: DecoderTelemetryEvent[];
  },
): CommittedSession {
  const { parity, tail, telemetry } = parts;
  const now = performance.now();
  // MTP readiness is what was verified: the draft's KV ends where its pending hidden row
  // is, one token behind the target (the probe decoded the first token alone).
  const draft = input.draft;
  const mtp = draft ? draft.readiness(input.engine.position) !== "not-ready" : null;
  telemetry.push({ type: "committed", atMs: now });
  telemetry.push({
    type: "ready",
    atMs: now,
    target: true,
    mtp,
    parity: parity?.parity ?? null,
    parityFields: parity?.differingFields.map(String) ?? [],
  });
  return {
    handoffId: input.request.handoffId,
    tenantId: input.request.tenantId,
    engine: input.engine,
    draft: input.draft,
    history: tail.history!,
    firstToken: tail.firstToken!,
    nextLogits: parts.nextLogits,
    sampler: tail.sampler!,
    events: telemetry,
    mtpReady: mtp,
  };
}
