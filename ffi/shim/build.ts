/**
 * Builds the native shim for the llama.cpp library of this machine and caches it.
 *
 * The build is keyed by llama.cpp release, the library's build id, the shim ABI version and a
 * digest of the shim's own sources, so a changed library or shim is rebuilt and an unchanged
 * one is reused. Headers come from the registry (see `_headers.ts`); the compiler is `$CXX`,
 * else `c++`, `g++` or `clang++`.
 *
 * Run it by hand with `deno run -A ffi/shim/build.ts` (the root npm `postinstall` does), or let
 * the runtime build on first use.
 */
import { readBinaryId } from "../_binary_id.ts";
import { platformFor } from "../platform.ts";
import { LLAMA_CPP_RELEASE, LLAMA_PACKAGE_VERSION } from "../llama.ts";
import { ensureHeaders, INCLUDE_DIRS, run } from "./_headers.ts";
import { SKIPPY_SHIM_ABI_VERSION } from "./abi.ts";

/** The shim's C++ translation units, in this folder. */
export const SHIM_SOURCES = [
  "skippy_shim.cpp",
  "_internal.cpp",
  "_import.cpp",
  "_facts.cpp",
  "_crc32c.cpp",
  "_recurrent.cpp",
  "_capture.cpp",
] as const;
const SHIM_HEADERS = ["skippy_shim.h", "_internal.h", "_crc32c.h"] as const;

export interface ShimBuildTarget {
  /** Folder of the prebuilt llama.cpp libraries. */
  libDir: string;
  llamaFile: string;
  ggmlBaseFile: string;
  /** GNU build-id / LC_UUID of `llamaFile`, baked into the shim. */
  buildId: string;
}

export interface ShimBuildOptions {
  /** Cache root; default `<repo>/.cache`. */
  cacheDir?: string;
  /** Progress lines (never state); default silent. */
  log?: (line: string) => void;
  /**
   * Try again even when a build for this key failed within `FAILED_RETRY_MS` (the runtime does
   * not, so a machine without a compiler or network does not pay for the attempt every start).
   */
  retryFailed?: boolean;
}

/** How long a failed build is remembered before the runtime tries again. */
export const FAILED_RETRY_MS = 24 * 3600 * 1000;

const HERE = new URL(".", import.meta.url).pathname;

/** `<repo>/.cache`, the project's cache folder. */
export function defaultCacheDir(): string {
  return new URL("../../.cache", import.meta.url).pathname;
}

function libraryFileName(): string {
  return Deno.build.os === "darwin" ? "libskippy_shim.dylib" : "libskippy_shim.so";
}

async function sourcesDigest(): Promise<string> {
  const parts: Uint8Array[] = [];
  for (const f of [...SHIM_SOURCES, ...SHIM_HEADERS]) parts.push(await Deno.readFile(HERE + f));
  const all = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    all.set(p, at);
    at += p.length;
  }
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", all));
  return Array.from(digest.subarray(0, 6), (b) => b.toString(16).padStart(2, "0")).join("");
}

/** Where the shim for `target` lives once built (it may not exist yet). */
export async function shimPath(target: ShimBuildTarget, cacheDir = defaultCacheDir()) {
  const key = `${LLAMA_CPP_RELEASE}-${
    target.buildId.slice(0, 16)
  }-abi${SKIPPY_SHIM_ABI_VERSION}-${await sourcesDigest()}`;
  return `${cacheDir}/shim/${key}/${libraryFileName()}`;
}

async function findCompiler(): Promise<string> {
  const candidates = [Deno.env.get("CXX"), "c++", "g++", "clang++"].filter((c): c is string => !!c);
  for (const cxx of candidates) {
    try {
      await run(cxx, ["--version"]);
      return cxx;
    } catch {
      // try the next one
    }
  }
  throw new Error("no C++ compiler found (set CXX, or install g++ or clang++)");
}

