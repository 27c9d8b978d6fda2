/**
 * The trust list: the node public keys this node accepts as peers, with an optional label, the
 * pinned TLS certificate fingerprint to use when connecting to them, and the roles each may
 * act in here. Stored as `<state dir>/trust.json` (mode 0600). Authentication (auth.ts)
 * accepts a peer only if its full public key is here; the node id is just the lookup key.
 *
 * Roles (`coordinator`, `prefill`, `decode`) say what a peer may ask of this node once it is
 * authenticated (serve/authorization.ts): a coordinator sends prefill, generate and cancel
 * requests; a prefill worker reserves and streams state to a decode worker; a prefill worker
 * hands off only to a peer trusted as `decode`. An entry without a `roles` field (every trust
 * file written before roles existed) may act in every role, as it could then: that keeps an
 * existing two-worker setup working, and `trust list` and `serve` print a one-line notice
 * asking to restrict it (`trust add <card> --roles ...`).
 */
import { InputFileError, UsageError } from "../core/errors.ts";
import { bytesEqual } from "./_encoding.ts";
import { formatPublicKey, nodeIdOf, parsePublicKey } from "./node_identity.ts";
import { ensureStateDir, readTextIfExists, statePath, writePrivateFile } from "./state_dir.ts";
import { formatFingerprint, parseFingerprint } from "./tls.ts";

const TRUST_FILE = "trust.json";
const TRUST_FILE_VERSION = 1;
/** A bound like any other: a trust list this long is a mistake, not a mesh. */
export const TRUST_ENTRIES_MAX = 4096;

/** What a trusted peer may act as on this node. */
export const TRUST_ROLES = ["coordinator", "prefill", "decode"] as const;
export type TrustRole = (typeof TRUST_ROLES)[number];

/** The notice for entries without roles (one line; `count` of them). */
export function legacyRolesNotice(count: number): string {
  return `note: ${count} trusted peer${count === 1 ? " has" : "s have"} no roles and may act ` +
    "in every role (as before roles existed); restrict each with " +
    "`skippy-disagg trust add <its card> --roles coordinator|prefill|decode[,...]`";
}

/**
 * Parses a comma-separated role list (`coordinator,prefill`): at least one role, each known,
 * returned in canonical order without duplicates.
 */
export function parseTrustRoles(text: string): TrustRole[] {
  const names = text.split(",").map((r) => r.trim()).filter((r) => r.length > 0);
  const unknown = names.filter((r) => !(TRUST_ROLES as readonly string[]).includes(r));
  if (names.length === 0 || unknown.length > 0) {
    throw new UsageError(
      names.length === 0
        ? "No roles given"
        : `Unknown role "${unknown[0].slice(0, 40)}" in the role list`,
      { hint: `roles are a comma-separated subset of: ${TRUST_ROLES.join(", ")}` },
    );
  }
  return TRUST_ROLES.filter((r) => names.includes(r));
}

/**
 * The roles `entry` grants: its own list, every role for an entry without one (see the file
 * comment), none for an untrusted peer.
 */
export function rolesOf(entry: TrustEntry | undefined): ReadonlySet<TrustRole> {
  if (!entry) return new Set();
  return new Set(entry.roles ?? TRUST_ROLES);
}

/** One trusted peer. */
export interface TrustEntry {
  nodeId: string;
  /** `ed25519:<base64url>`. */
  publicKey: string;
  label?: string;
  /** Hex SHA-256 of the peer's TLS certificate, used to pin it when connecting. */
  certificateSha256?: string;
  /**
   * What the peer may act as here, in TRUST_ROLES order. Absent: every role (an entry written
   * before roles existed; see the file comment).
   */
  roles?: TrustRole[];
  /** ISO date the entry was added (local bookkeeping only, never sent to peers). */
  addedAt: string;
}

/** What a peer shares so others can trust it: the output of `identity show --json`. */
export interface PeerCard {
  publicKey: Uint8Array;
  certificateSha256?: Uint8Array;
  label?: string;
}

/**
 * Parses a peer card: either a bare `ed25519:...` key, or the JSON printed by
 * `skippy-disagg identity show --json` (`{ publicKey, certificateSha256?, label? }`).
 */
export function parsePeerCard(text: string): PeerCard {
  const trimmed = text.trim();
  if (!trimmed.startsWith("{")) return { publicKey: parsePublicKey(trimmed) };
  let json: Record<string, unknown>;
  try {
    json = JSON.parse(trimmed);
  } catch (error) {
    throw new UsageError("Invalid peer card: not valid JSON", {
      hint: "pass the output of `skippy-disagg identity show --json`, or a bare ed25519:... key",
      cause: error,
    });
  }
  if (typeof json.publicKey !== "string") {
    throw new UsageError('Invalid peer card: missing "publicKey"', {
      hint: "pass the output of `skippy-disagg identity show --json`",
    });
  }
  const card: PeerCard = { publicKey: parsePublicKey(json.publicKey) };
  if (typeof json.certificateSha256 === "string") {
    card.certificateSha256 = parseFingerprint(json.certificateSha256);
  }
  if (typeof json.label === "string") card.label = json.label;
  return card;
}

