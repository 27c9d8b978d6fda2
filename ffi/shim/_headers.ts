/**
 * Fetches the internal llama.cpp headers the shim is compiled against, from the npm registry,
 * never from this repository: `npm pack node-llama-cpp@<pinned>` (the package that ships the
 * same llama.cpp commit as our prebuilt library), verify the tarball against a pinned sha512,
 * extract `llama/gitRelease.bundle`, check the bundle's commit, and copy only the headers the
 * shim includes into a cache folder.
 */
import { LLAMA_CPP_RELEASE, LLAMA_PACKAGE_VERSION } from "../llama.ts";

/** npm integrity of `node-llama-cpp@3.21.1` (the registry's `dist.integrity`). */
export const SOURCE_PACKAGE_INTEGRITY =
  "sha512-E3N0Ev2Va0wzydvXYFwM9Hvyo07PoWjt8T/9GMc43Cvt8YkV/NU/tYUgEMC1grTPv2o9PRjQi0G3Wb5P/awiMg==";
/** The llama.cpp commit inside that package's git bundle. */
export const SOURCE_COMMIT = "80fb11ac73e66d89eae2c6a91d8a77428fa733ed";

/** Every header the shim's translation units include (g++ -MM), relative to the source root. */
export const LLAMA_HEADERS = [
  "include/llama.h",
  "ggml/include/ggml.h",
  "ggml/include/ggml-alloc.h",
  "ggml/include/ggml-backend.h",
  "ggml/include/ggml-cpp.h",
  "ggml/include/ggml-cpu.h",
  "ggml/include/ggml-opt.h",
  "ggml/include/gguf.h",
  "src/llama-adapter.h",
  "src/llama-arch.h",
  "src/llama-batch.h",
  "src/llama-context.h",
  "src/llama-cparams.h",
  "src/llama-ext.h",
  "src/llama-graph.h",
  "src/llama-hparams.h",
  "src/llama-impl.h",
  "src/llama-io.h",
  "src/llama-kv-cache.h",
  "src/llama-kv-cache-iswa.h",
  "src/llama-kv-cells.h",
  "src/llama-memory.h",
  "src/llama-memory-hybrid.h",
  "src/llama-memory-recurrent.h",
] as const;

/** Include folders (relative to the headers folder) for the compiler's `-I`. */
export const INCLUDE_DIRS = ["include", "src", "ggml/include"] as const;

/** Longest any one build step (download, clone, compile) may take. */
export const STEP_TIMEOUT_MS = 180_000;

/** Runs a command; throws with its last stderr line on failure or timeout. */
export async function run(cmd: string, args: string[], cwd?: string): Promise<string> {
  let out: Deno.CommandOutput;
  const signal = AbortSignal.timeout(STEP_TIMEOUT_MS);
  try {
    out = await new Deno.Command(cmd, { args, cwd, stdout: "piped", stderr: "piped", signal })
      .output();
  } catch (cause) {
    throw new Error(`cannot run ${cmd}: ${cause instanceof Error ? cause.message : cause}`);
  }
  if (!out.success) {
    const err = new TextDecoder().decode(out.stderr).trim().split("\n").at(-1) ?? "";
    throw new Error(`${cmd} ${args[0] ?? ""} failed (exit ${out.code}): ${err}`);
  }
  return new TextDecoder().decode(out.stdout);
}

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.stat(path);
    return true;
  } catch {
    return false;
  }
}

async function integrityOf(path: string): Promise<string> {
  const digest = await crypto.subtle.digest("SHA-512", await Deno.readFile(path));
  let bin = "";
  for (const b of new Uint8Array(digest)) bin += String.fromCharCode(b);
  return `sha512-${btoa(bin)}`;
}

/** Downloads (once) and verifies the source package; returns the tarball path. */
async function sourceTarball(dir: string): Promise<string> {
  const tgz = `${dir}/node-llama-cpp-${LLAMA_PACKAGE_VERSION}.tgz`;
  if (!await exists(tgz)) {
    await Deno.mkdir(dir, { recursive: true });
    await run("npm", [
      "pack",
      `node-llama-cpp@${LLAMA_PACKAGE_VERSION}`,
      "--pack-destination",
      dir,
      "--silent",
    ]);
  }
  if (await integrityOf(tgz) !== SOURCE_PACKAGE_INTEGRITY) {
    await Deno.remove(tgz).catch(() => {});
    throw new Error(`node-llama-cpp@${LLAMA_PACKAGE_VERSION} does not match its pinned sha512`);
  }
  return tgz;
}

/**
 * Makes sure `<cacheDir>/llama-headers/<release>` holds the headers; returns that folder.
 * Idempotent and safe to interrupt: the folder appears (by rename) only when complete.
 */
export async function ensureHeaders(cacheDir: string): Promise<string> {
  // The folder name carries the header count, so a longer list is fetched again, not reused.
  const target = `${cacheDir}/llama-headers/${LLAMA_CPP_RELEASE}-${
    SOURCE_COMMIT.slice(0, 12)
  }-h${LLAMA_HEADERS.length}`;
  if (await exists(`${target}/.complete`)) return target;
  const work = `${cacheDir}/llama-headers/.work-${Deno.pid}`;
  await Deno.remove(work, { recursive: true }).catch(() => {});
  await Deno.mkdir(work, { recursive: true });
  try {
    const tgz = await sourceTarball(`${cacheDir}/npm`);
    await run("tar", ["-xzf", tgz, "-C", work, "package/llama/gitRelease.bundle"]);
    const repo = `${work}/repo`;
    await run("git", [
      "clone",
      "--quiet",
      "--no-checkout",
      `${work}/package/llama/gitRelease.bundle`,
      repo,
    ]);
    const head = (await run("git", ["-C", repo, "rev-parse", "HEAD"])).trim();
    if (head !== SOURCE_COMMIT) {
      throw new Error(`the llama.cpp bundle is at commit ${head}, expected ${SOURCE_COMMIT}`);
    }
    const out = `${work}/headers`;
    await Deno.mkdir(out, { recursive: true });
    await run("sh", [
      "-c",
      `git -C "$0" archive --format=tar HEAD "$@" | tar -x -C "${out}"`,
      repo,
      ...LLAMA_HEADERS,
    ]);
    await Deno.writeTextFile(`${out}/.complete`, `${SOURCE_COMMIT}\n`);
    await Deno.remove(target, { recursive: true }).catch(() => {});
    await Deno.rename(out, target);
    return target;
  } finally {
    await Deno.remove(work, { recursive: true }).catch(() => {});
  }
}