function compileArgs(target: ShimBuildTarget, headers: string, out: string): string[] {
  const lib = (f: string) => `${target.libDir}/${f}`;
  const args = [
    "-std=c++17",
    "-O2",
    "-DNDEBUG",
    "-fPIC",
    "-shared",
    "-fno-access-control",
    "-fvisibility=hidden",
    "-Wall",
    `-DSKIPPY_LLAMA_BUILD_ID="${target.buildId}"`,
    ...INCLUDE_DIRS.map((d) => `-I${headers}/${d}`),
    ...SHIM_SOURCES.map((f) => HERE + f),
    "-o",
    out,
    lib(target.llamaFile),
    lib(target.ggmlBaseFile),
    `-Wl,-rpath,${target.libDir}`,
  ];
  if (Deno.build.os !== "darwin") args.push("-Wl,--no-undefined");
  return args;
}

/**
 * Returns the path of a shim built for `target`, building it first when the cache has none.
 * Throws an Error whose message is one line saying what failed.
 */
export async function buildShim(
  target: ShimBuildTarget,
  options: ShimBuildOptions = {},
): Promise<string> {
  const cacheDir = options.cacheDir ?? defaultCacheDir();
  const log = options.log ?? (() => {});
  const out = await shimPath(target, cacheDir);
  try {
    await Deno.stat(out);
    return out;
  } catch {
    // not built yet
  }
  const failed = `${out}.failed`;
  const previous = await Deno.stat(failed).catch(() => null);
  if (
    !options.retryFailed && previous?.mtime &&
    Date.now() - previous.mtime.getTime() < FAILED_RETRY_MS
  ) {
    throw new Error(
      `${await Deno.readTextFile(failed)} (remembered; run ffi/shim/build.ts to retry)`,
    );
  }
  const dir = out.slice(0, out.lastIndexOf("/"));
  await Deno.mkdir(dir, { recursive: true });
  try {
    const cxx = await findCompiler();
    log(
      `fetching llama.cpp ${LLAMA_CPP_RELEASE} headers (node-llama-cpp@${LLAMA_PACKAGE_VERSION})`,
    );
    const headers = await ensureHeaders(cacheDir);
    const tmp = `${out}.${Deno.pid}.tmp`;
    log(`compiling the shim with ${cxx}`);
    await run(cxx, compileArgs(target, headers, tmp));
    await Deno.rename(tmp, out);
    await Deno.remove(failed).catch(() => {});
    await removeStale(dir);
    return out;
  } catch (error) {
    await Deno.writeTextFile(failed, error instanceof Error ? error.message : String(error));
    throw error;
  }
}

/** Removes shims built from older sources for the same library (siblings of `dir`). */
async function removeStale(dir: string): Promise<void> {
  const parent = dir.slice(0, dir.lastIndexOf("/"));
  const name = dir.slice(parent.length + 1);
  const prefix = name.slice(0, name.lastIndexOf("-") + 1);
  for await (const entry of Deno.readDir(parent)) {
    if (entry.isDirectory && entry.name.startsWith(prefix) && entry.name !== name) {
      await Deno.remove(`${parent}/${entry.name}`, { recursive: true }).catch(() => {});
    }
  }
}

/** The build target of this machine's pinned llama.cpp package. */
export function defaultTarget(): ShimBuildTarget {
  const platform = platformFor(Deno.build.os, Deno.build.arch);
  if (!platform) throw new Error(`no prebuilt llama.cpp for ${Deno.build.os}-${Deno.build.arch}`);
  const root = new URL("../../", import.meta.url).pathname;
  const libDir = Deno.env.get("SKIPPY_LLAMA_LIB_DIR") ??
    `${root}node_modules/${platform.packageName}/bins/${platform.name}`;
  const path = `${libDir}/${platform.llamaFile}`;
  let buildId: string | null;
  try {
    buildId = readBinaryId(Deno.readFileSync(path));
  } catch {
    throw new Error(`cannot read ${path} (run \`npm ci\`)`);
  }
  if (!buildId) throw new Error(`${path} carries no build id`);
  return { libDir, llamaFile: platform.llamaFile, ggmlBaseFile: platform.ggmlBaseFile, buildId };
}

if (import.meta.main) {
  const started = performance.now();
  try {
    const log = (l: string) => console.error(`shim: ${l}`);
    const path = await buildShim(defaultTarget(), { log, retryFailed: true });
    const ms = Math.round(performance.now() - started);
    console.error(`shim: ready at ${path} (${ms} ms)`);
  } catch (error) {
    console.error(`shim: not built: ${error instanceof Error ? error.message : error}`);
    Deno.exit(1);
  }
}
