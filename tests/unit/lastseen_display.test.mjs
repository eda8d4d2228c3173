// Node side of the shared last-seen display cases: `node --test tests/unit/lastseen_display.test.mjs`.
// The Python side (tests/unit/test_lastseen_display.py) reads the same JSON file.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { describeLastSeen } from "../../clients/js/src/lastseen.js";

const data = JSON.parse(readFileSync(new URL("./lastseen_display_cases.json", import.meta.url), "utf8"));
const nowMs = Date.parse(data.now);

test("the file's now agrees with its epoch seconds", () => {
  assert.equal(nowMs, data.now_epoch_s * 1000);
});

for (const c of data.cases) {
  const form = c.form ?? "card";
  test(`${form} ${c.status} ${c.offset_s} s -> ${JSON.stringify(c.expected)}`, () => {
    // Millisecond precision, as lastSeenAt travels on the wire.
    const iso = c.offset_s === null ? null : new Date(nowMs - Math.round(c.offset_s * 1000)).toISOString();
    assert.equal(describeLastSeen(c.status, iso, nowMs, { form }), c.expected);
  });
}

test("undefined and unreadable times read as unknown", () => {
  assert.equal(describeLastSeen("offline", undefined, nowMs), "Offline");
  assert.equal(describeLastSeen("offline", "not a date", nowMs), "Offline");
});

test("an unknown status or form throws", () => {
  assert.throws(() => describeLastSeen("away", null, nowMs), RangeError);
  assert.throws(() => describeLastSeen("away", null, nowMs, { form: "header" }), RangeError);
  assert.throws(() => describeLastSeen("online", null, nowMs, { form: "banner" }), RangeError);
  assert.throws(() => describeLastSeen("toString", null, nowMs), RangeError);
});

test("the date after a week follows the requested time zone", () => {
  const iso = "2026-11-02T23:30:00.000Z";
  assert.equal(describeLastSeen("offline", iso, nowMs), "Last seen on 2026-11-02");
  assert.equal(describeLastSeen("offline", iso, nowMs, { timeZone: "Asia/Tokyo" }), "Last seen on 2026-11-03");
  assert.equal(describeLastSeen("offline", iso, nowMs, { timeZone: "America/New_York" }), "Last seen on 2026-11-02");
});
