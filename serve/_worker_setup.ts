/**
 * What a worker (serve/worker.ts) is built from at start: its numerical identity, resolved on
 * one of its contexts together with whether layer capture opens there; the decode side's
 * sessions (the shared batched context, or a context each); and its prefill and decode roles,
 * made from the options with their defaults.
 */
import { DecoderLinkLoss } from "./link_loss.ts";
import type { HandoffTiming } from "../core/mod.ts";
import { type Capabilities, roleCovers } from "../transport/mod.ts";
import { DecodeRole } from "./decode_role.ts";
import { DEFAULT_DECODE_LIMITS } from "./decode_session.ts";
import { type ResolvedIdentity, resolveIdentity } from "./identity.ts";
import type { Node } from "./node.ts";
import type { EnginePool, SessionPool } from "./pool.ts";
import { ADMISSION_DEFAULTS } from "./admission.ts";
import { BATCHING_DEFAULTS, SequencePool } from "./batch_pool.ts";
import { DEFAULT_PREFILL_LIMITS } from "./prefill_session.ts";
import { PrefillRole } from "./prefill_role.ts";
import { openLayerCapture } from "./_layer_stream.ts";
import { DEFAULT_PREFILL_QUEUE } from "./prefill_queue.ts";
import { DEFAULT_PREFIX_CACHE, PrefixCache } from "./prefix_cache.ts";
import { SKIPPY_SHIM_ABI_VERSION } from "../ffi/shim/abi.ts";
import { stateBackend } from "../ffi/state.ts";
import type { WorkerOptions } from "./worker.ts";

/**
 * Resolves the numerical identity on one of the pool's contexts, and whether layer capture
 * opens there: it is announced from a capture really opened on this context (which keeps it
 * for its first handoff), so placement never assumes an overlap the worker cannot deliver.
 */
export async function probeIdentity(
  options: WorkerOptions,
  node: Node,
  pool: EnginePool,
): Promise<
  { identity: ResolvedIdentity; capture: { layerCapture: boolean; lastPageCapture: boolean } }
> {
  const probe = (await pool.tryAcquire())!;
  try {
    const backend = await stateBackend(probe.engine.ctx);
    const identity = await resolveIdentity(probe.engine, {
      digestCacheFile: `${node.stateDir}/digests.json`,
      shimAbiVersion: backend.path === "shim" ? SKIPPY_SHIM_ABI_VERSION : 0,
    });
    const limits = { ...DEFAULT_PREFILL_LIMITS, ...options.prefillLimits };
    const kinds = identity.numerical.layerKinds;
    const opened = roleCovers(options.role, "prefill") && limits.layerCapture &&
        kinds.includes("recurrent")
      ? await openLayerCapture(probe.engine.ctx)
      : null;
    const layerCapture = opened !== null;
    // The capture found the last attention layer (a hybrid model): it sends the last page too.
    const lastPageCapture = layerCapture && limits.lastPageCapture && opened.pageLayer >= 0;
    return { identity, capture: { layerCapture, lastPageCapture } };
  } finally {
    pool.release(probe);
  }
}

/** The decode side's pool: the shared batched context when it can be used, else `pool`. */
export async function decodeSessions(
  options: WorkerOptions,
  pool: EnginePool,
  log: (line: string) => void,
): Promise<SessionPool> {
  if ((options.batching ?? "on") === "off") return pool;
  const off = (why: string) => {
    log(`serve: batching off: ${why}`);
    return pool;
  };
  if (pool.withDraft) return off("the model has an MTP draft (its context is per session)");
  const speculation = pool.config.speculation?.mode ?? "none";
  if (speculation !== "none") {
    return off(`speculation ${speculation} verifies on per-session contexts`);
  }
  try {
    const shared = await SequencePool.open(pool.model, pool.config, {
      sequencesMax: options.sessionsMax,
      stepTokensMax: options.stepTokensMax ?? BATCHING_DEFAULTS.stepTokensMax,
    });
    // A decode-only worker keeps no per-session contexts around (the identity probe's).
    if (!roleCovers(options.role, "prefill")) pool.trim();
    return shared;
  } catch (error) {
    if (options.batching === "on") throw error;
    return off((error as Error).message);
  }
}

/** What a worker's roles are built from (Worker.start). */
export interface RoleParts {
  node: Node;
  pool: EnginePool;
  sessions: SessionPool;
  identity: ResolvedIdentity;
  capabilities: Capabilities;
  timing: HandoffTiming;
  log: (line: string) => void;
}

/** The prefill role, its bounds and options at their defaults where `options` is silent. */
export function prefillRole(options: WorkerOptions, p: RoleParts): PrefillRole {
  return new PrefillRole(
    p.node,
    p.pool,
    p.identity,
    p.capabilities,
    p.timing,
    { ...DEFAULT_PREFILL_LIMITS, ...options.prefillLimits },
    p.log,
    { ...DEFAULT_PREFILL_QUEUE, ...options.prefillQueue },
    options.prefillHooks,
    new PrefixCache(
      { ...DEFAULT_PREFIX_CACHE, ...options.prefixCache },
      p.identity.numerical.family,
    ),
    (options.linkProbeAgeMs ?? 20_000) > 0
      ? new DecoderLinkLoss(p.node.identity.nodeId, p.log, {
        lossProbeAgeMsMax: options.linkProbeAgeMs ?? 20_000,
      })
      : null,
  );
}

/** The decode role, its bounds and options at their defaults where `options` is silent. */
export function decodeRole(options: WorkerOptions, p: RoleParts): DecodeRole {
  return new DecodeRole(
    p.node,
    p.sessions,
    p.identity,
    p.timing,
    { ...DEFAULT_DECODE_LIMITS, ...options.decodeLimits },
    options.committedIdleMs ?? 30_000,
    p.log,
    { ...ADMISSION_DEFAULTS, ...options.admission },
    options.decodeHooks,
  );
}
