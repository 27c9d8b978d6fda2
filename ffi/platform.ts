/**
 * Which prebuilt llama.cpp package serves this machine, and what its files must be.
 *
 * Every platform uses the same pinned package version (`LLAMA_PACKAGE_VERSION`, llama.cpp
 * v0.4.0), so Linux and macOS run the same llama.cpp. `buildId` is the GNU build-id (ELF) or
 * LC_UUID (Mach-O) of that exact `libllama`, read from the published packages: the loader
 * refuses any other build, because struct layouts and the native shim depend on it.
 */
import { LLAMA_PACKAGE_VERSION } from "./llama.ts";

export interface LlamaPlatform {
  /** Our name for it, also the folder under `bins/` in the package. */
  name: string;
  /** npm package that carries the libraries. */
  packageName: string;
  llamaFile: string;
  ggmlFile: string;
  ggmlBaseFile: string;
  /** Expected build identity of `llamaFile`. */
  buildId: string;
}

const PLATFORMS: Record<string, LlamaPlatform> = {
  "linux-x86_64": {
    name: "linux-x64",
    packageName: "@node-llama-cpp/linux-x64",
    llamaFile: "libllama.v0.4.0.so",
    ggmlFile: "libggml.v0.4.0.so",
    ggmlBaseFile: "libggml-base.so",
    buildId: "4b5ee46ab9d336ed7148c32199516ee3e01ac3ac",
  },
  "linux-aarch64": {
    name: "linux-arm64",
    packageName: "@node-llama-cpp/linux-arm64",
    llamaFile: "libllama.v0.4.0.so",
    ggmlFile: "libggml.v0.4.0.so",
    ggmlBaseFile: "libggml-base.so",
    buildId: "261370876a1df65d1a9f28d1bb8d73883f4a6581",
  },
  "darwin-aarch64": {
    name: "mac-arm64-metal",
    packageName: "@node-llama-cpp/mac-arm64-metal",
    llamaFile: "libllama.metal.v0.4.0.dylib",
    ggmlFile: "libggml.metal.v0.4.0.dylib",
    ggmlBaseFile: "libggml-base.dylib",
    buildId: "70ef7da460b13e2499abe800baa35b4b",
  },
  "darwin-x86_64": {
    name: "mac-x64",
    packageName: "@node-llama-cpp/mac-x64",
    llamaFile: "libllama.v0.4.0.dylib",
    ggmlFile: "libggml.v0.4.0.dylib",
    ggmlBaseFile: "libggml-base.dylib",
    buildId: "8bd5480149573669af95a2b6f5f3c1dd",
  },
};

/** The platform entry for `os`/`arch` (Deno.build values), or null when unsupported. */
export function platformFor(os: string, arch: string): LlamaPlatform | null {
  return PLATFORMS[`${os}-${arch}`] ?? null;
}

/** Human list of supported platforms, for error messages. */
export function supportedPlatforms(): string {
  return Object.values(PLATFORMS).map((p) => `${p.packageName}@${LLAMA_PACKAGE_VERSION}`).join(
    ", ",
  );
}
