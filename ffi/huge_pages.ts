/**
 * Transparent huge pages for llama.cpp's memory (Linux). A decode streams the whole recurrent
 * state and the weights once per token; on lab-state that is hundreds of MB, and the first
 * decode after a prefill chunk walked it in 4 KiB pages at 6-9x its steady time on this
 * project's machines (a PVM guest, where memory that other work has displaced is expensive to
 * walk again page by page). Two levels (docs/bench-report/lab/, runs 15-17), lab-state, one
 * thread, a step in a loop 29-36 ms:
 *
 * - `adviseNewMappings` (`--huge-pages on`, without the tunable): `MADV_HUGEPAGE` on the
 *   mappings a context allocated, then `MADV_COLLAPSE` for the pages `llama_init_from_model`
 *   already touched. The first decode after a 485-token prefill: 81-100 ms instead of 257-262.
 *   Since 2026-12-05 the weights too are read into memory and advised, and each 2 MiB unit is
 *   collapsed on its own: the first decode after a 512-token prefill 36-38 ms, steady 33-45
 *   (without huge pages 64-85 and 35-57; docs/bench-report/lab/, "Huge pages").
 * - `MALLOC_HUGE_PAGES_TUNABLE`, where the process started with it (workers this project starts
 *   get it) and glibc took it (`mallocHugePages`, which checks): every buffer is huge from its
 *   first touch, and the weights are read into such memory instead of mapped from the file
 *   (`ModelLoadOptions.hugePages`): 34 ms, no penalty.
 *
 * Placement only: the bytes, and so the numerics, are the same; nothing here is part of the
 * numerical identity. Where the kernel has no THP, or it is off (`never`), or this is not Linux,
 * nothing is advised and `reason` says why.
 */

import { sayOnce } from "../core/say_once.ts";

/** A mapping of this process: [start, end) in bytes. */
export interface Region {
  start: bigint;
  end: bigint;
}

/** What was asked of the kernel for one context (`adviseNewMappings`). */
export interface HugePageAdvice {
  /** Bytes asked to be backed by huge pages (whole 2 MiB units only). */
  advisedBytes: number;
  /** Of those, bytes collapsed into huge pages at once (the rest as they are touched next). */
  collapsedBytes: number;
  /** Why nothing was advised, or null. */
  reason: string | null;
}

const HUGE = 2n * 1024n * 1024n;
const MADV_HUGEPAGE = 14;
const MADV_COLLAPSE = 25;
const THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled";

/**
 * Anonymous read-write mappings in `/proc/self/maps` text (no file, no `[stack]` or other named
 * region): where malloc and ggml put large buffers.
 *
 * @example
 * ```ts
 * anonymousRegions("7f00-7f80 rw-p 00000000 00:00 0 \n"); // [{ start: 0x7f00n, end: 0x7f80n }]
 * ```
 */
export function anonymousRegions(maps: string): Region[] {
  const out: Region[] = [];
  for (const line of maps.split("\n")) {
    const m = line.match(/^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ (\d+)\s*(.*)$/);
    if (!m || !m[3].startsWith("rw") || m[4] !== "0" || m[5].trim() !== "") continue;
    out.push({ start: BigInt("0x" + m[1]), end: BigInt("0x" + m[2]) });
  }
  return out;
}

/**
 * The whole 2 MiB units of the regions in `after` that are not in `before` (new, or grown or
 * cut since), each at least `minBytes` long.
 */
export function newHugeSpans(before: Region[], after: Region[], minBytes = HUGE): Region[] {
  const old = new Set(before.map((r) => `${r.start}-${r.end}`));
  const spans: Region[] = [];
  for (const r of after) {
    if (old.has(`${r.start}-${r.end}`)) continue;
    const start = (r.start + HUGE - 1n) / HUGE * HUGE;
    const end = r.end / HUGE * HUGE;
    if (end - start >= minBytes) spans.push({ start, end });
  }
  return spans;
}

/** This process's anonymous mappings now, or null where there is no `/proc/self/maps`. */
export function regionsNow(): Region[] | null {
  if (Deno.build.os !== "linux") return null;
  try {
    return anonymousRegions(Deno.readTextFileSync("/proc/self/maps"));
  } catch {
    return null;
  }
}

const LIBC = {
  // Collapsing copies pages (about 300 ms for lab-state's 380 MB here): off the JS thread.
  madvise: { parameters: ["usize", "usize", "i32"], result: "i32", nonblocking: true },
  malloc: { parameters: ["usize"], result: "pointer" },
  free: { parameters: ["pointer"], result: "void" },
} as const;
let libc: Deno.DynamicLibrary<typeof LIBC> | null | undefined;

