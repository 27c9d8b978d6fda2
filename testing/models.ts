/**
 * Test fixtures: tiny random-weight models, generated once per checkout into `.cache/` (git
 * ignores it) and reused by every test file. Real llama.cpp loads them; nothing here fakes the
 * runtime.
 */
import { ensureModelFile } from "../models/mod.ts";

const DIR = new URL("../.cache/test-models", import.meta.url).pathname;

/** Path to the test model of `family` (seed 0), made on first use. */
export function testModel(family: string, preset = "tiny"): Promise<string> {
  return ensureModelFile(DIR, { family, preset, seed: 0 });
}

/** The families that have a `lab-state` preset. */
export type LabStateFamily = "hybrid" | "hybrid-moe-mtp";

/**
 * Path to the `lab-state` model of `family` (seed 0): Nemotron 3 Super's 88-layer pattern and
 * exact state dimensions (8,192 B/token F16 KV, 172,687,360 B recurrent state) in about
 * 150 MiB. Made once per checkout into `.cache/test-models` (about 2 s) and shared by tests.
 */
export function labStateModel(family: LabStateFamily = "hybrid"): Promise<string> {
  return testModel(family, "lab-state");
}

/** Deterministic non-special token ids (no tokenizer needed). */
export function testTokens(n: number, nVocab = 950, salt = 0): Int32Array {
  const out = new Int32Array(n);
  for (let i = 0; i < n; i++) out[i] = 3 + ((i * 7919 + salt * 104729) % (nVocab - 3));
  return out;
}
