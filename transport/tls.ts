/**
 * The node's TLS certificate for QUIC: self-signed, ECDSA P-256, `CA:FALSE` (Deno refuses a
 * self-signed `CA:TRUE` leaf), created on first start and kept in the state directory.
 *
 * Peers do not trust it through a CA: a client pins the exact certificate by its SHA-256
 * fingerprint (see quic.ts), and authentication signs that fingerprint (see auth.ts). The
 * certificate therefore must stay stable; it is valid for ten years and never silently
 * replaced, because a new one would break every peer's pin.
 */
import { InputFileError, UsageError } from "../core/errors.ts";
import { hex, parseHex } from "./_encoding.ts";
import type { JsonGeneralName } from "@peculiar/x509";

/**
 * @peculiar/x509 (with its polyfill) loads on first use, not with the transport: most
 * processes and test files that import the transport never touch a certificate.
 */
const _x509 = () => import("./_x509.ts").then((m) => m.x509);
import { assertOwnerOnly } from "./node_identity.ts";
import { ensureStateDir, readTextIfExists, statePath, writePrivateFile } from "./state_dir.ts";

const CERT_FILE = "tls-cert.pem";
const KEY_FILE = "tls-key.pem";
const VALIDITY_DAYS = 3650;
const ECDSA_P256 = { name: "ECDSA", namedCurve: "P-256", hash: "SHA-256" } as const;

/** A certificate with its private key, ready for `QuicEndpoint.listen()`. */
export interface TlsCertificate {
  certPem: string;
  keyPem: string;
  /** SHA-256 of the DER certificate: the pin. */
  sha256: Uint8Array;
  /** `sha256` as lowercase hex. */
  fingerprint: string;
  notAfter: Date;
}

/** Lowercase hex of a certificate hash. */
export function formatFingerprint(sha256: Uint8Array): string {
  return hex(sha256);
}

/** Parses a SHA-256 fingerprint in hex (colons allowed); throws UsageError if malformed. */
export function parseFingerprint(text: string): Uint8Array {
  const raw = parseHex(text.trim().replace(/^sha256:/i, ""));
  if (!raw || raw.length !== 32) {
    throw new UsageError(`Invalid certificate fingerprint "${text.slice(0, 80)}"`, {
      hint: "expected 64 hex characters, as printed by `skippy-disagg identity show`",
    });
  }
  return raw;
}

function _isIp(host: string): boolean {
  return /^\d{1,3}(\.\d{1,3}){3}$/.test(host) || host.includes(":");
}

function _subjectAltNames(hostnames: string[]): JsonGeneralName[] {
  const names = new Set(["localhost", "127.0.0.1", "::1", ...hostnames]);
  names.delete("0.0.0.0");
  names.delete("::");
  return [...names].map((value) => ({ type: _isIp(value) ? "ip" : "dns", value }));
}

async function _fromPem(certPem: string, keyPem: string): Promise<TlsCertificate> {
  const x509 = await _x509();
  const certificate = new x509.X509Certificate(certPem);
  const sha256 = new Uint8Array(await crypto.subtle.digest("SHA-256", certificate.rawData));
  return {
    certPem,
    keyPem,
    sha256,
    fingerprint: formatFingerprint(sha256),
    notAfter: certificate.notAfter,
  };
}

/** Creates a certificate without storing it: for tests and benchmarks. */
export async function createEphemeralTlsCertificate(
  hostnames: string[] = [],
): Promise<TlsCertificate> {
  const keys = await crypto.subtle.generateKey(ECDSA_P256, true, [
    "sign",
    "verify",
  ]) as CryptoKeyPair;
  const now = Date.now();
  const x509 = await _x509();
  const certificate = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: hex(crypto.getRandomValues(new Uint8Array(16))).replace(/^[89a-f]/, "7"),
    name: "CN=skippy-disagg node",
    notBefore: new Date(now - 3600_000), // tolerate clock skew between peers
    notAfter: new Date(now + VALIDITY_DAYS * 86_400_000),
    keys,
    signingAlgorithm: ECDSA_P256,
    extensions: [
      new x509.BasicConstraintsExtension(false, undefined, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature, true),
      new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth]),
      new x509.SubjectAlternativeNameExtension(_subjectAltNames(hostnames)),
    ],
  });
  const pkcs8 = await crypto.subtle.exportKey("pkcs8", keys.privateKey);
  return await _fromPem(
    certificate.toString("pem"),
    x509.PemConverter.encode(pkcs8, "PRIVATE KEY"),
  );
}

/**
 * Loads the node's certificate from `stateDir`, creating it on first start with SANs for
 * localhost, 127.0.0.1, ::1 and `hostnames`. An existing certificate is kept even if the
 * listen host changed: clients pin the hash, not the name.
 */
export async function loadOrCreateTlsCertificate(
  stateDir: string,
  options: { hostnames?: string[] } = {},
): Promise<{ certificate: TlsCertificate; created: boolean }> {
  const certPath = statePath(stateDir, CERT_FILE);
  const keyPath = statePath(stateDir, KEY_FILE);
  const [certPem, keyPem] = [await readTextIfExists(certPath), await readTextIfExists(keyPath)];
  if (certPem === null || keyPem === null) {
    await ensureStateDir(stateDir);
    const certificate = await createEphemeralTlsCertificate(options.hostnames);
    await writePrivateFile(keyPath, certificate.keyPem);
    await writePrivateFile(certPath, certificate.certPem);
    return { certificate, created: true };
  }
  await assertOwnerOnly(keyPath);
  let certificate: TlsCertificate;
  try {
    certificate = await _fromPem(certPem, keyPem);
  } catch (error) {
    throw new InputFileError(
      `Cannot load TLS certificate "${certPath}": ${(error as Error).message}`,
      {
        hint:
          `delete "${certPath}" and "${keyPath}" to create a new one (peers must then re-pin it)`,
        cause: error,
      },
    );
  }
  if (certificate.notAfter.getTime() < Date.now()) {
    throw new InputFileError(
      `TLS certificate "${certPath}" expired on ${certificate.notAfter.toISOString()}`,
      {
        hint: `delete "${certPath}" and "${keyPath}" to create a new one, then re-share ` +
          "`skippy-disagg identity show` with your peers",
      },
    );
  }
  return { certificate, created: false };
}