/** glibc, or null where there is none (nothing is advised, and the tunable does not apply). */
function glibc(): Deno.DynamicLibrary<typeof LIBC> | null {
  if (libc === undefined) {
    try {
      libc = Deno.dlopen("libc.so.6", LIBC);
    } catch {
      libc = null;
    }
  }
  return libc;
}

/** True when the kernel took the advice; false when it refused, or there is no glibc to ask. */
async function madvise(span: Region, advice: number): Promise<boolean> {
  const c = glibc();
  if (c === null) return false;
  return await c.symbols.madvise(span.start, span.end - span.start, advice) === 0;
}

/**
 * The glibc tunable (glibc 2.35+) under which malloc asks for huge pages on every region it maps,
 * before anything touches it: llama.cpp's buffers, and weights read into memory, are then huge
 * from the start, which advising after `llama_init_from_model` (which clears them) cannot give.
 * Read at process start, so it is set for child workers (serve/local_cluster.ts) and named for
 * a `serve` started without it.
 */
export const MALLOC_HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb=1";

/** True when this process started with `MALLOC_HUGE_PAGES_TUNABLE` (Linux only). */
export function mallocHugePagesAsked(): boolean {
  if (Deno.build.os !== "linux") return false;
  return (Deno.env.get("GLIBC_TUNABLES") ?? "").split(":").includes(MALLOC_HUGE_PAGES_TUNABLE);
}

/**
 * True when malloc asks for huge pages on what it maps in this process: it started with
 * `MALLOC_HUGE_PAGES_TUNABLE`, and a mapping malloc makes carries the kernel's huge-page advice.
 * The tunable alone does not say so: glibc decides once per process, at its first allocation,
 * from the THP mode it reads, and glibc 2.36 compares that text in a buffer it never terminates,
 * so with the tunable set six of ten worker processes here got no huge pages at all (workers of
 * one cluster differed; docs/bench-report/lab/, "Huge pages"). Where it did not take, huge pages are asked
 * for per mapping instead (`adviseNewMappings`, `ModelLoadOptions.hugePages`).
 */
export function mallocHugePages(): boolean {
  if (!mallocHugePagesAsked()) return false;
  mallocAdvises ??= mallocMapsHuge();
  if (!mallocAdvises) {
    sayOnce(
      `huge pages: glibc did not take ${MALLOC_HUGE_PAGES_TUNABLE} in this process (glibc 2.36 ` +
        "can misread the THP mode at its first allocation); each context and the weights are " +
        "advised after they are allocated instead",
    );
  }
  return mallocAdvises;
}

let mallocAdvises: boolean | undefined;

/**
 * The size of the allocation that tells whether malloc advises: above glibc's largest mmap
 * threshold (32 MiB) and a thread arena's heap (64 MiB), so malloc maps it afresh. Never touched:
 * it costs address space only.
 */
const MALLOC_PROBE_BYTES = 65 * 1024 * 1024;

/** Whether a fresh malloc mapping of this process carries the huge-page advice. */
function mallocMapsHuge(): boolean {
  const c = glibc();
  if (c === null) return false;
  const ptr = c.symbols.malloc(BigInt(MALLOC_PROBE_BYTES));
  if (ptr === null) return false;
  try {
    return advisedHuge(
      Deno.readTextFileSync("/proc/self/smaps"),
      BigInt(Deno.UnsafePointer.value(ptr)),
    ) === true;
  } catch {
    return false;
  } finally {
    c.symbols.free(ptr);
  }
}

/**
 * The entry of the mapping holding `address` in `/proc/self/smaps` text (its header line and
 * fields), or null where no mapping holds it.
 *
 * @example
 * ```ts
 * smapsEntry("7f00-7f80 rw-p 00000000 00:00 0\nAnonHugePages: 0 kB\n", 0x7f10n); // that entry
 * ```
 */
export function smapsEntry(smaps: string, address: bigint): string | null {
  for (const entry of smaps.split(/\n(?=[0-9a-f]+-[0-9a-f]+ )/)) {
    const m = entry.match(/^([0-9a-f]+)-([0-9a-f]+) /);
    if (m && address >= BigInt("0x" + m[1]) && address < BigInt("0x" + m[2])) return entry;
  }
  return null;
}

/**
 * Whether the mapping holding `address`, in `/proc/self/smaps` text, carries the huge-page
 * advice (`hg` among its VmFlags); null where no mapping holds it.
 *
 * @example
 * ```ts
 * advisedHuge("7f00-7f80 rw-p 00000000 00:00 0\nVmFlags: rd wr mr mw me ac hg\n", 0x7f10n); // true
 * ```
 */
export function advisedHuge(smaps: string, address: bigint): boolean | null {
  const entry = smapsEntry(smaps, address);
  if (entry === null) return null;
  return (entry.match(/^VmFlags:(.*)$/m)?.[1] ?? "").split(/\s+/).includes("hg");
}

