import assert from "node:assert/strict";
import {
  advisedHuge,
  anonymousRegions,
  glibcTunablesWithHugePages,
  type HugePageAdvice,
  hugePagesUnavailable,
  MALLOC_HUGE_PAGES_TUNABLE,
  mallocHugePagesAsked,
  memoryPaging,
  newHugeSpans,
  smapsEntry,
  thpModeReason,
} from "./huge_pages.ts";

const MIB = 1024n * 1024n;

Deno.test("anonymousRegions keeps read-write mappings without a file or a name", () => {
  const maps = [
    "00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/deno",
    "7f0000000000-7f0000a00000 rw-p 00000000 00:00 0 ",
    "7f0000a00000-7f0000c00000 ---p 00000000 00:00 0 ",
    "7f0000c00000-7f0001000000 rw-p 00000000 08:02 42   /tmp/model.gguf",
    "7ffd00000000-7ffd00200000 rw-p 00000000 00:00 0      [stack]",
    "7f0001000000-7f0001400000 rw-s 00000000 00:00 0",
    "",
  ].join("\n");
  assert.deepEqual(anonymousRegions(maps), [
    { start: 0x7f0000000000n, end: 0x7f0000a00000n },
    { start: 0x7f0001000000n, end: 0x7f0001400000n },
  ]);
});

Deno.test("newHugeSpans: only new regions, cut to whole 2 MiB units", () => {
  const old = { start: 0n, end: 64n * MIB };
  const unaligned = { start: 64n * MIB + 4096n, end: 70n * MIB + 4096n };
  const small = { start: 80n * MIB + 4096n, end: 83n * MIB };
  assert.deepEqual(newHugeSpans([old], [old, unaligned, small]), [
    { start: 66n * MIB, end: 70n * MIB },
  ]);
  // A region that grew since (an arena extended for the context) is new too.
  const grown = { start: 0n, end: 68n * MIB };
  assert.deepEqual(newHugeSpans([old], [grown]), [grown]);
  // [80 MiB + 4 KiB, 83 MiB) holds no whole 2 MiB unit, whatever the minimum.
  assert.deepEqual(newHugeSpans([], [small], 1n), []);
});

interface ChildResult {
  weights: boolean;
  malloc: boolean;
  fresh: boolean | null;
  advice: HugePageAdvice;
  logits: string;
}

/** Runs `_huge_pages_child.ts` in a fresh process, as a worker starts (with `tunables`). */
async function child(hugePages: "on" | "off", tunables = ""): Promise<ChildResult> {
  const script = new URL("./_huge_pages_child.ts", import.meta.url).pathname;
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", script, hugePages],
    env: { GLIBC_TUNABLES: tunables },
    stderr: "inherit",
  }).output();
  assert.equal(out.code, 0, `child exited with ${out.code}`);
  return JSON.parse(new TextDecoder().decode(out.stdout).trim().split("\n").at(-1)!);
}

const THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled";

Deno.test("huge pages for weights and a new context's buffers change no logit", async () => {
  const huge = await child("on");
  const small = await child("off");
  const tuned = await child("on", glibcTunablesWithHugePages(""));
  assert.deepEqual(small.advice, { advisedBytes: 0, collapsedBytes: 0, reason: "turned off" });
  assert.equal(small.weights, false);
  assert.equal(small.malloc, false);
  // Without glibc's tunable malloc never asks: the weights and the context are advised after.
  assert.equal(huge.malloc, false);
  if (hugePagesUnavailable() === null) {
    assert.equal(huge.advice.reason, null);
    // The hybrid test model's recurrent and compute buffers span whole 2 MiB units.
    assert.ok(huge.advice.advisedBytes >= 2 * 1024 * 1024, JSON.stringify(huge.advice));
    assert.ok(huge.advice.collapsedBytes <= huge.advice.advisedBytes);
    // The weights count as huge once a unit of theirs collapsed (Linux 6.1+ has the call).
    if (huge.advice.collapsedBytes > 0) assert.equal(huge.weights, true);
    // With the tunable: malloc asked (glibc took it in this process), or the same advice as
    // without it.
    assert.equal(tuned.weights || !tuned.malloc, true);
    assert.equal(tuned.advice.reason === null, !tuned.malloc, JSON.stringify(tuned));
    // What mallocHugePages says is what malloc does: memory it maps afresh is huge once
    // written exactly when it says so (in `madvise` mode; `always` makes every page huge).
    if (Deno.readTextFileSync(THP_ENABLED).includes("[madvise]")) {
      assert.equal(tuned.fresh, tuned.malloc);
      assert.equal(huge.fresh, false);
    }
  } else {
    assert.equal(huge.advice.advisedBytes, 0);
    assert.notEqual(huge.advice.reason, null);
    assert.equal(huge.weights, false);
  }
  assert.equal(huge.logits.length > 0, true);
  assert.equal(huge.logits, small.logits);
  assert.equal(tuned.logits, small.logits);
});

Deno.test("advisedHuge reads the huge-page advice of the mapping holding an address", () => {
  const smaps = [
    "7f00000-7f80000 rw-p 00000000 00:00 0 ",
    "AnonHugePages:         0 kB",
    "VmFlags: rd wr mr mw me ac sd ",
    "7f80000-7fc0000 rw-p 00000000 00:00 0 ",
    "THPeligible:    1",
    "VmFlags: rd wr mr mw me ac sd hg ",
    "",
  ].join("\n");
  assert.equal(advisedHuge(smaps, 0x7f10000n), false);
  assert.equal(advisedHuge(smaps, 0x7f80000n), true);
  assert.equal(advisedHuge(smaps, 0x7fbffffn), true);
  // The end is not inside; an address no mapping holds says so.
  assert.equal(advisedHuge(smaps, 0x7fc0000n), null);
  assert.equal(advisedHuge(smaps, 0x100n), null);
  assert.match(smapsEntry(smaps, 0x7f80000n) ?? "", /^7f80000-7fc0000 .*\nTHPeligible/);
  assert.equal(smapsEntry(smaps, 0x100n), null);
  // "nh" (no huge pages) is not "hg".
  assert.equal(advisedHuge("1000-2000 rw-p 0 00:00 0 \nVmFlags: rd wr nh\n", 0x1800n), false);
});

Deno.test("glibc's huge-page tunable is added to the tunables already set, once", () => {
  assert.equal(glibcTunablesWithHugePages(""), MALLOC_HUGE_PAGES_TUNABLE);
  assert.equal(
    glibcTunablesWithHugePages("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0"),
    `glibc.malloc.arena_max=2:${MALLOC_HUGE_PAGES_TUNABLE}`,
  );
});

Deno.test("THP modes: madvise and always allow huge pages; never, none and others say why", () => {
  assert.equal(thpModeReason("always [madvise] never\n"), null);
  assert.equal(thpModeReason("[always] madvise never\n"), null);
  assert.equal(thpModeReason("always madvise [never]\n"), "transparent huge pages are off (never)");
  assert.equal(thpModeReason(null), "this kernel has no transparent huge pages");
  assert.match(thpModeReason("")!, /unknown THP mode/);
});

Deno.test("memoryPaging: none unless asked; without the tunable, advised where the weights are", () => {
  assert.equal(memoryPaging(false, true), "none");
  if (!mallocHugePagesAsked()) {
    assert.equal(memoryPaging(true, true), "advised");
    assert.equal(memoryPaging(true, false), "none");
  }
});
