/**
 * Time bounds shared by the tests (issue #7: a test that fails because a machine is slower is
 * a broken test). Compute-bound work (prefill, generation, export) is never timed; it carries
 * only this watchdog, which catches a true hang and nothing else.
 */

/** Watchdog for compute-bound work: ten minutes, however slow or loaded the machine. */
export const HANG_MS = 600_000;
