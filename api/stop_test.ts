import assert from "node:assert/strict";
import { StopMatcher } from "./stop.ts";

function feed(stops: string[], pieces: string[]): { out: string; stopped: boolean } {
  const m = new StopMatcher(stops);
  let out = "";
  for (const p of pieces) out += m.push(p);
  out += m.flush();
  return { out, stopped: m.stopped };
}

Deno.test("StopMatcher cuts a stop that straddles two pieces and drops what follows", () => {
  assert.deepEqual(feed(["END"], ["abc E", "ND def", "ghi"]), { out: "abc ", stopped: true });
});

Deno.test("StopMatcher releases held text once it cannot begin a stop", () => {
  const m = new StopMatcher(["\n\n"]);
  assert.equal(m.push("a\n"), "a");
  assert.equal(m.push("b"), "\nb");
  assert.equal(m.stopped, false);
  assert.equal(m.flush(), "");
});

Deno.test("StopMatcher picks the earliest of several stops, and passes text without stops", () => {
  assert.deepEqual(feed(["xyz", "b"], ["a", "xyzb"]), { out: "a", stopped: true });
  assert.deepEqual(feed(["zz"], ["a", "z", "b"]), { out: "azb", stopped: false });
  assert.deepEqual(feed([], ["hello ", "world"]), { out: "hello world", stopped: false });
});

Deno.test("StopMatcher flushes a held prefix at the end of generation", () => {
  assert.deepEqual(feed(["STOP"], ["text ST"]), { out: "text ST", stopped: false });
});
