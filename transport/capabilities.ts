/**
 * Capabilities: what each peer announces right after authentication, and the pure check that
 * decides whether a peer can take part in a disaggregated handoff.
 *
 * Every field is optional and additive. Unknown fields are ignored, malformed fields are
 * dropped with a note, and a peer that lacks a field is simply ineligible for disaggregation,
 * with a reason: this layer never throws over capabilities, so an older peer keeps working
 * for everything else (the design's "explicit unsupported-capability fallback").
 */
import { assert } from "../core/errors.ts";
import { CONGESTION_CONTROL_MODES, type CongestionControlMode } from "../core/plan_types.ts";
import { hex } from "./_encoding.ts";

/**
 * Version of the handoff protocol spoken on top of this transport. Changelog:
 * 1. First version.
 * 2. FinalManifest carries its tag in the header and, as its payload, the exact bytes the tag
 *    covers (checked before they are parsed); positions and history lead the state stream.
 */
export const HANDOFF_PROTOCOL_VERSION = 2;

/** The roles a worker can advertise. */
export const ROLES = ["prefill", "decode", "prefill+decode"] as const;
export type Role = (typeof ROLES)[number];

/** What a node announces about itself. */
export interface Capabilities {
  /** Handoff protocol version (HANDOFF_PROTOCOL_VERSION). */
  protocolVersion?: number;
  roles?: Role[];
  /** Continuation-state schema versions this node can export or import. */
  stateSchemaVersions?: number[];
  /** KV page codecs (e.g. "raw"). */
  kvCodecs?: string[];
  /** KV dtypes (e.g. "f16", "q8_0"). */
  kvDtypes?: string[];
  /**
   * Digest of the loaded model's numerical identity, opaque to the transport: supplied by the
   * caller, compared for exact equality, never printed.
   */
  numericalIdentity?: string | Record<string, unknown>;
  /** Version of the link ping/probe exchange the node answers (link_probe.ts). */
  linkProbeVersion?: number;
  /**
   * A prefill worker that sends each recurrent layer's final state while the prompt's last
   * chunk still computes (layer capture): placement predicts its tail with that overlap.
   */
  layerCapture?: boolean;
  /**
   * With `layerCapture`: the prefill worker also sends a hybrid model's last KV page before
   * the last chunk ends (once the last attention layer has written it).
   */
  lastPageCapture?: boolean;
  /**
   * The congestion controller this node sends handoff state with on its outgoing links
   * ("auto": chosen per link from its loss; the node reports each link's with its loss
   * probes): placement predicts a lossy link's rate by it (absent: "cubic").
   */
  congestionControl?: CongestionControlMode;
}

/** Parsed capabilities plus notes about fields that were dropped. */
export interface ParsedCapabilities {
  capabilities: Capabilities;
  /** One line per malformed field that was ignored. */
  problems: string[];
}

/** Bounds on what a peer may announce: lists, strings, and the identity's encoded size. */
export const CAPABILITY_LIST_ITEMS_MAX = 64;
export const CAPABILITY_STRING_BYTES_MAX = 256;
export const NUMERICAL_IDENTITY_BYTES_MAX = 16 * 1024;

function _list<T>(
  value: unknown,
  name: string,
  isItem: (item: unknown) => item is T,
  problems: string[],
): T[] | undefined {
  if (value === undefined) return undefined;
  if (!Array.isArray(value) || value.length > CAPABILITY_LIST_ITEMS_MAX) {
    problems.push(`"${name}" is not a list of at most ${CAPABILITY_LIST_ITEMS_MAX} items`);
    return undefined;
  }
  // Unknown items (a role added by a newer version, say) are skipped, not an error.
  return value.filter(isItem);
}

const _isShortString = (x: unknown): x is string =>
  typeof x === "string" && x.length > 0 && x.length <= CAPABILITY_STRING_BYTES_MAX;
const _isRole = (x: unknown): x is Role => ROLES.includes(x as Role);
const _isVersion = (x: unknown): x is number => Number.isInteger(x) && (x as number) >= 0;

/**
 * Reads capabilities from a peer's `CapabilitiesOffer`. Never throws.
 *
 * @example
 * ```ts
 * parseCapabilities({ roles: ["decode", "teleport"], future: 1 }).capabilities;
 * // -> { roles: ["decode"] }
 * ```
 */
