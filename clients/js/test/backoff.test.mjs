// The reconnect policy against the cases shared with presence_client/backoff.py.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { DEFAULT_BACKOFF, RESTART_CLOSE_CODES, reconnectDelay, restartDelay } from "../src/backoff.js";

const data = JSON.parse(readFileSync(new URL("../../../tests/unit/backoff_cases.json", import.meta.url), "utf8"));

for (const c of data.cases) {
  test(`attempt ${c.attempt}${c.throttled ? " throttled" : ""} random ${c.random} -> ${c.delay_ms} ms`, () => {
    assert.ok(Math.abs(reconnectDelay(c.attempt, c.throttled, DEFAULT_BACKOFF, () => c.random) - c.delay_ms) < 1e-6);
  });
}

for (const c of data.restart_cases) {
  test(`after 1012/1011, random ${c.random} -> ${c.delay_ms} ms`, () => {
    assert.ok(Math.abs(restartDelay(DEFAULT_BACKOFF, () => c.random) - c.delay_ms) < 1e-6);
  });
}

test("restart codes are 1011 and 1012", () => {
  assert.deepEqual([...RESTART_CLOSE_CODES].sort(), [1011, 1012]);
});

test("full jitter: delays cover the whole window, capped", () => {
  for (let attempt = 0; attempt < 12; attempt += 1) {
    const window = Math.min(DEFAULT_BACKOFF.capMs, DEFAULT_BACKOFF.baseMs * 2 ** attempt);
    assert.equal(reconnectDelay(attempt, false, DEFAULT_BACKOFF, () => 0), 0);
    assert.ok(reconnectDelay(attempt, false, DEFAULT_BACKOFF, () => 0.999999) <= window);
    assert.ok(reconnectDelay(attempt, true, DEFAULT_BACKOFF, () => 0) >= DEFAULT_BACKOFF.throttledBaseMs / 2);
  }
});
