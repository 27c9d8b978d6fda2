/** Parsers for list-valued flags, shared by the correctness commands. */
import { InvalidArgumentError } from "commander";

/** Parser for a comma-separated list whose items pass `item`. */
export function listArg<T>(item: (value: string) => T): (value: string) => T[] {
  return (value: string) => {
    const parts = value.split(",").map((s) => s.trim());
    if (parts.some((s) => s === "")) {
      throw new InvalidArgumentError(`expected a comma-separated list, got "${value}"`);
    }
    return parts.map(item);
  };
}

export function oneOf<T extends string>(names: readonly T[]): (value: string) => T {
  return (value: string) => {
    if (!(names as readonly string[]).includes(value)) {
      throw new InvalidArgumentError(`"${value}" is not one of ${names.join(", ")}`);
    }
    return value as T;
  };
}
