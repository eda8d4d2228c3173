// How a last-seen time is shown to people: the same rules as actors/core/lastseen_display.py,
// kept in step by tests/unit/lastseen_display_cases.json (run by both a Python and a Node test).
//
// Coarse on purpose: it matches the precision we store and respects privacy. "Online" while
// connected (presence answers that, not last-seen), then "Active in the last 10 minutes", then
// whole minutes, hours, days (rounded down), and finally a date.
//
// Two forms (seed 003): a profile card ("card", the default) states the status in words; a
// conversation header ("header") answers "will this be read now": idle and dnd read "Online", an
// offline account shows its last-seen line when one is known and otherwise nothing ("").

const MINUTE = 60_000;
const HOUR = 60 * MINUTE;
const DAY = 24 * HOUR;

// Statuses shown as they are; `invisible` is `offline` to everybody but the account itself.
const PRESENT_LABELS = { online: "Online", idle: "Idle", dnd: "Do not disturb" };
const OFFLINE = new Set(["offline", "invisible"]);
const FORMS = new Set(["card", "header"]);

// YYYY-MM-DD of an instant in a time zone. "en-CA" formats dates as ISO 8601.
function isoDate(ms, timeZone) {
  if (timeZone === "UTC") return new Date(ms).toISOString().slice(0, 10);
  return new Intl.DateTimeFormat("en-CA", {
    timeZone,
    year: "numeric",
    month: "2-digit",
    day: "2-digit",
  }).format(new Date(ms));
}

/**
 * The label for an account with visible `status` whose last-seen time is `lastSeenAtIsoOrNull`
 * (an ISO 8601 string as in `presence.changed`'s `lastSeenAt`, or null/undefined when unknown),
 * at time `nowMs` (epoch milliseconds, e.g. Date.now()).
 *
 * "yesterday" means 24 to 48 hours ago, not the previous calendar day, so only the date shown
 * after a week depends on `options.timeZone` (default "UTC", like the Python side). A time in the
 * future (clock skew) reads as just now. `options.form` is "card" (default) or "header" (see
 * above). Throws on an unknown status or form.
 */
export function describeLastSeen(status, lastSeenAtIsoOrNull, nowMs, options = {}) {
  const form = options.form ?? "card";
  if (!FORMS.has(form)) throw new RangeError(`unknown form ${JSON.stringify(form)}`);
  const unknown = form === "header" ? "" : "Offline";
  if (Object.hasOwn(PRESENT_LABELS, status)) return form === "header" ? "Online" : PRESENT_LABELS[status];
  if (!OFFLINE.has(status)) throw new RangeError(`unknown status ${JSON.stringify(status)}`);
  if (lastSeenAtIsoOrNull === null || lastSeenAtIsoOrNull === undefined) return unknown;
  const seenMs = Date.parse(lastSeenAtIsoOrNull);
  if (!Number.isFinite(seenMs)) return unknown; // unreadable: the same as unknown
  const age = Math.max(nowMs - seenMs, 0);
  if (age < 10 * MINUTE) return "Active in the last 10 minutes";
  if (age < HOUR) return `Last seen ${Math.floor(age / MINUTE)} minutes ago`;
  if (age < DAY) {
    const hours = Math.floor(age / HOUR);
    return hours === 1 ? "Last seen 1 hour ago" : `Last seen ${hours} hours ago`;
  }
  if (age < 7 * DAY) {
    const days = Math.floor(age / DAY);
    return days === 1 ? "Last seen yesterday" : `Last seen ${days} days ago`;
  }
  return `Last seen on ${isoDate(seenMs, options.timeZone ?? "UTC")}`;
}
