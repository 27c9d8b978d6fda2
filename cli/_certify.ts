/**
 * Writes the certification file after `correctness state-handoff --certify`: a family whose
 * every case was exact on this llama.cpp build gets an entry; a family with any failure loses
 * its entry for this build. The planner reads the file (`core/certification.ts`).
 */
import {
  type CertificationFile,
  emptyCertification,
  parseCertification,
  withCertification,
  withoutCertification,
} from "../core/certification.ts";
import { isModelFamily } from "../core/schema.ts";
import { llamaBuild, loadLlama } from "../ffi/mod.ts";
import { cacheDir } from "./paths.ts";

/** Where `--certify` writes and `plan` reads when no file is named. */
export function defaultCertificationPath(): string {
  return `${cacheDir()}/certification.json`;
}

/** Updates `path` from the run's results; returns the families now certified and revoked. */
export async function writeCertification(
  path: string,
  results: readonly { family: string; promptTokens: number; ok: boolean }[],
): Promise<{ certified: string[]; revoked: string[] }> {
  const lib = loadLlama();
  const thisBuild = llamaBuild(lib);
  let cert: CertificationFile;
  try {
    cert = parseCertification(JSON.parse(await Deno.readTextFile(path)), path);
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) throw error;
    cert = emptyCertification();
  }
  const certified: string[] = [], revoked: string[] = [];
  for (const family of new Set(results.map((r) => r.family))) {
    if (!isModelFamily(family)) continue;
    const mine = results.filter((r) => r.family === family);
    if (mine.every((r) => r.ok)) {
      cert = withCertification(cert, {
        family,
        llamaBuild: thisBuild,
        gate: "state-handoff",
        cases: mine.length,
        promptTokens: [...new Set(mine.map((r) => r.promptTokens))].sort((a, b) => a - b),
        certifiedAt: new Date().toISOString(),
      });
      certified.push(family);
    } else {
      cert = withoutCertification(cert, family, thisBuild);
      revoked.push(family);
    }
  }
  await Deno.mkdir(path.replace(/\/[^/]*$/, "") || ".", { recursive: true });
  await Deno.writeTextFile(path, JSON.stringify(cert, null, 2) + "\n");
  return { certified, revoked };
}
