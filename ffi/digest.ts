/**
 * Identity digests of a loaded model: the file digest (streamed SHA-256, computed once per
 * loaded model and cached on disk by path, size and modification time so a multi-GB model is
 * not re-read at every start) and the tokenizer digest (computed from what the runtime
 * actually loaded: every token's text, score and attributes, plus BOS/EOS/add-BOS).
 *
 * These digests identify files, not requests: they never depend on prompt content.
 */
import { createHash } from "node:crypto";
import type { LlamaModel } from "./model.ts";

/** Read size per step while hashing a model file. */
export const DIGEST_READ_BYTES = 8 * 1024 * 1024;

interface DigestCacheEntry {
  size: number;
  mtimeMs: number;
  sha256: string;
}

/** SHA-256 of a file, streamed; cached in `cacheFile` (JSON) when given. */
export async function fileDigest(path: string, cacheFile?: string): Promise<string> {
  const real = await Deno.realPath(path);
  const stat = await Deno.stat(real);
  const mtimeMs = stat.mtime?.getTime() ?? 0;
  const cache = cacheFile ? await readCache(cacheFile) : {};
  const hit = cache[real];
  if (hit && hit.size === stat.size && hit.mtimeMs === mtimeMs) return hit.sha256;
  const hash = createHash("sha256");
  using file = await Deno.open(real, { read: true });
  const buf = new Uint8Array(DIGEST_READ_BYTES);
  for (;;) {
    const n = await file.read(buf);
    if (n === null) break;
    hash.update(buf.subarray(0, n));
  }
  const sha256 = hash.digest("hex");
  if (cacheFile) {
    cache[real] = { size: stat.size, mtimeMs, sha256 };
    await writeCache(cacheFile, cache);
  }
  return sha256;
}

async function readCache(cacheFile: string): Promise<Record<string, DigestCacheEntry>> {
  try {
    return JSON.parse(await Deno.readTextFile(cacheFile));
  } catch {
    return {};
  }
}

async function writeCache(cacheFile: string, cache: Record<string, DigestCacheEntry>) {
  try {
    const dir = cacheFile.slice(0, cacheFile.lastIndexOf("/"));
    if (dir) await Deno.mkdir(dir, { recursive: true });
    const tmp = `${cacheFile}.${Deno.pid}.tmp`;
    await Deno.writeTextFile(tmp, JSON.stringify(cache));
    await Deno.rename(tmp, cacheFile);
  } catch {
    // The cache is an optimisation; failing to write it only costs a re-hash next time.
  }
}

/** SHA-256 over the tokenizer as loaded by llama.cpp. */
export function tokenizerDigest(model: LlamaModel): string {
  const s = model.lib.symbols;
  const vocab = model.vocab.ptr;
  const hash = createHash("sha256");
  const n = model.vocab.nTokens;
  hash.update(`type=${s.llama_vocab_type(vocab)};n=${n};bos=${model.vocab.bos};`);
  hash.update(`eos=${model.vocab.eos};add_bos=${model.vocab.addBos};`);
  const scoreBuf = new DataView(new ArrayBuffer(4));
  for (let id = 0; id < n; id++) {
    const text = s.llama_vocab_get_text(vocab, id);
    if (text !== null) hash.update(new Deno.UnsafePointerView(text).getCString());
    hash.update("\u0000");
    scoreBuf.setUint32(0, s.llama_vocab_is_control(vocab, id) ? 1 : 0, true);
    hash.update(new Uint8Array(scoreBuf.buffer));
  }
  return hash.digest("hex");
}
