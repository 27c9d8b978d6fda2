/**
 * The default model: a tiny random-weight hybrid (nemotron_h) made on first use in the user's
 * cache folder, so the main job needs no manual step.
 */
export async function defaultModelPath(): Promise<string> {
  throw new Error("not yet");
}
