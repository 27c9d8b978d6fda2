/**
 * Node identity: the Ed25519 key pair that names a machine in the mesh. The node id is a
 * short, stable name derived from the public key; trust is always checked on the full key.
 *
 * The private key is stored as a JWK in `<state dir>/node-key.jwk`, mode 0600, created on
 * first use. It never leaves this process: only signatures and the public key go on the wire.
 */
import { InputFileError, UsageError } from "../core/errors.ts";
import { base32, base64url, parseBase64url } from "./_encoding.ts";
import { ensureStateDir, readTextIfExists, statePath, writePrivateFile } from "./state_dir.ts";

/** Text form of a public key: this prefix, then the 32 raw key bytes in base64url. */
export const PUBLIC_KEY_PREFIX = "ed25519:";
const NODE_KEY_FILE = "node-key.jwk";
const ED25519 = { name: "Ed25519" } as const;
const NODE_ID_HASH_BYTES = 10; // 80 bits -> 16 base32 characters

/** A node's key pair and the names derived from it. */
export interface NodeIdentity {
  /** Short stable name: base32 of the first 10 bytes of SHA-256(public key). */
  readonly nodeId: string;
  /** The 32 raw public key bytes. */
  readonly publicKey: Uint8Array;
  /** `ed25519:<base64url>`: what `trust add` takes. */
  readonly publicKeyText: string;
  /** Non-extractable signing key. */
  readonly privateKey: CryptoKey;
}

/** The node id of a raw Ed25519 public key. */
export async function nodeIdOf(publicKey: Uint8Array): Promise<string> {
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", publicKey as BufferSource));
  return base32(digest.subarray(0, NODE_ID_HASH_BYTES));
}

/** `ed25519:<base64url>` for a raw public key. */
export function formatPublicKey(publicKey: Uint8Array): string {
  return PUBLIC_KEY_PREFIX + base64url(publicKey);
}

/** Parses `ed25519:<base64url>` (the prefix is optional); throws UsageError if malformed. */
export function parsePublicKey(text: string): Uint8Array {
  const trimmed = text.trim();
  const body = trimmed.startsWith(PUBLIC_KEY_PREFIX)
    ? trimmed.slice(PUBLIC_KEY_PREFIX.length)
    : trimmed;
  const raw = parseBase64url(body);
  if (!raw || raw.length !== 32) {
    throw new UsageError(`Invalid node public key "${trimmed.slice(0, 60)}"`, {
      hint:
        "expected ed25519:<43 base64url characters>, as printed by `skippy-disagg identity show`",
    });
  }
  return raw;
}

async function _fromJwk(jwk: JsonWebKey): Promise<NodeIdentity> {
  const publicKey = parseBase64url(jwk.x ?? "");
  if (
    jwk.kty !== "OKP" || jwk.crv !== "Ed25519" || !publicKey || publicKey.length !== 32 || !jwk.d
  ) {
    throw new Error("not an Ed25519 private JWK");
  }
  const privateKey = await crypto.subtle.importKey("jwk", jwk, ED25519, false, ["sign"]);
  return {
    nodeId: await nodeIdOf(publicKey),
    publicKey,
    publicKeyText: formatPublicKey(publicKey),
    privateKey,
  };
}

async function _generateJwk(): Promise<JsonWebKey> {
  const pair = await crypto.subtle.generateKey(ED25519, true, ["sign", "verify"]) as CryptoKeyPair;
  const jwk = await crypto.subtle.exportKey("jwk", pair.privateKey);
  return { kty: jwk.kty, crv: jwk.crv, x: jwk.x, d: jwk.d };
}

/** A fresh identity that is never stored: for tests and benchmarks. */
export async function createEphemeralNodeIdentity(): Promise<NodeIdentity> {
  return await _fromJwk(await _generateJwk());
}

/**
 * Loads the node identity from `stateDir`, creating and storing one on first use.
 * Refuses a key file that others can read, like ssh does.
 */
export async function loadOrCreateNodeIdentity(
  stateDir: string,
): Promise<{ identity: NodeIdentity; created: boolean }> {
  const path = statePath(stateDir, NODE_KEY_FILE);
  const text = await readTextIfExists(path);
  if (text === null) {
    await ensureStateDir(stateDir);
    const jwk = await _generateJwk();
    await writePrivateFile(path, JSON.stringify(jwk) + "\n");
    return { identity: await _fromJwk(jwk), created: true };
  }
  await assertOwnerOnly(path);
  try {
    return { identity: await _fromJwk(JSON.parse(text)), created: false };
  } catch (error) {
    throw new InputFileError(`Cannot load node key "${path}": ${(error as Error).message}`, {
      hint: "restore the file from a backup, or delete it to create a new node identity " +
        "(peers must then trust the new key)",
      cause: error,
    });
  }
}

/** Throws if a private file is readable or writable by group or others. */
export async function assertOwnerOnly(path: string): Promise<void> {
  if (Deno.build.os === "windows") return;
  const mode = (await Deno.stat(path)).mode;
  if (mode !== null && (mode & 0o077) !== 0) {
    throw new InputFileError(
      `Refusing to use "${path}": it is accessible by other users (mode ${
        (mode & 0o777).toString(8)
      })`,
      { hint: `run: chmod 600 "${path}"` },
    );
  }
}

/** Signs `message` with the node key. */
export async function signAsNode(identity: NodeIdentity, message: Uint8Array): Promise<Uint8Array> {
  return new Uint8Array(
    await crypto.subtle.sign(ED25519, identity.privateKey, message as BufferSource),
  );
}

/** Verifies a node signature; false (never a throw) for a malformed key or signature. */
export async function verifyNodeSignature(
  publicKey: Uint8Array,
  signature: Uint8Array,
  message: Uint8Array,
): Promise<boolean> {
  if (publicKey.length !== 32 || signature.length !== 64) return false;
  try {
    const key = await crypto.subtle.importKey("raw", publicKey as BufferSource, ED25519, false, [
      "verify",
    ]);
    return await crypto.subtle.verify(
      ED25519,
      key,
      signature as BufferSource,
      message as BufferSource,
    );
  } catch {
    return false;
  }
}