export function parseCapabilities(value: unknown): ParsedCapabilities {
  const problems: string[] = [];
  const capabilities: Capabilities = {};
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    return { capabilities, problems: ["capabilities are not a map"] };
  }
  const raw = value as Record<string, unknown>;
  if (raw.protocolVersion !== undefined) {
    if (_isVersion(raw.protocolVersion)) capabilities.protocolVersion = raw.protocolVersion;
    else problems.push('"protocolVersion" is not a non-negative integer');
  }
  const roles = _list(raw.roles, "roles", _isRole, problems);
  if (roles) capabilities.roles = roles;
  const schemas = _list(raw.stateSchemaVersions, "stateSchemaVersions", _isVersion, problems);
  if (schemas) capabilities.stateSchemaVersions = schemas;
  const codecs = _list(raw.kvCodecs, "kvCodecs", _isShortString, problems);
  if (codecs) capabilities.kvCodecs = codecs;
  const dtypes = _list(raw.kvDtypes, "kvDtypes", _isShortString, problems);
  if (dtypes) capabilities.kvDtypes = dtypes;
  if (raw.linkProbeVersion !== undefined) {
    if (_isVersion(raw.linkProbeVersion)) capabilities.linkProbeVersion = raw.linkProbeVersion;
    else problems.push('"linkProbeVersion" is not a non-negative integer');
  }
  if (raw.layerCapture !== undefined) {
    if (typeof raw.layerCapture === "boolean") capabilities.layerCapture = raw.layerCapture;
    else problems.push('"layerCapture" is not a boolean');
  }
  if (raw.lastPageCapture !== undefined) {
    if (typeof raw.lastPageCapture === "boolean") {
      capabilities.lastPageCapture = raw.lastPageCapture;
    } else problems.push('"lastPageCapture" is not a boolean');
  }
  if (raw.congestionControl !== undefined) {
    const cc = raw.congestionControl as CongestionControlMode;
    if (CONGESTION_CONTROL_MODES.includes(cc)) capabilities.congestionControl = cc;
    else problems.push(`"congestionControl" is not one of ${CONGESTION_CONTROL_MODES.join(", ")}`);
  }
  const identity = raw.numericalIdentity;
  if (identity !== undefined) {
    const ok =
      (typeof identity === "string" || (typeof identity === "object" && identity !== null)) &&
      canonicalJson(identity).length <= NUMERICAL_IDENTITY_BYTES_MAX;
    if (ok) capabilities.numericalIdentity = identity as Capabilities["numericalIdentity"];
    else {problems.push(
        `"numericalIdentity" is not a string or map of at most ${NUMERICAL_IDENTITY_BYTES_MAX} bytes`,
      );}
  }
  return { capabilities, problems };
}

/**
 * A deterministic text form (sorted keys, bytes as hex) so two identities compare equal
 * exactly when their contents are equal, whatever order the peer encoded them in.
 */
export function canonicalJson(value: unknown): string {
  if (value instanceof Uint8Array) return JSON.stringify("0x" + hex(value));
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  if (typeof value === "object" && value !== null) {
    const keys = Object.keys(value).sort();
    const body = keys.map((k) =>
      `${JSON.stringify(k)}:${canonicalJson((value as Record<string, unknown>)[k])}`
    );
    return `{${body.join(",")}}`;
  }
  return JSON.stringify(value) ?? "null";
}

/** Whether an advertised role covers the needed one. */
export function roleCovers(advertised: Role, needed: Role): boolean {
  return advertised === needed || advertised === "prefill+decode";
}

/** The outcome of `eligibleForHandoff`. */
export type HandoffEligibility =
  | { ok: true; stateSchemaVersion: number; kvCodecs: string[]; kvDtypes: string[] }
  | { ok: false; reason: string };

function _common<T>(a: T[] | undefined, b: T[] | undefined): T[] {
  return (a ?? []).filter((x) => (b ?? []).includes(x));
}

function _complement(role: Role): Role {
  return role === "decode" ? "prefill" : role === "prefill" ? "decode" : "prefill+decode";
}

/**
 * Decides whether `remote` can take the `requiredRole` side of a handoff with `local` (which
 * takes the other side). Pure; never throws. Reasons never include identity contents.
 *
 * @example
 * ```ts
 * const verdict = eligibleForHandoff(mine, peer.capabilities, "decode");
 * if (!verdict.ok) console.log(`colocated: ${verdict.reason}`);
 * ```
 */
export function eligibleForHandoff(
  local: Capabilities,
  remote: Capabilities,
  requiredRole: Role,
): HandoffEligibility {
  assert(ROLES.includes(requiredRole), `unknown role ${requiredRole}`);
  const no = (reason: string): HandoffEligibility => ({ ok: false, reason });
  if (remote.protocolVersion === undefined) {
    return no("peer does not advertise a handoff protocol version (older peer)");
  }
  if (remote.protocolVersion !== local.protocolVersion) {
    return no(
      `peer speaks handoff protocol ${remote.protocolVersion}, this node ${
        local.protocolVersion ?? "none"
      }`,
    );
  }
  if (!(remote.roles ?? []).some((r) => roleCovers(r, requiredRole))) {
    return no(
      `peer does not advertise role "${requiredRole}" (advertises: ${
        (remote.roles ?? []).join(", ") || "none"
      })`,
    );
  }
  const localRole = _complement(requiredRole);
  if (!(local.roles ?? []).some((r) => roleCovers(r, localRole))) {
    return no(`this node does not advertise role "${localRole}"`);
  }
  const schemas = _common(local.stateSchemaVersions, remote.stateSchemaVersions);
  if (schemas.length === 0) {
    return no(
      `no common state schema version (this node: ${
        (local.stateSchemaVersions ?? []).join(", ") || "none"
      }; ` +
        `peer: ${(remote.stateSchemaVersions ?? []).join(", ") || "none"})`,
    );
  }
  const kvCodecs = _common(local.kvCodecs, remote.kvCodecs);
  if (kvCodecs.length === 0) return no("no common KV codec");
  const kvDtypes = _common(local.kvDtypes, remote.kvDtypes);
  if (kvDtypes.length === 0) return no("no common KV dtype");
  if (local.numericalIdentity === undefined) {
    return no("this node has no numerical identity (no model loaded)");
  }
  if (remote.numericalIdentity === undefined) return no("peer advertises no numerical identity");
  if (canonicalJson(local.numericalIdentity) !== canonicalJson(remote.numericalIdentity)) {
    return no("numerical identity differs (model, tokenizer or context configuration)");
  }
  return { ok: true, stateSchemaVersion: Math.max(...schemas), kvCodecs, kvDtypes };
}
