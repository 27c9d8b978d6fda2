/**
 * Writes a benchmark report folder: `report.json` (all rows), one SVG per chart and a
 * `README.md` that shows tables and embeds the charts, so a person can look at the results.
 */

export interface ReportSection {
  name: string;
  /** Plain-text table shown in the terminal and the README. */
  table: string;
  /** Raw rows, kept in report.json. */
  rows: unknown;
  /** SVG charts: file name (without folder) -> SVG text. */
  charts?: Record<string, string>;
  /** Notes under the table (what was measured, how to read it). */
  notes?: string[];
}

export async function writeReport(dir: string, title: string, sections: ReportSection[]) {
  await Deno.mkdir(dir, { recursive: true });
  const md: string[] = [`# ${title}`, "", `Generated ${new Date().toISOString()}.`, ""];
  const json: Record<string, unknown> = {};
  for (const s of sections) {
    json[s.name] = s.rows;
    md.push(`## ${s.name}`, "", "```", s.table, "```", "");
    for (const note of s.notes ?? []) md.push(`- ${note}`);
    if (s.notes?.length) md.push("");
    for (const [file, svg] of Object.entries(s.charts ?? {})) {
      await Deno.writeTextFile(`${dir}/${file}`, svg);
      md.push(`![${file}](${file})`, "");
    }
  }
  await Deno.writeTextFile(`${dir}/report.json`, JSON.stringify(json, null, 2));
  await Deno.writeTextFile(`${dir}/README.md`, md.join("\n"));
}