/**
 * How a process's memory is paged, as a worker reports it: `malloc` (every buffer huge from its
 * first touch: glibc took the tunable), `advised` (the weights and contexts advised and
 * collapsed after allocation), `none` (not asked, or the kernel gave none).
 */
export function memoryPaging(asked: boolean, weightsHuge: boolean): "malloc" | "advised" | "none" {
  if (!asked) return "none";
  if (mallocHugePages()) return "malloc";
  return weightsHuge ? "advised" : "none";
}

/** `GLIBC_TUNABLES` with `MALLOC_HUGE_PAGES_TUNABLE` added to what is already there. */
export function glibcTunablesWithHugePages(current = Deno.env.get("GLIBC_TUNABLES") ?? ""): string {
  const parts = current.split(":").filter((p) =>
    p !== "" && !p.startsWith("glibc.malloc.hugetlb=")
  );
  return [...parts, MALLOC_HUGE_PAGES_TUNABLE].join(":");
}

/** Why huge pages cannot be asked for here, or null when they can. */
export function hugePagesUnavailable(): string | null {
  if (Deno.build.os !== "linux") return `not Linux (${Deno.build.os})`;
  try {
    return thpModeReason(Deno.readTextFileSync(THP_ENABLED));
  } catch {
    return thpModeReason(null);
  }
}

/**
 * Why the THP mode in `enabled` (the text of /sys/kernel/mm/transparent_hugepage/enabled, null
 * when there is none) rules out asking for huge pages, or null when `madvise` or `always` allow it.
 *
 * @example
 * ```ts
 * thpModeReason("always [madvise] never\n"); // null
 * ```
 */
export function thpModeReason(enabled: string | null): string | null {
  if (enabled === null) return "this kernel has no transparent huge pages";
  if (/\[(madvise|always)\]/.test(enabled)) return null;
  return enabled.includes("[never]")
    ? "transparent huge pages are off (never)"
    : `unknown THP mode "${enabled.trim().slice(0, 40)}"`;
}

/**
 * Call before llama.cpp allocates (a context's creation); the returned function, called after,
 * asks for huge pages on what appeared in between and says what it did. Nothing is asked when
 * `want` is false, or where malloc already asks (`MALLOC_HUGE_PAGES_TUNABLE`): there every
 * buffer is huge from its first touch, and advising again would only repeat the work.
 *
 * @example
 * ```ts
 * const advise = adviseNewMappings(true);
 * const ptr = await lib.symbols.llama_init_from_model(model, params);
 * const advice = await advise(); // { advisedBytes, collapsedBytes, reason }
 * ```
 */
export function adviseNewMappings(want: boolean): () => Promise<HugePageAdvice> {
  const none = (reason: string) => () =>
    Promise.resolve({ advisedBytes: 0, collapsedBytes: 0, reason });
  if (!want) return none("turned off");
  if (mallocHugePages()) return none(`malloc asks already (${MALLOC_HUGE_PAGES_TUNABLE})`);
  const before = regionsNow();
  return () => adviseHugePages(before);
}

/**
 * Asks for huge pages on every anonymous mapping that appeared or changed since `before` (see
 * `regionsNow`). A context placed in memory the process had freed before (malloc reuses it) is
 * not seen: that happens when a long-lived process creates contexts again, not in a worker,
 * which creates its contexts once. Never throws: a refused span is left as it was.
 */
async function adviseHugePages(before: Region[] | null): Promise<HugePageAdvice> {
  const why = before === null ? "no /proc/self/maps" : hugePagesUnavailable();
  const after = why === null ? regionsNow() : null;
  if (why !== null || after === null) {
    const reason = why ?? "no /proc/self/maps";
    // Said on Linux, where it costs the first decodes (elsewhere there is nothing to ask).
    if (Deno.build.os === "linux") sayOnce(`contexts use 4 KiB pages: ${reason}`);
    return { advisedBytes: 0, collapsedBytes: 0, reason };
  }
  let advisedBytes = 0;
  let collapsedBytes = 0;
  for (const span of newHugeSpans(before!, after)) {
    if (!await madvise(span, MADV_HUGEPAGE)) continue;
    const bytes = Number(span.end - span.start);
    advisedBytes += bytes;
    // Synchronous where the kernel has it (Linux 6.1+), one huge page at a time: asked for a
    // whole span, the kernel refused it as a whole and lab-state's worker (weights and context)
    // ended with 274-342 MiB in huge pages; a unit at a time, 506-510 MiB, as many as with
    // malloc asking from the start (502-506). Refused units fill in as touched.
    for (let unit = span.start; unit < span.end; unit += HUGE) {
      if (await madvise({ start: unit, end: unit + HUGE }, MADV_COLLAPSE)) {
        collapsedBytes += Number(HUGE);
      }
    }
  }
  return { advisedBytes, collapsedBytes, reason: null };
}
