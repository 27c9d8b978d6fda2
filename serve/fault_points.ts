/**
 * Named fault points: places in a worker's protocol where, for tests and the chaos run only,
 * the process kills itself with SIGKILL, a real `kill -9` at a precise step that an outside
 * kill could only hit by luck. Armed by the environment of a `serve` process:
 *
 *     SKIPPY_FAULT_KILL=<point>:<n>     # die the n-th time <point> is reached (n >= 1)
 *
 * Points: `prefill-chunk-sent` (a state chunk left the prefill worker), `first-token-sent`
 * (the prefill worker sent FirstToken), `decode-chunk-received` (the decode worker read a
 * state chunk, before the commit), `token-batch-sent` (a worker streamed a TokenBatch to the
 * client: after the commit, mid-generation). Unset (always, outside tests): every point is
 * a no-op.
 */

export const FAULT_POINTS = [
  "prefill-chunk-sent",
  "first-token-sent",
  "decode-chunk-received",
  "token-batch-sent",
] as const;
export type FaultPoint = typeof FAULT_POINTS[number];

/** The environment variable that arms one point. */
export const FAULT_ENV = "SKIPPY_FAULT_KILL";

let armed: { point: FaultPoint; n: number } | null | undefined;
let reached = 0;

/** Parses `<point>:<n>`; null when it is not a valid spec. */
export function parseFaultSpec(spec: string): { point: FaultPoint; n: number } | null {
  const m = /^([a-z-]+):(\d{1,6})$/.exec(spec.trim());
  if (!m || !(FAULT_POINTS as readonly string[]).includes(m[1]) || Number(m[2]) < 1) return null;
  return { point: m[1] as FaultPoint, n: Number(m[2]) };
}

function arm(): { point: FaultPoint; n: number } | null {
  let spec: string | undefined;
  try {
    spec = Deno.env.get(FAULT_ENV);
  } catch {
    spec = undefined; // no env permission: never armed
  }
  if (!spec) return null;
  const parsed = parseFaultSpec(spec);
  if (!parsed) {
    throw new Error(
      `${FAULT_ENV}="${spec.slice(0, 60)}" is not <point>:<n> with a point among ${
        FAULT_POINTS.join(", ")
      }`,
    );
  }
  return parsed;
}

/** Marks that this process reached `point`; kills it if that is the armed n-th time. */
export function faultPoint(point: FaultPoint): void {
  if (armed === undefined) armed = arm();
  if (armed === null || armed.point !== point) return;
  if (++reached < armed.n) return;
  console.error(`fault injection: ${FAULT_ENV}=${point}:${armed.n} reached; killing this process`);
  Deno.kill(Deno.pid, "SIGKILL");
}
