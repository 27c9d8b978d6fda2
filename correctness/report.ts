/**
 * Text reports of handoff matrix results: one row per case (bytes by component, export and
 * import times, largest logit difference, each variant's verdict), then a one-line summary.
 * Nothing here reads content: results carry sizes, times and verdicts only.
 */
import type { CaseResult, Variant, VariantResult, Verdict } from "./matrix.ts";

const VERDICT_TEXT: Record<Verdict, string> = {
  exact: "exact",
  differs: "DIFFERS",
  refused: "refused",
  "wrong-refusal": "WRONG-ERROR",
  "not-refused": "NOT-REFUSED",
  "no-hit": "NO-HIT",
  "n/a": "n/a",
};

const VARIANT_HEADS: Record<Variant, string> = {
  "in-order": "in-order",
  shuffled: "shuffled",
  "missing-page": "missing",
  "flipped-byte": "flipped",
  "prefix-assisted": "prefix",
};

interface Column {
  head: string;
  /** Right-aligned (numbers) or left-aligned (names, verdicts). */
  right: boolean;
  cell: (r: CaseResult) => string;
}

const int = (x: number) => Math.round(x).toLocaleString("en-US");
const ms = (us: number) => (us / 1000).toFixed(us < 10_000 ? 2 : 1);

/** Largest |diff| over the variants that continued, or null when none did. */
export function maxAbsDiff(r: CaseResult): number | null {
  const diffs = r.variants.flatMap((v) => v.parity ? [v.parity.maxAbsDiff] : []);
  return diffs.length ? Math.max(...diffs) : null;
}

function inOrder(r: CaseResult): VariantResult | undefined {
  return r.variants.find((v) => v.variant === "in-order");
}

function columns(variants: readonly Variant[]): Column[] {
  const b = (f: (r: CaseResult) => number) => (r: CaseResult) => f(r) ? int(f(r)) : "-";
  const cols: Column[] = [
    { head: "family", right: false, cell: (r) => r.family },
    { head: "prompt", right: true, cell: (r) => int(r.promptTokens) },
    { head: "page", right: true, cell: (r) => int(r.pageTokens) },
    { head: "pages", right: true, cell: (r) => String(r.pages) },
    { head: "kv-page B", right: true, cell: b((r) => r.bytes.kvRows + r.bytes.kvMeta) },
    { head: "conv B", right: true, cell: b((r) => r.bytes.conv + r.bytes.recurrentWhole) },
    { head: "ssm B", right: true, cell: b((r) => r.bytes.ssm) },
    { head: "swa B", right: true, cell: b((r) => r.bytes.swa) },
    { head: "mtp B", right: true, cell: b((r) => r.bytes.mtpKv + r.bytes.mtpHidden) },
    { head: "prefill s", right: true, cell: (r) => (r.prefillMs / 1000).toFixed(2) },
    {
      head: "export ms",
      right: true,
      cell: (r) => `${ms(r.exportPagesUs)}+${ms(r.exportFinalUs)}`,
    },
    {
      head: "import ms",
      right: true,
      cell: (r) => {
        const v = inOrder(r);
        return v?.parity ? `${ms(v.importPagesUs)}+${ms(v.importFinalUs)}` : "-";
      },
    },
    {
      head: "max|diff|",
      right: true,
      cell: (r) => {
        const d = maxAbsDiff(r);
        return d === null ? "-" : d === 0 ? "0" : d.toExponential(2);
      },
    },
  ];
  for (const variant of variants) {
    cols.push({
      head: VARIANT_HEADS[variant],
      right: false,
      cell: (r) => {
        const v = r.variants.find((x) => x.variant === variant);
        return v ? VERDICT_TEXT[v.verdict] : "-";
      },
    });
  }
  cols.push({ head: "verdict", right: false, cell: (r) => r.ok ? "pass" : "FAIL" });
  return cols;
}

/** The results as an aligned table (header line first). */
export function formatTable(
  results: readonly CaseResult[],
  variants: readonly Variant[],
): string[] {
  const cols = columns(variants);
  const cells = [cols.map((c) => c.head), ...results.map((r) => cols.map((c) => c.cell(r)))];
  const widths = cols.map((_, i) => Math.max(...cells.map((row) => row[i].length)));
  return cells.map((row) =>
    row.map((text, i) => cols[i].right ? text.padStart(widths[i]) : text.padEnd(widths[i]))
      .join("  ").trimEnd()
  );
}

/** One line: how many cases passed, and the failures by case and variant. */
export function formatSummary(results: readonly CaseResult[], wallMs: number): string {
  const failed = results.filter((r) => !r.ok);
  const head = `${results.length - failed.length}/${results.length} cases pass in ${
    (wallMs / 1000).toFixed(1)
  } s`;
  if (failed.length === 0) return `${head}: every continuation bit-exact, every fault refused`;
  const names = failed.map((r) => {
    const bad = r.variants.filter((v) => !["exact", "refused", "n/a"].includes(v.verdict));
    return `${r.family}/${r.promptTokens}/${r.pageTokens} (${
      bad.map((v) => `${v.variant}: ${VERDICT_TEXT[v.verdict]}`).join(", ")
    })`;
  });
  return `${head}; FAILED: ${names.join("; ")}`;
}

/** Notes that explain the rows: refusals and variants that do not apply, once each. */
export function formatNotes(results: readonly CaseResult[]): string[] {
  const notes = new Set<string>();
  for (const r of results) {
    for (const v of r.variants) {
      if (v.verdict === "n/a" && v.detail) notes.add(`${r.family} ${v.variant}: n/a (${v.detail})`);
      if (v.verdict === "wrong-refusal" || v.verdict === "differs") {
        notes.add(
          `${r.family}/${r.promptTokens}/${r.pageTokens} ${v.variant}: ${
            v.detail ?? `first differing step ${v.parity?.firstDiffStep}`
          }`,
        );
      }
    }
  }
  return [...notes];
}
