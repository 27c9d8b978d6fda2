/**
 * Captures llama.cpp's native log. llama.cpp logs verbosely to stderr by default; we keep the
 * last warning and error lines in a bounded ring so that a failed native call can say what
 * llama.cpp reported, and echo them only when asked (`--debug`).
 *
 * The callback is thread-safe because decode runs on a worker thread (`nonblocking` calls).
 */
import type { LlamaSymbols } from "./llama.ts";

const GGML_LOG_LEVEL_WARN = 3;
const GGML_LOG_LEVEL_CONT = 5;
/** How many recent native warning/error lines we keep. */
export const NATIVE_LOG_LINES_MAX = 32;

const LIVE_CALLBACKS: unknown[] = [];

export interface NativeLog {
  attach(symbols: LlamaSymbols, echo: boolean): void;
  /** Recent warning and error lines, oldest first. */
  recent(): string[];
  /** Forgets the recent lines (call before a native call whose failure you want to explain). */
  clear(): void;
}

export function installLogger(): NativeLog {
  const lines: string[] = [];
  let lastLevel = 0;
  let echo = false;
  const push = (level: number, text: string) => {
    const effective = level === GGML_LOG_LEVEL_CONT ? lastLevel : level;
    lastLevel = effective;
    if (effective < GGML_LOG_LEVEL_WARN) return;
    const line = text.trimEnd();
    if (line === "") return;
    if (echo) console.error(`llama.cpp: ${line}`);
    lines.push(line);
    if (lines.length > NATIVE_LOG_LINES_MAX) lines.shift();
  };
  return {
    attach(symbols, echoLines) {
      echo = echoLines;
      const cb = Deno.UnsafeCallback.threadSafe(
        { parameters: ["i32", "pointer", "pointer"], result: "void" } as const,
        (level, text) => {
          push(level, text === null ? "" : new Deno.UnsafePointerView(text).getCString());
        },
      );
      cb.unref();
      // Held for the life of the process: llama.cpp keeps the pointer.
      LIVE_CALLBACKS.push(cb);
      symbols.llama_log_set(cb.pointer, null);
    },
    recent: () => [...lines],
    clear: () => {
      lines.length = 0;
    },
  };
}
