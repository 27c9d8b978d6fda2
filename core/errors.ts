/**
 * Typed errors for expected failures. Programmer errors use `assert()` instead.
 *
 * Every message is written for the person at the terminal: sentence case, the offending value
 * quoted, a colon before detail, and what to do next in `hint`. No prompt content, tokens,
 * state bytes or content-derived hashes ever appear in a message.
 *
 * @example
 * ```ts
 * throw new UsageError("Unknown family \"foo\"", { hint: "use one of: dense, iswa, hybrid" });
 * ```
 */

export interface SkippyErrorOptions {
  /** What the user can do about it, printed after the message. */
  hint?: string;
  cause?: unknown;
}

/** Base class: the CLI prints `error: <message>` (+ hint) and exits with `exitCode`. */
export class SkippyError extends Error {
  readonly hint?: string;
  /** Process exit code the CLI uses for this error. */
  readonly exitCode: number = 1;

  constructor(message: string, options: SkippyErrorOptions = {}) {
    super(message, { cause: options.cause });
    this.name = new.target.name;
    this.hint = options.hint;
  }
}

/** Wrong flags or arguments. Exit code 2, like most CLIs. */
export class UsageError extends SkippyError {
  override readonly exitCode = 2;
}

/** A file that is missing, unreadable or not what it claims to be (GGUF, key file, ...). */
export class InputFileError extends SkippyError {}

/** The llama.cpp library is missing, of the wrong build, or failed a native call. */
export class RuntimeLibraryError extends SkippyError {}

/** A model or context could not be created with the requested configuration. */
export class ModelLoadError extends SkippyError {}

/** Two numerical identities differ: state from one must not be applied to the other. */
export class IdentityMismatchError extends SkippyError {}

/** A state component failed validation (order, range, checksum, size). */
export class StateValidationError extends SkippyError {}

/** A peer is not trusted, failed authentication, or lacks required capabilities. */
export class PeerError extends SkippyError {}

/** A frame on the wire is malformed, oversized or out of protocol. */
export class ProtocolError extends SkippyError {}

/** A handoff was aborted (peer death, cancellation, lease expiry); `reason` is machine-readable. */
export class HandoffAbortedError extends SkippyError {
  readonly reason: string;
  constructor(reason: string, message: string, options: SkippyErrorOptions = {}) {
    super(message, options);
    this.reason = reason;
  }
}

/**
 * A worker had no room for the request (every sequence or context taken and its queue full or
 * its wait over): nothing was lost, and the same request can be sent again later.
 */
export class WorkerBusyError extends SkippyError {}

/** A bound (bytes, count, time) was exceeded. */
export class LimitExceededError extends SkippyError {}

/** Throws a plain Error for programmer mistakes (broken invariants), never for user input. */
export function assert(condition: unknown, message = "Assertion failed"): asserts condition {
  if (!condition) throw new Error(`Internal error: ${message}`);
}
