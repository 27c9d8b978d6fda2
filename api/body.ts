/**
 * A request body read as JSON within a byte bound: a declared `content-length` over the bound
 * is refused before a byte is read, and a body without one (chunked) is counted as it arrives
 * and refused the moment it passes the bound, so no body larger than the bound is ever held.
 */
import { concatBytes } from "../core/bytes.ts";
import { ApiError, malformedJson } from "./errors.ts";

/** The body as JSON, at most `bytesMax` bytes; a 413 when it is larger, a 400 when it is not JSON. */
export async function readJsonBody(request: Request, bytesMax: number): Promise<unknown> {
  const length = Number(request.headers.get("content-length") ?? "0");
  if (length > bytesMax) throw bodyTooLarge(bytesMax);
  const text = new TextDecoder().decode(await _readBounded(request.body, bytesMax));
  try {
    return JSON.parse(text);
  } catch (error) {
    throw malformedJson((error as Error).message.split("\n")[0]);
  }
}

function bodyTooLarge(bytesMax: number): ApiError {
  return new ApiError(
    413,
    "invalid_request_error",
    `The request body is over ${bytesMax} bytes, the most this server reads; send a shorter prompt`,
    { code: "request_too_large" },
  );
}

async function _readBounded(
  body: ReadableStream<Uint8Array> | null,
  bytesMax: number,
): Promise<Uint8Array> {
  if (body === null) return new Uint8Array();
  const parts: Uint8Array[] = [];
  let bytes = 0;
  const reader = body.getReader();
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      bytes += value.byteLength;
      if (bytes > bytesMax) {
        await reader.cancel();
        throw bodyTooLarge(bytesMax);
      }
      parts.push(value);
    }
  } finally {
    reader.releaseLock();
  }
  return concatBytes(parts);
}
