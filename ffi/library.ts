/**
 * Finds, checks and opens the pinned llama.cpp build for this machine.
 *
 * Order matters: the platform package must exist, `libllama` must be the exact build these
 * bindings were written for (build id), every bound symbol must be present, and struct sizes
 * must match the header. Only then is the CPU backend variant chosen (by the plug-ins' own
 * scores, unless the caller names one: the variant changes numerics, so it is part of the
 * numerical identity) and loaded.
 */
import { RuntimeLibraryError } from "../core/errors.ts";
import { readBinaryId } from "./_binary_id.ts";
import {
  EXPECTED_STRUCT_SIZES,
  GGML_BASE_SYMBOLS,
  GGML_CPU_SYMBOLS,
  GGML_CPU_VARIANT_SYMBOLS,
  GGML_SYMBOLS,
  type GgmlBaseSymbols,
  type GgmlCpuSymbols,
  type GgmlSymbols,
  llama_batch,
  llama_context_params,
  LLAMA_CPP_RELEASE,
  llama_model_params,
  LLAMA_PACKAGE_VERSION,
  LLAMA_SYMBOLS,
  type LlamaSymbols,
} from "./llama.ts";
import { type LlamaPlatform, platformFor, supportedPlatforms } from "./platform.ts";
import { installLogger, type NativeLog } from "./_log.ts";

export interface LoadOptions {
  /** Folder holding the libraries; default: the platform package in node_modules. */
  libDir?: string;
  /** CPU backend variant (e.g. "haswell", "zen4"); default: the highest-scoring one. */
  cpuVariant?: string;
  /** Echo native log lines of level warning and above to stderr. */
  verboseNativeLog?: boolean;
}

/** An opened, checked llama.cpp. One per process. */
export interface LlamaLibrary {
  readonly symbols: LlamaSymbols;
  readonly ggml: GgmlBaseSymbols;
  /** `libggml`: backend and device registry (what `devices.ts` enumerates). */
  readonly ggmlRegistry: GgmlSymbols;
  /** Thread-pool entry points of the loaded CPU backend variant. */
  readonly ggmlCpu: GgmlCpuSymbols;
  readonly platform: LlamaPlatform;
  readonly libDir: string;
  /** GNU build-id / LC_UUID of the loaded libllama. */
  readonly buildId: string;
  /** llama.cpp release tag, e.g. "v0.4.0". */
  readonly release: string;
  /** CPU backend variant in use, e.g. "haswell"; part of the numerical identity. */
  readonly cpuVariant: string;
  /** Other backends loaded (metal, blas, ...). */
  readonly extraBackends: string[];
  readonly log: NativeLog;
}

let loaded: LlamaLibrary | null = null;

/**
 * The build as the numerical identity and the certification file name it: `release+buildId`.
 *
 * @example
 * ```ts
 * llamaBuild(loadLlama()); // "v0.4.0+4b5ee46a..."
 * ```
 */
export function llamaBuild(lib: Pick<LlamaLibrary, "release" | "buildId">): string {
  return `${lib.release}+${lib.buildId}`;
}

/** Opens llama.cpp once per process; later calls return the same library. */
export function loadLlama(options: LoadOptions = {}): LlamaLibrary {
  if (loaded) {
    if (options.cpuVariant && options.cpuVariant !== loaded.cpuVariant) {
      throw new RuntimeLibraryError(
        `CPU backend variant "${options.cpuVariant}" requested, but "${loaded.cpuVariant}" is already loaded in this process`,
        { hint: "use one CPU variant per process" },
      );
    }
    return loaded;
  }
  loaded = openLibrary(options);
  return loaded;
}

