/** Runs the CLI as a user would (a child process) and captures its output. */

const MAIN = new URL("../main.ts", import.meta.url).pathname;

export interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

export async function runCliProcess(
  args: string[],
  env: Record<string, string> = {},
): Promise<CliResult> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--unstable-net", MAIN, ...args],
    env,
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}
