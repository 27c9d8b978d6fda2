/**
 * The default model: a tiny random-weight hybrid (nemotron_h: Mamba2 + attention + MLP) made
 * on first use in the user's cache folder, so the main job needs no manual step.
 */
import { ensureModelFile } from "../models/mod.ts";
import { cacheDir } from "./paths.ts";

export const DEFAULT_MODEL = { family: "hybrid", preset: "tiny", seed: 1 } as const;

export function defaultModelPath(): Promise<string> {
  return ensureModelFile(`${cacheDir()}/models`, DEFAULT_MODEL);
}
