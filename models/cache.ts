/**
 * Test models made on demand and kept in a folder, named by everything that decides their
 * bytes, so a cached file is reused only when `model make` would write the same one.
 */
import { GENERATOR_VERSION, makeModel } from "./families.ts";
import { writeChunksToFile } from "./gguf_file.ts";

export interface ModelRequest {
  readonly family: string;
  readonly preset?: string;
  readonly seed?: number;
}

/** The file name a request is cached under. */
export function cachedModelName(request: ModelRequest): string {
  const { family, preset = "tiny", seed = 0 } = request;
  return `skippy-${family}-${preset}-seed${seed}-g${GENERATOR_VERSION}.gguf`;
}

/**
 * Returns the path of the requested model in `dir`, making it first if it is missing or has
 * the wrong size. Concurrent callers may both write; each renames a complete file into place,
 * and the bytes are identical.
 */
export async function ensureModelFile(dir: string, request: ModelRequest): Promise<string> {
  const made = makeModel(request); // validates the request before touching the disk
  const path = `${dir}/${cachedModelName(request)}`;
  const stat = await Deno.stat(path).catch(() => null);
  if (stat?.isFile && stat.size === made.layout.totalBytes) return path;
  await Deno.mkdir(dir, { recursive: true });
  await writeChunksToFile(path, made.chunks);
  return path;
}
