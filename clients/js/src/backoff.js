// The reconnect policy: capped exponential backoff with full jitter. Pure (the random source is a
// parameter), the same numbers as presence_client/backoff.py; tests/unit/backoff_cases.json holds
// both to them.
//
// Why full jitter: when an edge dies, every socket it held notices within a second or two. Clients
// that all wait "1 s, 2 s, 4 s" come back in synchronised waves, each one a connection storm on
// the surviving edges (the reconnect storm of every large chat system's post-mortems). Drawing the
// wait uniformly from [0, min(cap, base * 2^attempt)] spreads each wave over its whole window.
// A server that says "too many" (4029) or "flooding" (1008) is obeyed harder: a longer base, and
// never less than half the window, so such a client cannot come straight back. A server that
// closes with 1012 (its edge drains) or 1011 (a shard out of reach) asks for the opposite: come
// back at once, to any edge, within a small jittered window (restartDelay); the account keeps its
// presence meanwhile (protocol.md "Drain and resume").

/** Close codes after which the client backs off harder: too many sockets, a flood. */
export const THROTTLING_CLOSE_CODES = Object.freeze([4029, 1008]);
/** Close codes after which the client comes back at once: the edge drains, a shard was away. */
export const RESTART_CLOSE_CODES = Object.freeze([1011, 1012]);

/** The default policy, in milliseconds. */
export const DEFAULT_BACKOFF = Object.freeze({
  baseMs: 1000, // window of the first retry
  capMs: 30_000, // the window never grows past this
  throttledBaseMs: 10_000, // after 4029 / 1008
  throttledCapMs: 120_000,
  restartWindowMs: 1000, // after 1012 / 1011: uniform over this window, then the usual backoff
});

/**
 * How long to wait before reconnect attempt number `attempt` (0 for the first retry after a
 * connection was lost). `throttled` after a 4029 or 1008 close. `random` returns a number in
 * [0, 1), like Math.random (inject one to test, or to reproduce a storm).
 */
export function reconnectDelay(attempt, throttled = false, policy = DEFAULT_BACKOFF, random = Math.random) {
  const p = { ...DEFAULT_BACKOFF, ...policy };
  const n = Math.min(Math.max(0, Math.floor(attempt)), 52); // 2^52 already passes any cap
  if (throttled) {
    const window = Math.min(p.throttledCapMs, p.throttledBaseMs * 2 ** n);
    return window / 2 + (random() * window) / 2;
  }
  return random() * Math.min(p.capMs, p.baseMs * 2 ** n);
}

/**
 * How long to wait before reconnecting after a 1012 or 1011 close: at once, jittered over
 * `restartWindowMs` so that the clients of one drained edge do not arrive in one instant.
 */
export function restartDelay(policy = DEFAULT_BACKOFF, random = Math.random) {
  const p = { ...DEFAULT_BACKOFF, ...policy };
  return random() * p.restartWindowMs;
}
