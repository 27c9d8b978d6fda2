/**
 * Test assertions shared by the test files, in the shape of `@std/assert` (which is not reachable
 * here) and built on `node:assert`. Private: tests only.
 */
import nodeAssert from "node:assert/strict";

/** Deep strict equality. */
export function assertEquals<T>(actual: unknown, expected: T, message?: string): void {
  nodeAssert.deepStrictEqual(actual, expected, message);
}

/** Truthiness. */
export function assert(condition: unknown, message = "expected a truthy value"): asserts condition {
  nodeAssert.ok(condition, message);
}

type ErrorClass<E extends Error> = abstract new (...args: never[]) => E;

function _check<E extends Error>(
  error: unknown,
  errorClass: ErrorClass<E>,
  messageIncludes?: string,
): E {
  if (!(error instanceof errorClass)) {
    throw new Error(`Expected ${errorClass.name}, got: ${error}`, { cause: error });
  }
  if (messageIncludes !== undefined && !error.message.includes(messageIncludes)) {
    throw new Error(`Expected message to include "${messageIncludes}", got: "${error.message}"`);
  }
  return error;
}

/** Asserts that `fn` throws an instance of `errorClass`; returns the error. */
export function assertThrows<E extends Error>(
  fn: () => unknown,
  errorClass: ErrorClass<E>,
  messageIncludes?: string,
): E {
  try {
    fn();
  } catch (error) {
    return _check(error, errorClass, messageIncludes);
  }
  throw new Error(`Expected ${errorClass.name} to be thrown, but nothing was thrown`);
}

/** Asserts that `fn` rejects with an instance of `errorClass`; returns the error. */
export async function assertRejects<E extends Error>(
  fn: () => Promise<unknown>,
  errorClass: ErrorClass<E>,
  messageIncludes?: string,
): Promise<E> {
  try {
    await fn();
  } catch (error) {
    return _check(error, errorClass, messageIncludes);
  }
  throw new Error(`Expected ${errorClass.name} to be rejected, but it resolved`);
}