function openLibrary(options: LoadOptions): LlamaLibrary {
  const platform = platformFor(Deno.build.os, Deno.build.arch);
  if (!platform) {
    throw new RuntimeLibraryError(
      `No prebuilt llama.cpp for this platform ("${Deno.build.os}-${Deno.build.arch}")`,
      { hint: `supported: ${supportedPlatforms()}` },
    );
  }
  const libDir = options.libDir ?? Deno.env.get("SKIPPY_LLAMA_LIB_DIR") ??
    defaultLibDir(platform);
  const buildId = checkBuild(platform, libDir);
  const release = readRelease(libDir);
  const log = installLogger();
  const ggml = open(libDir, platform.ggmlBaseFile, GGML_BASE_SYMBOLS);
  const backends = open(libDir, platform.ggmlFile, GGML_SYMBOLS);
  const llama = open(libDir, platform.llamaFile, LLAMA_SYMBOLS);
  checkStructSizes(llama.symbols);
  log.attach(llama.symbols, options.verboseNativeLog ?? false);
  const cpuVariant = loadCpuVariant(backends.symbols, libDir, options.cpuVariant);
  const extraBackends = loadExtraBackends(backends.symbols, libDir);
  const ggmlCpu = open(libDir, `${CPU_PREFIX}${cpuVariant}${pluginSuffix()}`, GGML_CPU_SYMBOLS);
  llama.symbols.llama_backend_init();
  return {
    symbols: llama.symbols,
    ggml: ggml.symbols,
    ggmlRegistry: backends.symbols,
    ggmlCpu: ggmlCpu.symbols,
    platform,
    libDir,
    buildId,
    release,
    cpuVariant,
    extraBackends,
    log,
  };
}

function defaultLibDir(platform: LlamaPlatform): string {
  const root = new URL("../", import.meta.url).pathname;
  const pkgDir = `${root}node_modules/${platform.packageName}`;
  let version: string | undefined;
  try {
    version = JSON.parse(Deno.readTextFileSync(`${pkgDir}/package.json`)).version;
  } catch {
    throw new RuntimeLibraryError(
      `The llama.cpp package "${platform.packageName}@${LLAMA_PACKAGE_VERSION}" is not installed`,
      { hint: `run \`npm ci\` in ${root} (it installs the package for this platform)` },
    );
  }
  if (version !== LLAMA_PACKAGE_VERSION) {
    throw new RuntimeLibraryError(
      `Found "${platform.packageName}@${version}", expected version ${LLAMA_PACKAGE_VERSION}`,
      { hint: "run `npm ci` to install the pinned version" },
    );
  }
  return `${pkgDir}/bins/${platform.name}`;
}

export function checkBuild(platform: LlamaPlatform, libDir: string): string {
  const path = `${libDir}/${platform.llamaFile}`;
  let bytes: Uint8Array;
  try {
    bytes = Deno.readFileSync(path);
  } catch (cause) {
    throw new RuntimeLibraryError(`Cannot read the llama.cpp library "${path}"`, {
      hint: "run `npm ci`, or point SKIPPY_LLAMA_LIB_DIR at a folder with the pinned build",
      cause,
    });
  }
  const found = readBinaryId(bytes) ?? "none";
  if (found !== platform.buildId) {
    throw new RuntimeLibraryError(
      `"${path}" is not the llama.cpp build these bindings were written for: build id "${found}", expected "${platform.buildId}" (llama.cpp ${LLAMA_CPP_RELEASE} from ${platform.packageName}@${LLAMA_PACKAGE_VERSION})`,
      { hint: "install the pinned package with `npm ci`; other builds have other struct layouts" },
    );
  }
  return found;
}

function readRelease(libDir: string): string {
  try {
    const meta = JSON.parse(Deno.readTextFileSync(`${libDir}/_nlcBuildMetadata.json`));
    return String(meta?.buildOptions?.llamaCpp?.release ?? LLAMA_CPP_RELEASE);
  } catch {
    return LLAMA_CPP_RELEASE;
  }
}

function open<S extends Deno.ForeignLibraryInterface>(
  libDir: string,
  file: string,
  symbols: S,
): Deno.DynamicLibrary<S> {
  try {
    return Deno.dlopen(`${libDir}/${file}`, symbols);
  } catch (cause) {
    const detail = cause instanceof Error ? cause.message : String(cause);
    throw new RuntimeLibraryError(`Cannot open "${libDir}/${file}": ${detail}`, {
      hint: `expected llama.cpp ${LLAMA_CPP_RELEASE} with every bound symbol; run \`npm ci\``,
      cause,
    });
  }
}

