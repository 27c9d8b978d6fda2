/**
 * The pure core of skippy-disagg: errors, the versioned state schema, identities, chunk
 * headers and binding tags, manifests and the staging ledger, the two-phase handoff
 * transition tables, the placement planner, telemetry records, the suffix proposer and the
 * sampler. Nothing here calls `Deno.*`. See `README.md` for the reading order.
 *
 * @module
 */
export * from "./errors.ts";
export * from "./bytes.ts";
export * from "./schema.ts";
export * from "./identity.ts";
export * from "./binding.ts";
export * from "./say_once.ts";
export * from "./chunk.ts";
export * from "./manifest.ts";
export * from "./manifest_tags.ts";
export * from "./ledger.ts";
export * from "./logical.ts";
export * from "./handoff.ts";
export * from "./handoff_prefiller.ts";
export * from "./handoff_decoder.ts";
export * from "./planner.ts";
export * from "./telemetry.ts";
export * from "./suffix.ts";
export * from "./sampling.ts";
export { BoundedQueue } from "./queue.ts";
export { KV_CACHE_TYPES, type KvType } from "./kv_types.ts";
