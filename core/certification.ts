/**
 * The certification file: which model families passed the exact state-handoff gate
 * (`correctness state-handoff --certify <file>`) on which llama.cpp build. The planner never
 * disaggregates a family automatically unless this file says it was certified on the build
 * both workers run: a continuation that is not bit-exact must never be chosen silently.
 *
 * Pure: parsing, merging and lookup. Reading and writing the file happen in `cli/`.
 *
 * @module
 */
import { UsageError } from "./errors.ts";
import { isModelFamily, type ModelFamily } from "./schema.ts";

/** File version. Changelog: 1. First version. */
export const CERTIFICATION_FILE_VERSION = 1;

/** Entries kept in one file (one per family and build). */
export const CERTIFICATION_ENTRIES_MAX = 256;

/** One family certified on one build. */
export interface CertificationEntry {
  family: ModelFamily;
  /** `release+buildId` of llama.cpp, as in the numerical identity's `llamaBuild`. */
  llamaBuild: string;
  /** The gate that passed. */
  gate: "state-handoff";
  /** Cases run and cases exact (all of them, or there is no entry). */
  cases: number;
  /** Prompt lengths covered. */
  promptTokens: number[];
  /** ISO 8601 time of the run (informational; never compared). */
  certifiedAt: string;
}

export interface CertificationFile {
  version: typeof CERTIFICATION_FILE_VERSION;
  entries: CertificationEntry[];
}

/** An empty file. */
export function emptyCertification(): CertificationFile {
  return { version: CERTIFICATION_FILE_VERSION, entries: [] };
}

/**
 * Validates a parsed certification file. Throws UsageError naming the first bad field.
 *
 * @example
 * ```ts
 * const cert = parseCertification(JSON.parse(text), "certification.json");
 * isCertified(cert, "hybrid", identity.llamaBuild); // true or false
 * ```
 */
export function parseCertification(
  json: unknown,
  fileName = "certification file",
): CertificationFile {
  const bad = (what: string) =>
    new UsageError(
      `Invalid ${fileName}: ${what}. Rewrite it with \`correctness state-handoff --certify ${fileName}\``,
    );
  if (typeof json !== "object" || json === null) throw bad("not a JSON object");
  const j = json as Record<string, unknown>;
  if (j.version !== CERTIFICATION_FILE_VERSION) {
    throw bad(`version ${String(j.version)} is not ${CERTIFICATION_FILE_VERSION}`);
  }
  if (!Array.isArray(j.entries) || j.entries.length > CERTIFICATION_ENTRIES_MAX) {
    throw bad(`"entries" is not a list of at most ${CERTIFICATION_ENTRIES_MAX}`);
  }
  const entries = j.entries.map((e, k): CertificationEntry => {
    if (typeof e !== "object" || e === null) throw bad(`entries[${k}] is not an object`);
    if (!isModelFamily(e.family)) {
      throw bad(`entries[${k}].family ${JSON.stringify(e.family)} is unknown`);
    }
    if (typeof e.llamaBuild !== "string" || !e.llamaBuild) {
      throw bad(`entries[${k}] has no llamaBuild`);
    }
    if (e.gate !== "state-handoff") throw bad(`entries[${k}].gate is not "state-handoff"`);
    if (!(Number.isInteger(e.cases) && e.cases > 0)) {
      throw bad(`entries[${k}].cases is not a positive integer`);
    }
    return {
      family: e.family,
      llamaBuild: e.llamaBuild,
      gate: "state-handoff",
      cases: e.cases,
      promptTokens: Array.isArray(e.promptTokens) ? e.promptTokens.filter(Number.isInteger) : [],
      certifiedAt: typeof e.certifiedAt === "string" ? e.certifiedAt : "",
    };
  });
  return { version: CERTIFICATION_FILE_VERSION, entries };
}

/** Whether `family` passed the gate on `llamaBuild`. A null file certifies nothing. */
export function isCertified(
  cert: CertificationFile | null,
  family: string,
  llamaBuild: string,
): boolean {
  return cert?.entries.some((e) => e.family === family && e.llamaBuild === llamaBuild) ?? false;
}

/** The file with `entry` added, replacing any entry of the same family and build. */
export function withCertification(
  cert: CertificationFile,
  entry: CertificationEntry,
): CertificationFile {
  const rest = cert.entries.filter((e) =>
    !(e.family === entry.family && e.llamaBuild === entry.llamaBuild)
  );
  if (rest.length >= CERTIFICATION_ENTRIES_MAX) {
    throw new UsageError(
      `Certification file is full (${CERTIFICATION_ENTRIES_MAX} entries): start a new one`,
    );
  }
  return { version: CERTIFICATION_FILE_VERSION, entries: [...rest, entry] };
}

/** The file without the entry of `family` on `llamaBuild` (a failed run revokes it). */
export function withoutCertification(
  cert: CertificationFile,
  family: string,
  llamaBuild: string,
): CertificationFile {
  return {
    version: CERTIFICATION_FILE_VERSION,
    entries: cert.entries.filter((e) => !(e.family === family && e.llamaBuild === llamaBuild)),
  };
}