function checkStructSizes(symbols: LlamaSymbols): void {
  const found = {
    llama_model_params: symbols.llama_model_default_params().byteLength,
    llama_context_params: symbols.llama_context_default_params().byteLength,
    llama_batch: llama_batch.size,
  };
  const ours = {
    llama_model_params: llama_model_params.size,
    llama_context_params: llama_context_params.size,
    llama_batch: llama_batch.size,
  };
  for (const [name, expected] of Object.entries(EXPECTED_STRUCT_SIZES)) {
    const key = name as keyof typeof EXPECTED_STRUCT_SIZES;
    if (found[key] !== expected || ours[key] !== expected) {
      throw new RuntimeLibraryError(
        `Struct "${name}" is ${found[key]} bytes in the library and ${
          ours[key]
        } in the bindings, expected ${expected}`,
        { hint: "the bindings do not match this llama.cpp build" },
      );
    }
  }
}

const CPU_PREFIX = "libggml-cpu-";

function pluginSuffix(): string {
  return ".so"; // the plug-ins are named .so on macOS too
}

function loadCpuVariant(
  backends: Deno.DynamicLibrary<typeof GGML_SYMBOLS>["symbols"],
  libDir: string,
  requested?: string,
): string {
  const variants: { name: string; path: string; score: number }[] = [];
  for (const entry of Deno.readDirSync(libDir)) {
    if (!entry.name.startsWith(CPU_PREFIX) || !entry.name.endsWith(pluginSuffix())) continue;
    const name = entry.name.slice(CPU_PREFIX.length, -pluginSuffix().length);
    const path = `${libDir}/${entry.name}`;
    variants.push({ name, path, score: scoreVariant(path) });
  }
  const usable = variants.filter((v) => v.score > 0).sort((a, b) => b.score - a.score);
  const chosen = requested ? variants.find((v) => v.name === requested) : usable[0];
  if (!chosen || chosen.score <= 0) {
    const list = usable.map((v) => v.name).join(", ") || "none";
    throw new RuntimeLibraryError(
      requested
        ? `CPU backend variant "${requested}" is not usable on this machine`
        : "No CPU backend variant of llama.cpp is usable on this machine",
      { hint: `usable variants here: ${list}` },
    );
  }
  if (backends.ggml_backend_load(cString(chosen.path)) === null) {
    throw new RuntimeLibraryError(`Cannot load CPU backend "${chosen.path}"`);
  }
  return chosen.name;
}

function scoreVariant(path: string): number {
  try {
    const lib = Deno.dlopen(path, GGML_CPU_VARIANT_SYMBOLS);
    const score = lib.symbols.ggml_backend_score();
    // Keep the library open: closing a plug-in that registered nothing is harmless, but the
    // chosen one is opened again by ggml itself, which shares the same handle.
    lib.close();
    return score;
  } catch {
    return 0;
  }
}

function loadExtraBackends(
  backends: Deno.DynamicLibrary<typeof GGML_SYMBOLS>["symbols"],
  libDir: string,
): string[] {
  const names: string[] = [];
  for (const entry of Deno.readDirSync(libDir)) {
    const match = /^libggml-([a-z0-9_]+)\.so$/.exec(entry.name);
    if (!match || entry.name.startsWith(CPU_PREFIX) || match[1] === "base") continue;
    if (backends.ggml_backend_load(cString(`${libDir}/${entry.name}`)) !== null) {
      names.push(match[1]);
    }
  }
  return names.sort();
}

/** NUL-terminated UTF-8 for `const char *` parameters. */
export function cString(s: string): Uint8Array<ArrayBuffer> {
  const bytes = new TextEncoder().encode(s);
  const out = new Uint8Array(bytes.length + 1);
  out.set(bytes);
  return out;
}

/** Reads a C string result (null -> ""). */
export function readCString(ptr: Deno.PointerValue): string {
  return ptr === null ? "" : new Deno.UnsafePointerView(ptr).getCString();
}