/** The set of trusted peers, backed by a file (or in memory, for tests). */
export class TrustList {
  readonly #entries = new Map<string, TrustEntry>();
  readonly #stateDir: string | null;

  private constructor(stateDir: string | null, entries: TrustEntry[]) {
    this.#stateDir = stateDir;
    for (const entry of entries) this.#entries.set(entry.nodeId, entry);
  }

  /** Loads `<stateDir>/trust.json`; an absent file is an empty list. */
  static async load(stateDir: string): Promise<TrustList> {
    const path = statePath(stateDir, TRUST_FILE);
    const text = await readTextIfExists(path);
    if (text === null) return new TrustList(stateDir, []);
    try {
      const json = JSON.parse(text);
      if (json.version !== TRUST_FILE_VERSION || !Array.isArray(json.peers)) {
        throw new Error(`unsupported trust file version ${JSON.stringify(json.version)}`);
      }
      const entries: TrustEntry[] = json.peers.filter(_isEntry);
      const bad = entries.find((e) => e.roles !== undefined && !_rolesOk(e.roles));
      if (bad) {
        throw new Error(
          `the entry for node ${bad.nodeId} has an invalid "roles" (expected a non-empty ` +
            `subset of ${TRUST_ROLES.join(", ")})`,
        );
      }
      return new TrustList(stateDir, entries);
    } catch (error) {
      throw new InputFileError(`Cannot load trust list "${path}": ${(error as Error).message}`, {
        hint: "fix or delete the file, then re-add peers with `skippy-disagg trust add`",
        cause: error,
      });
    }
  }

  /** A list that is never saved: for tests and benchmarks. */
  static inMemory(): TrustList {
    return new TrustList(null, []);
  }

  /** All entries, in insertion order. */
  entries(): TrustEntry[] {
    return [...this.#entries.values()];
  }

  /** The entry for `nodeId`, if any. */
  lookup(nodeId: string): TrustEntry | undefined {
    return this.#entries.get(nodeId);
  }

  /** The entry whose full public key equals `publicKey`, if any. */
  async lookupKey(publicKey: Uint8Array): Promise<TrustEntry | undefined> {
    const entry = this.#entries.get(await nodeIdOf(publicKey));
    return entry && bytesEqual(parsePublicKey(entry.publicKey), publicKey) ? entry : undefined;
  }

  /** Entries without roles (may act in every role; see the file comment). */
  legacyEntries(): TrustEntry[] {
    return this.entries().filter((e) => e.roles === undefined);
  }

  /**
   * Adds (or updates) a peer; returns the entry and whether one was replaced. `roles` replaces
   * the entry's roles; omitted, an existing entry keeps its roles and a new one has none.
   */
  async add(
    card: PeerCard,
    roles?: readonly TrustRole[],
  ): Promise<{ entry: TrustEntry; replaced: boolean }> {
    if (roles !== undefined && !_rolesOk(roles)) {
      throw new UsageError(`Invalid roles ${JSON.stringify(roles).slice(0, 80)}`, {
        hint: `roles are a non-empty subset of: ${TRUST_ROLES.join(", ")}`,
      });
    }
    const nodeId = await nodeIdOf(card.publicKey);
    const replaced = this.#entries.has(nodeId);
    if (!replaced && this.#entries.size >= TRUST_ENTRIES_MAX) {
      throw new UsageError(`Cannot trust more than ${TRUST_ENTRIES_MAX} peers`, {
        hint: "remove unused peers with `skippy-disagg trust remove <node-id>`",
      });
    }
    const previous = this.#entries.get(nodeId);
    const entry: TrustEntry = {
      nodeId,
      publicKey: formatPublicKey(card.publicKey),
      addedAt: previous?.addedAt ?? new Date().toISOString(),
    };
    const label = card.label ?? previous?.label;
    if (label) entry.label = label;
    const pin = card.certificateSha256
      ? formatFingerprint(card.certificateSha256)
      : previous?.certificateSha256;
    if (pin) entry.certificateSha256 = pin;
    const granted = roles ?? previous?.roles;
    if (granted) entry.roles = TRUST_ROLES.filter((r) => granted.includes(r));
    this.#entries.set(nodeId, entry);
    return { entry, replaced };
  }

  /** Removes `nodeId`; returns the removed entry, if there was one. */
  remove(nodeId: string): TrustEntry | undefined {
    const entry = this.#entries.get(nodeId);
    this.#entries.delete(nodeId);
    return entry;
  }

  /** Writes the list back to its file (mode 0600). A no-op for an in-memory list. */
  async save(): Promise<void> {
    if (this.#stateDir === null) return;
    await ensureStateDir(this.#stateDir);
    const body = { version: TRUST_FILE_VERSION, peers: this.entries() };
    await writePrivateFile(
      statePath(this.#stateDir, TRUST_FILE),
      JSON.stringify(body, null, 2) + "\n",
    );
  }
}

function _rolesOk(roles: unknown): boolean {
  return Array.isArray(roles) && roles.length > 0 &&
    roles.every((r) => (TRUST_ROLES as readonly unknown[]).includes(r));
}

function _isEntry(value: unknown): value is TrustEntry {
  const entry = value as TrustEntry;
  return typeof entry === "object" && entry !== null && typeof entry.nodeId === "string" &&
    typeof entry.publicKey === "string";
}
