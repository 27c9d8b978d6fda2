/**
 * Speculative decoding on a repetitive workload (a self-repeating prompt: the suffix proposer
 * fires on it), per decode mode: tokens/s of the decode loop and acceptance per source,
 * colocated vs after an in-process handoff (correctness/speculation.ts; the verdict is
 * checked there too). Random-weight MTP heads accept almost nothing: reported as measured.
 */
import { ensureModelFile, type Family } from "../models/mod.ts";
import {
  type DecodeMode,
  runSpeculationCase,
  type SpeculationCaseResult,
} from "../correctness/speculation.ts";
import type { ReportSection } from "./report.ts";
import { table } from "./stats.ts";

const CASES: [Family, DecodeMode[]][] = [
  ["hybrid", ["target-only", "suffix"]],
  ["hybrid-moe-mtp", ["target-only", "mtp", "suffix", "mtp+suffix"]],
];

function rate(accepted: number, drafted: number): string {
  return drafted === 0 ? "-" : `${accepted}/${drafted}`;
}

export async function speculationSection(
  o: { quick: boolean; modelDir: string },
): Promise<ReportSection> {
  const promptTokens = o.quick ? 512 : 1024;
  const steps = o.quick ? 48 : 96;
  const rows: SpeculationCaseResult[] = [];
  for (const [family, modes] of CASES) {
    for (const mode of modes) {
      rows.push(
        await runSpeculationCase({ family, preset: "tiny", promptTokens, chunkTokens: 512, mode }, {
          steps,
          modelFor: (f, preset) => ensureModelFile(o.modelDir, { family: f, preset, seed: 0 }),
        }),
      );
    }
  }
  return {
    name: "speculation",
    rows,
    table: table(
      [
        "family",
        "mode",
        "verdict",
        "tok/s coloc",
        "tok/s handoff",
        "rounds",
        "mtp acc",
        "suffix acc",
      ],
      rows.map((r) => [
        r.family,
        r.mode,
        r.verdict,
        r.colocatedTokensPerSec ?? 0,
        r.movedTokensPerSec ?? 0,
        r.moved?.counters.rounds ?? 0,
        rate(r.moved?.counters.mtpAccepted ?? 0, r.moved?.counters.mtpDrafted ?? 0),
        rate(r.moved?.counters.suffixAccepted ?? 0, r.moved?.counters.suffixDrafted ?? 0),
      ]),
    ),
    notes: [
      `Tiny random-weight models, ${promptTokens}-token self-repeating prompt, ${steps} greedy tokens, 2 threads; per-session contexts.`,
      "Random-weight MTP heads accept almost no drafts, so MTP modes pay the draft and verify cost without the gain; the suffix proposer accepts only where the text repeats.",
      "tok/s is the decode loop after the first token; the handoff column continues the same loop on the decoder's imported state.",
    ],
    charts: {},
  };
}
