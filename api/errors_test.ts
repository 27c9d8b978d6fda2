import { assertEquals } from "../testing/assert.ts";
import { WorkerBusyError } from "../core/mod.ts";
import { serverError, WORKER_BUSY_RETRY_AFTER_S } from "./errors.ts";

Deno.test("a busy worker is a 503 with Retry-After; any other worker failure a 500", async () => {
  const busy = serverError(new WorkerBusyError("The decode worker is busy: no free sequence"));
  assertEquals(busy.status, 503);
  const response = busy.response();
  assertEquals(response.headers.get("retry-after"), String(WORKER_BUSY_RETRY_AFTER_S));
  const body = await response.json();
  assertEquals(body.error.type, "unavailable_error");
  assertEquals(body.error.code, "worker_busy");
  assertEquals(serverError(new Error("Generation failed: x")).status, 500);
});
