/**
 * The trust list: the node public keys this node accepts as peers, with an optional label and
 * the pinned TLS certificate fingerprint to use when connecting to them. Stored as
 * `<state dir>/trust.json` (mode 0600). Authentication (auth.ts) accepts a peer only if its
 * full public key is here; the node id is just the lookup key.
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

/** One trusted peer. */
export interface TrustEntry {
  nodeId: string;
  /** `ed25519:<base64url>`. */
  publicKey: string;
  label?: string;
  /** Hex SHA-256 of the peer's TLS certificate, used to pin it when connecting. */
  certificateSha256?: string;
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
      return new TrustList(stateDir, json.peers.filter(_isEntry));
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

  /** Adds (or updates) a peer; returns the entry and whether one was replaced. */
  async add(card: PeerCard): Promise<{ entry: TrustEntry; replaced: boolean }> {
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

function _isEntry(value: unknown): value is TrustEntry {
  const entry = value as TrustEntry;
  return typeof entry === "object" && entry !== null && typeof entry.nodeId === "string" &&
    typeof entry.publicKey === "string";
}
