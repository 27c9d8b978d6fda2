/**
 * The per-node state directory: node key, TLS certificate and trust list live here, all
 * readable by the owner only. Default: `$SKIPPY_DISAGG_STATE_DIR`, else
 * `$XDG_STATE_HOME/skippy-disagg`, else `~/.local/state/skippy-disagg`
 * (`%LOCALAPPDATA%\skippy-disagg` on Windows).
 */
import { InputFileError } from "../core/errors.ts";

/** The state directory used when `--state-dir` is not given. */
export function defaultStateDir(): string {
  const explicit = Deno.env.get("SKIPPY_DISAGG_STATE_DIR");
  if (explicit) return explicit;
  if (Deno.build.os === "windows") {
    const local = Deno.env.get("LOCALAPPDATA");
    if (local) return `${local}\\skippy-disagg`;
  }
  const xdg = Deno.env.get("XDG_STATE_HOME");
  if (xdg) return `${xdg}/skippy-disagg`;
  const home = Deno.env.get("HOME") ?? Deno.env.get("USERPROFILE");
  if (!home) {
    throw new InputFileError("Cannot find a home directory for the node state", {
      hint: "pass --state-dir DIR or set SKIPPY_DISAGG_STATE_DIR",
    });
  }
  return `${home}/.local/state/skippy-disagg`;
}

/** `flag` if given, else the default. */
export function resolveStateDir(flag?: string): string {
  return flag && flag.length > 0 ? flag : defaultStateDir();
}

/** Creates the directory (owner-only) if missing. */
export async function ensureStateDir(dir: string): Promise<void> {
  await Deno.mkdir(dir, { recursive: true, mode: 0o700 });
}

/** Joins a file name onto the state directory. */
export function statePath(dir: string, name: string): string {
  return dir.endsWith("/") || dir.endsWith("\\") ? dir + name : `${dir}/${name}`;
}

/**
 * Writes a file readable by the owner only (0600), atomically: a crash leaves the old file or
 * the new one, never half of each.
 */
export async function writePrivateFile(path: string, text: string): Promise<void> {
  const temporary = `${path}.tmp-${crypto.randomUUID()}`;
  try {
    await Deno.writeTextFile(temporary, text, { mode: 0o600, createNew: true });
    if (Deno.build.os !== "windows") await Deno.chmod(temporary, 0o600);
    await Deno.rename(temporary, path);
  } catch (error) {
    await Deno.remove(temporary).catch(() => {});
    throw new InputFileError(`Cannot write "${path}": ${(error as Error).message}`, {
      hint: "check that the state directory is writable (--state-dir)",
      cause: error,
    });
  }
}

/** The file's text, or null if it does not exist. */
export async function readTextIfExists(path: string): Promise<string | null> {
  try {
    return await Deno.readTextFile(path);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return null;
    throw new InputFileError(`Cannot read "${path}": ${(error as Error).message}`, {
      cause: error,
    });
  }
}
