/**
 * The file edge of the GGUF code: reading a header from disk with bounded memory, and writing
 * an encoded chunk stream to disk atomically (a temporary file renamed into place, so a failed
 * or interrupted `model make` never leaves a half-written model under the final name).
 */
import { InputFileError, UsageError } from "../core/errors.ts";
import {
  type GgufFileInfo,
  type GgufReadLimits,
  NeedMoreBytes,
  parseGgufHeader,
} from "./gguf_reader.ts";

const FIRST_READ_BYTES = 1 << 20;
const HEADER_BYTES_MAX = 256 << 20;

export interface GgufFileHeader extends GgufFileInfo {
  readonly path: string;
  readonly fileBytes: number;
}

/** Reads and validates the metadata and tensor infos of the GGUF file at `path`. */
export async function readGgufFile(
  path: string,
  limits: GgufReadLimits = {},
): Promise<GgufFileHeader> {
  const headerBytesMax = limits.headerBytesMax ?? HEADER_BYTES_MAX;
  using file = await openForReading(path);
  const fileBytes = (await file.stat()).size;
  let prefix: Uint8Array = new Uint8Array(0);
  let want = Math.min(fileBytes, FIRST_READ_BYTES);
  for (;;) {
    prefix = await extendPrefix(file, prefix, want);
    try {
      const info = parseGgufHeader(prefix, {
        complete: prefix.length === fileBytes,
        source: path,
        limits,
      });
      checkDataFits(info, path, fileBytes);
      return { ...info, path, fileBytes };
    } catch (error) {
      if (!(error instanceof NeedMoreBytes)) throw error;
      if (error.bytesNeeded > headerBytesMax) {
        throw new InputFileError(
          `Cannot read GGUF file "${path}": its metadata needs more than ${headerBytesMax} bytes`,
          { hint: "the file is damaged, or raise headerBytesMax if it is a real model" },
        );
      }
      want = Math.min(fileBytes, Math.max(error.bytesNeeded, want * 2));
    }
  }
}

function checkDataFits(info: GgufFileInfo, path: string, fileBytes: number): void {
  // The last tensor's trailing padding may be missing in files from some writers.
  const last = info.tensors.at(-1);
  const end = last ? info.dataOffset + last.offset + last.bytes : info.dataOffset;
  if (info.tensors.length > 0 && end > fileBytes) {
    throw new InputFileError(
      `Cannot read GGUF file "${path}": truncated (tensor data ends at byte ${end}, ` +
        `the file has ${fileBytes})`,
      { hint: "the download or write was interrupted; make or fetch the file again" },
    );
  }
}

async function openForReading(path: string): Promise<Deno.FsFile> {
  try {
    const stat = await Deno.stat(path);
    if (!stat.isFile) {
      throw new InputFileError(`Cannot read GGUF file "${path}": not a regular file`);
    }
    return await Deno.open(path, { read: true });
  } catch (error) {
    if (error instanceof InputFileError) throw error;
    if (error instanceof Deno.errors.NotFound) {
      throw new InputFileError(`Cannot read GGUF file "${path}": no such file`, {
        hint: "check the path, or make a test model with `model make`",
        cause: error,
      });
    }
    if (error instanceof Deno.errors.PermissionDenied) {
      throw new InputFileError(`Cannot read GGUF file "${path}": permission denied`, {
        cause: error,
      });
    }
    throw error;
  }
}

async function extendPrefix(
  file: Deno.FsFile,
  prefix: Uint8Array,
  want: number,
): Promise<Uint8Array> {
  if (want <= prefix.length) return prefix;
  const next = new Uint8Array(want);
  next.set(prefix);
  await file.seek(prefix.length, Deno.SeekMode.Start);
  let filled = prefix.length;
  while (filled < want) {
    const n = await file.read(next.subarray(filled));
    if (n === null) return next.subarray(0, filled);
    filled += n;
  }
  return next;
}

export interface WriteProgress {
  readonly writtenBytes: number;
  readonly totalBytes: number | undefined;
}

/**
 * Writes `chunks` to `path` through a temporary file in the same folder, renamed into place
 * when complete. An unwritable destination is a `UsageError` naming the path.
 */
export async function writeChunksToFile(
  path: string,
  chunks: AsyncIterable<Uint8Array> | Iterable<Uint8Array>,
  options: { totalBytes?: number; onProgress?: (progress: WriteProgress) => void } = {},
): Promise<number> {
  const tmpPath = `${path}.partial-${crypto.randomUUID().slice(0, 8)}`;
  let file: Deno.FsFile;
  try {
    if ((await Deno.stat(path).catch(() => null))?.isDirectory) {
      throw new Deno.errors.IsADirectory(path);
    }
    file = await Deno.open(tmpPath, { write: true, createNew: true });
  } catch (error) {
    throw unwritable(path, error);
  }
  let writtenBytes = 0;
  try {
    for await (const chunk of chunks) {
      await writeAll(file, chunk);
      writtenBytes += chunk.byteLength;
      options.onProgress?.({ writtenBytes, totalBytes: options.totalBytes });
    }
    file.close();
    await Deno.rename(tmpPath, path);
  } catch (error) {
    try {
      file.close();
    } catch { /* already closed */ }
    await Deno.remove(tmpPath).catch(() => {});
    if (
      error instanceof Deno.errors.IsADirectory || error instanceof Deno.errors.PermissionDenied
    ) {
      throw unwritable(path, error);
    }
    throw error;
  }
  return writtenBytes;
}

async function writeAll(file: Deno.FsFile, bytes: Uint8Array): Promise<void> {
  let offset = 0;
  while (offset < bytes.byteLength) offset += await file.write(bytes.subarray(offset));
}

function unwritable(path: string, error: unknown): UsageError {
  const reason = error instanceof Deno.errors.NotFound
    ? "its folder does not exist"
    : error instanceof Deno.errors.PermissionDenied
    ? "permission denied"
    : error instanceof Deno.errors.IsADirectory
    ? "it is a directory"
    : error instanceof Error
    ? error.message
    : String(error);
  return new UsageError(`Cannot write "${path}": ${reason}`, {
    hint: "choose a writable path for --out",
    cause: error,
  });
}
