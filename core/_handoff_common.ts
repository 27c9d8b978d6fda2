/**
 * Helpers shared by the two handoff transition tables. Private: not re-exported.
 */
import { ProtocolError } from "./errors.ts";
import {
  type HandoffEvent,
  type HandoffMessage,
  type Phase,
  phaseName,
  type StepResult,
} from "./handoff.ts";

/** True when `event` is a message from the peer (as opposed to a local event). */
export function isMessage(event: HandoffEvent): event is HandoffMessage {
  return "handoffId" in event;
}

/** True when `n` is a non-negative safe integer (credit, positions, counts). */
export function isCount(n: unknown): n is number {
  return Number.isSafeInteger(n) && (n as number) >= 0;
}

/** The rejection result: same state, no actions, and the protocol error. */
export function rejectEvent<S extends { phase: Phase; role: string }>(
  state: S,
  event: { type: string },
  detail = "not valid in this phase",
): StepResult<S> {
  return {
    state,
    actions: [],
    rejected: new ProtocolError(
      `Handoff ${state.role} in phase ${phaseName(state.phase)} rejected event "${
        String(event?.type)
      }": ${detail}`,
    ),
  };
}
