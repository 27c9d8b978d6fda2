/**
 * A worker's numerical identity, computed once per loaded model: file and tokenizer digests
 * (the file digest cached on disk by path, size and mtime), architecture and layer kinds from
 * the GGUF, and every runtime setting that changes numerics.
 */
import {
  type CongestionControlMode,
  identityDigest,
  type LayerKind,
  type ModelFamily,
  type NumericalIdentity,
  PARITY_ONLY_FIELDS,
  STATE_SCHEMA_VERSION,
} from "../core/mod.ts";
import { type Capabilities, HANDOFF_PROTOCOL_VERSION, type Role } from "../transport/mod.ts";
import { fileDigest, llamaBuild, tokenizerDigest } from "../ffi/mod.ts";
import { type ModelSpec, readGgufFile, specFromGguf } from "../models/mod.ts";
import { type Engine, UBATCH_TOKENS } from "./engine.ts";

export interface ResolvedIdentity {
  numerical: NumericalIdentity;
  /** Digest of `numerical` (nCtx excluded), what chunks and reservations carry. */
  digest: string;
  spec: ModelSpec;
}

const KIND_OF: Record<string, LayerKind> = {
  transformer: "attention",
  "swa-transformer": "attention-swa",
  attention: "attention",
  mamba: "recurrent",
  mlp: "mlp",
  moe: "moe",
};

/** The state family of a model: which components a handoff of it needs. */
export function familyOf(spec: ModelSpec): ModelFamily {
  const kinds = new Set(spec.layers);
  const recurrent = kinds.has("mamba");
  const attention = kinds.has("attention") || kinds.has("transformer");
  if (kinds.has("swa-transformer")) return "iswa";
  if (recurrent && attention) return spec.nextnLayers > 0 ? "hybrid-moe-mtp" : "hybrid";
  if (recurrent) return "recurrent";
  return "dense";
}

/** Computes the identity of a loaded engine. `digestCacheFile` avoids re-hashing big files. */
export async function resolveIdentity(
  engine: Engine,
  options: { digestCacheFile?: string; shimAbiVersion: number },
): Promise<ResolvedIdentity> {
  const spec = specFromGguf(await readGgufFile(engine.config.modelPath), engine.config.modelPath);
  const layerKinds: LayerKind[] = spec.layers.map((k) => KIND_OF[k]);
  for (let i = 0; i < spec.nextnLayers; i++) layerKinds.push("mtp");
  const c = engine.config;
  const numerical: NumericalIdentity = {
    modelDigest: await fileDigest(c.modelPath, options.digestCacheFile),
    tokenizerDigest: tokenizerDigest(engine.model),
    architecture: spec.architecture,
    family: familyOf(spec),
    layerCount: layerKinds.length,
    layerKinds,
    nCtx: engine.ctx.nCtx,
    kType: c.typeK,
    vType: c.typeV,
    flashAttention: c.flashAttention,
    kvUnified: true,
    swaFull: c.swaFull ?? false,
    nUbatch: UBATCH_TOKENS,
    threadCount: c.threads,
    cpuBackendVariant: engine.lib.cpuVariant,
    gpuLayers: engine.model.offload.gpuLayers,
    computeBackend: engine.model.offload.backend,
    computeDevice: engine.model.offload.device,
    stateSchemaVersion: STATE_SCHEMA_VERSION,
    llamaBuild: llamaBuild(engine.lib),
    shimAbiVersion: options.shimAbiVersion,
  };
  return { numerical, digest: await identityDigest(numerical), spec };
}

/**
 * The capabilities a worker announces. Only must-match identity fields: the transport compares
 * the announced identity exactly, and a parity-only difference (the device model) must not
 * make peers ineligible.
 */
export function announcedCapabilities(
  role: Role,
  identity: ResolvedIdentity,
  capture: { layerCapture: boolean; lastPageCapture: boolean },
  congestionControl: CongestionControlMode = "auto",
): Capabilities {
  const { nCtx: _perWorker, ...numerical } = identity.numerical;
  const exact = Object.fromEntries(
    Object.entries(numerical).filter(([k]) => !(PARITY_ONLY_FIELDS as string[]).includes(k)),
  );
  return {
    protocolVersion: HANDOFF_PROTOCOL_VERSION,
    roles: [role],
    stateSchemaVersions: [STATE_SCHEMA_VERSION],
    kvCodecs: ["llama-kv-cells"],
    kvDtypes: [identity.numerical.kType],
    numericalIdentity: exact,
    ...(capture.layerCapture ? { layerCapture: true } : {}),
    ...(capture.layerCapture && capture.lastPageCapture ? { lastPageCapture: true } : {}),
    congestionControl,
  };
}
