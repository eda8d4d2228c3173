// The client against a scripted socket and a fake clock: `node --test clients/js/test/`.
// (tests/unit/test_js_client.py runs it from pytest; the real-service test is
// clients/js/test/live.test.mjs, driven by tests/integration/test_clients_live.py.)
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import net from "node:net";
import { test } from "node:test";

import { MAX_QUEUED_FRAMES, PresenceClient, chunkIds, reconnectDelay, restartDelay } from "../src/index.js";

class FakeClock {
  constructor() {
    this.t = 1_000_000;
    this.timers = new Map();
    this.next = 1;
  }
  now = () => this.t;
  setTimeout = (fn, ms) => {
    const id = this.next++;
    this.timers.set(id, { at: this.t + Math.max(0, ms), fn });
    return id;
  };
  clearTimeout = (id) => {
    this.timers.delete(id);
  };
  /** Move time forward, running every timer that falls due, in order. */
  async advance(ms) {
    const end = this.t + ms;
    for (;;) {
      let due = null;
      for (const [id, timer] of this.timers) {
        if (timer.at <= end && (due === null || timer.at < due[1].at)) due = [id, timer];
      }
      if (due === null) break;
      this.timers.delete(due[0]);
      this.t = due[1].at;
      due[1].fn();
      await flush();
    }
    this.t = end;
    await flush();
  }
}

const flush = () => new Promise((resolve) => setImmediate(resolve));

/** A socket the test plays the server of. */
class FakeSocket {
  static all = [];
  constructor(url) {
    this.url = url;
    this.sent = [];
    this.closed = null;
    FakeSocket.all.push(this);
  }
  static last() {
    return FakeSocket.all[FakeSocket.all.length - 1];
  }
  send(text) {
    this.sent.push(JSON.parse(text));
  }
  close(code, reason) {
    this.closed = { code, reason };
  }
  // server side
  open() {
    this.onopen?.({});
  }
  push(frame) {
    this.onmessage?.({ data: JSON.stringify(frame) });
  }
  drop(code, reason = "") {
    this.onclose?.({ code, reason });
  }
  types() {
    return this.sent.map((f) => f.type);
  }
  take() {
    const out = this.sent;
    this.sent = [];
    return out;
  }
}

function make(options = {}) {
  FakeSocket.all = [];
  const clock = new FakeClock();
  const client = new PresenceClient({
    url: ["ws://a/ws/presence", "ws://b/ws/presence"],
    token: "T",
    WebSocket: FakeSocket,
    clock,
    random: () => 0.5,
    ...options,
  });
  const states = [];
  client.on("state", (state, info) => states.push([state, info]));
  return { client, clock, states };
}

async function ready(ws, user = "me", extra = {}) {
  ws.open();
  assert.equal(ws.take()[0].type, "identify");
  ws.push({ type: "ready", userId: user, socketId: "s-1", status: "online", heartbeatIntervalMs: 30_000, ...extra });
  await flush();
}

/** Connect `client` and open its first socket with a `ready`: that socket. */
async function opened(client) {
  client.connect();
  await flush();
  const ws = FakeSocket.last();
  await ready(ws);
  return ws;
}

/** After the reconnect's wait (1 s), the next socket, opened with a `ready` (`extra` in it). */
async function reopened(clock, extra = {}) {
  await clock.advance(1_000);
  const ws = FakeSocket.last();
  await ready(ws, "me", extra);
  return ws;
}

/** Answer every pending heartbeat of `ws`, after `before` (frames the server sends first). */
function ackAll(ws, before = []) {
  for (const f of before) ws.push(f);
  for (const f of ws.take()) if (f.type === "heartbeat") ws.push({ type: "heartbeat.ack" });
}

test("identify, ready, heartbeat at the server's interval", async () => {
  const { client, clock, states } = make();
  client.connect();
  await flush();
  const ws = FakeSocket.last();
  assert.equal(ws.url, "ws://a/ws/presence");
  ws.open();
  assert.deepEqual(ws.take(), [{ type: "identify", token: "T" }]);
  ws.push({ type: "ready", userId: "me", socketId: "s-1", status: "online", heartbeatIntervalMs: 20_000 });
  await flush();
  assert.equal(client.state, "open");
  assert.equal(client.userId, "me");
  assert.deepEqual(states.map((s) => s[0]), ["connecting", "open"]);
  await clock.advance(19_999);
  assert.deepEqual(ws.types(), []);
  await clock.advance(1);
  assert.deepEqual(ws.types(), ["heartbeat"]);
  ackAll(ws);
  await clock.advance(20_000);
  assert.deepEqual(ws.types(), ["heartbeat"]);
  client.close();
  assert.equal(client.state, "closed");
  assert.equal(ws.closed.code, 1000);
});

test("a heartbeat nobody answers is a dead connection: dropped and reconnected elsewhere", async () => {
  const { client, clock, states } = make();
  client.connect();
  await flush();
  const ws = FakeSocket.last();
  await ready(ws);
  await clock.advance(30_000); // heartbeat out
  assert.deepEqual(ws.types(), ["heartbeat"]);
  await clock.advance(29_999);
  assert.equal(client.state, "open");
  await clock.advance(1); // no frame at all within an interval of it
  assert.equal(ws.closed.code, 4000);
  assert.equal(client.state, "reconnecting");
  const [, info] = states.at(-1);
  assert.equal(info.code, 4000);
  assert.equal(info.delayMs, 500); // it lived 60 s (stable): attempt 0, 0.5 of the 1 s window
  await clock.advance(info.delayMs);
  assert.equal(FakeSocket.all.length, 2);
  assert.equal(FakeSocket.last().url, "ws://b/ws/presence");
});

test("no ready within the connect timeout: dropped, backed off", async () => {
  const { client, clock } = make({ connectTimeoutMs: 5_000 });
  client.connect();
  await flush();
  const ws = FakeSocket.last();
  ws.open(); // upgrade done, but no ready
  await clock.advance(5_000);
  assert.equal(ws.closed.code, 4000);
  assert.equal(client.state, "reconnecting");
});

/**
 * A FakeSocket that closes the way the `ws` package does: close() before the socket opened emits
 * "error" (on the next tick); an "error" with no listener would end the process, so it is
 * recorded in `unhandledErrors` instead.
 */
class WsLikeSocket extends FakeSocket {
  unhandledErrors = 0;
  isOpen = false;
  open() {
    this.isOpen = true;
    super.open();
  }
  close(code, reason) {
    super.close(code, reason);
    if (this.isOpen) return;
    process.nextTick(() => {
      if (typeof this.onerror === "function") this.onerror({ message: "closed before the connection was established" });
      else this.unhandledErrors += 1;
    });
  }
}

test("a socket closed while still connecting (connect timeout, close()) leaves an error listener: no unhandled error", async () => {
  const { client, clock } = make({ WebSocket: WsLikeSocket, connectTimeoutMs: 5_000 });
  client.connect();
  await flush();
  const first = FakeSocket.last(); // never opens
  await clock.advance(5_000);
  assert.equal(first.closed.code, 4000);
  assert.equal(client.state, "reconnecting");
  await clock.advance(1_000);
  const second = FakeSocket.last();
  assert.notEqual(second, first);
  client.close(); // while the second one is still connecting
  await flush();
  assert.equal(client.state, "closed");
  assert.deepEqual([first.unhandledErrors, second.unhandledErrors], [0, 0]);
});

// Debian's node-ws (what CI installs, and docs/clients.md's WebSocket on Node 20), when present.
const WS_PATH = "/usr/share/nodejs/ws/index.js";
const RealWebSocket = existsSync(WS_PATH) ? createRequire(import.meta.url)(WS_PATH) : null;

test("with the ws package: a connect timeout and a close() while connecting end no process", { skip: RealWebSocket === null && "no ws package (apt-get install node-ws)" }, async () => {
  const server = net.createServer(() => {}); // accepts, never answers the upgrade: stays connecting
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const url = `ws://127.0.0.1:${server.address().port}/ws/presence`;
  const client = new PresenceClient({ url, token: "T", WebSocket: RealWebSocket, connectTimeoutMs: 50, random: () => 0 });
  const states = [];
  client.on("state", (state, info) => states.push([state, info.reason]));
  try {
    client.connect();
    // An unhandled "error" would fail this test as an uncaught exception before the wait ends.
    const deadline = Date.now() + 5_000;
    while (!states.some(([state, reason]) => state === "reconnecting" && reason === "no ready within the connect timeout")) {
      assert.ok(Date.now() < deadline, `no reconnect after the connect timeout: ${JSON.stringify(states)}`);
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    while (client.state !== "connecting") {
      assert.ok(Date.now() < deadline, `no second attempt: ${JSON.stringify(states)}`);
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    client.close();
    await flush(); // ws emits its "error" on the next tick
    await flush();
    assert.equal(client.state, "closed");
  } finally {
    client.close();
    server.close();
  }
});

test("backoff grows with full jitter and resets after a stable connection", async () => {
  const draws = [0.9, 0.1, 0.7, 0.3, 0.5];
  let i = 0;
  const { client, clock, states } = make({ random: () => draws[i++ % draws.length] });
  client.connect();
  await flush();
  const delays = [];
  for (let n = 0; n < 4; n += 1) {
    FakeSocket.last().drop(1006);
    const [, info] = states.at(-1);
    delays.push(info.delayMs);
    await clock.advance(info.delayMs);
  }
  const expected = [0, 1, 2, 3].map((n) => reconnectDelay(n, false, undefined, () => draws[n]));
  assert.deepEqual(delays, expected);
  assert.deepEqual(delays, [900, 200, 2800, 2400]);
  // A connection that lived past stableAfterMs starts over at attempt 0.
  await ready(FakeSocket.last());
  await clock.advance(6_000);
  ackAll(FakeSocket.last());
  FakeSocket.last().drop(1001);
  assert.equal(states.at(-1)[1].attempt, 0);
  // One that dies young does not.
  await clock.advance(states.at(-1)[1].delayMs);
  await ready(FakeSocket.last());
  FakeSocket.last().drop(1006);
  assert.equal(states.at(-1)[1].attempt, 1);
  client.close();
});

test("1012 (the edge drains) and 1011: back at once within the jittered restart window, to the next edge", async () => {
  for (const code of [1012, 1011]) {
    const { client, clock, states } = make({ url: ["ws://a/ws/presence", "ws://b/ws/presence"], random: () => 0.5 });
    client.connect();
    await flush();
    // Young, after failures: the backoff has grown, and a drain close starts it over.
    FakeSocket.last().drop(1006);
    await clock.advance(states.at(-1)[1].delayMs);
    FakeSocket.last().drop(1006);
    await clock.advance(states.at(-1)[1].delayMs);
    await ready(FakeSocket.last());
    const before = FakeSocket.all.length;
    const url = FakeSocket.last().url;
    FakeSocket.last().drop(code, "service restart; reconnect");
    const info = states.at(-1)[1];
    assert.equal(info.code, code);
    assert.equal(info.throttled, false);
    assert.equal(info.attempt, 0);
    assert.equal(info.delayMs, restartDelay(undefined, () => 0.5));
    assert.equal(info.delayMs, 500);
    await clock.advance(info.delayMs);
    assert.equal(FakeSocket.all.length, before + 1);
    assert.notEqual(FakeSocket.last().url, url); // the next edge of the list
    // Should that fail too, the usual backoff takes over from its first window.
    FakeSocket.last().drop(1006);
    assert.equal(states.at(-1)[1].attempt, 1);
    client.close();
  }
});

test("close codes: 4029 and 1008 back off harder, 1000 stops, 4001 asks the provider again", async () => {
  const asked = [];
  const { client, clock, states } = make({
    token: (ctx) => {
      asked.push(ctx);
      return `T${asked.length}`;
    },
  });
  client.connect();
  await flush();
  FakeSocket.last().drop(4029);
  let info = states.at(-1)[1];
  assert.equal(info.throttled, true);
  assert.equal(info.delayMs, reconnectDelay(0, true, undefined, () => 0.5));
  assert.ok(info.delayMs >= 5_000);
  await clock.advance(info.delayMs);
  FakeSocket.last().drop(1008);
  info = states.at(-1)[1];
  assert.ok(info.delayMs >= 10_000, info.delayMs);
  await clock.advance(info.delayMs);
  FakeSocket.last().drop(4001);
  await clock.advance(states.at(-1)[1].delayMs);
  assert.deepEqual(
    asked.map((a) => a.rejected),
    [false, false, false, true],
  );
  const ws = FakeSocket.last();
  ws.open();
  assert.deepEqual(ws.take(), [{ type: "identify", token: "T4" }]);
  ws.push({ type: "ready", userId: "me", socketId: "s", status: "online", heartbeatIntervalMs: 30_000 });
  ws.drop(1000);
  assert.equal(client.state, "closed");
  await clock.advance(600_000);
  assert.equal(FakeSocket.all.length, 4);
});

test("a token provider that never answers is given up on at the connect timeout and asked again", async () => {
  let asked = 0;
  const { client, clock, states } = make({
    connectTimeoutMs: 1_000,
    token: () => {
      asked += 1;
      return asked === 1 ? new Promise(() => {}) : "T2"; // the first never settles
    },
  });
  const errors = [];
  client.on("error", (e) => errors.push(e.message));
  client.connect();
  await flush();
  assert.equal(FakeSocket.all.length, 0);
  await clock.advance(1_000);
  assert.deepEqual(errors, ["token: no token within 1000 ms"]);
  assert.equal(states.at(-1)[0], "reconnecting");
  await clock.advance(states.at(-1)[1].delayMs);
  await flush();
  const ws = FakeSocket.last();
  ws.open();
  assert.deepEqual(ws.take(), [{ type: "identify", token: "T2" }]);
  client.close();
});

test("a url function that throws is retried like a socket that could not open", async () => {
  let calls = 0;
  const { client, clock, states } = make({
    url: () => {
      calls += 1;
      if (calls === 1) throw new Error("no edge known yet");
      return "ws://a/ws/presence";
    },
  });
  const errors = [];
  client.on("error", (e) => errors.push(e.code));
  client.connect();
  await flush();
  assert.deepEqual(errors, ["connect"]);
  assert.equal(states.at(-1)[0], "reconnecting");
  await clock.advance(states.at(-1)[1].delayMs);
  await flush();
  await ready(FakeSocket.last());
  assert.equal(client.state, "open");
  client.close();
});

test("4001 with a fixed token stops: the same token would be refused again", async () => {
  const { client, clock } = make();
  const errors = [];
  client.on("error", (e) => errors.push(e.code));
  client.connect();
  await flush();
  FakeSocket.last().drop(4001, "bad token");
  assert.equal(client.state, "closed");
  assert.deepEqual(errors, ["unauthorized"]);
  await clock.advance(600_000);
  assert.equal(FakeSocket.all.length, 1);
});

test("a token provider handing back the token just refused stops, as a fixed token does (a fresh one is tried)", async () => {
  const asked = [];
  const { client, clock, states } = make({
    token: (ctx) => {
      asked.push(ctx);
      return asked.length === 1 ? "T1" : "T2"; // T2 for good: refused, then handed back
    },
  });
  const errors = [];
  client.on("error", (e) => errors.push(e));
  client.connect();
  await flush();
  FakeSocket.last().open();
  FakeSocket.last().drop(4001); // T1 refused
  await clock.advance(states.at(-1)[1].delayMs);
  await flush();
  assert.equal(FakeSocket.all.length, 2); // T2 is fresh: tried
  FakeSocket.last().open();
  FakeSocket.last().drop(4001); // T2 refused
  await clock.advance(states.at(-1)[1].delayMs);
  await flush();
  assert.equal(client.state, "closed");
  assert.deepEqual(errors.map((e) => e.code), ["unauthorized"]);
  assert.match(errors[0].message, /just refused/);
  assert.deepEqual(asked.map((c) => c.rejected), [false, true, true]);
  assert.deepEqual(FakeSocket.all.map((ws) => ws.sent[0].token), ["T1", "T2"]); // the repeat never sent
  await clock.advance(600_000);
  assert.equal(FakeSocket.all.length, 2);
});

// The edge's reason for a 4001 to a socket whose identify came too late (edge/session.py
// IDENTIFY_DEADLINE): not a refused token.
const LATE_IDENTIFY = "no identify within the time allowed";

test("4001 for an identify that came too late: a fixed token reconnects with the usual backoff and opens (not unauthorized)", async () => {
  const { client, clock, states } = make();
  const errors = [];
  client.on("error", (e) => errors.push(e.code));
  client.connect();
  await flush();
  FakeSocket.last().open();
  FakeSocket.last().drop(4001, LATE_IDENTIFY);
  const [state, info] = states.at(-1);
  assert.equal(state, "reconnecting");
  assert.deepEqual(
    [info.code, info.reason, info.attempt, info.throttled, info.delayMs],
    [4001, LATE_IDENTIFY, 0, false, reconnectDelay(0, false, undefined, () => 0.5)],
  );
  await clock.advance(info.delayMs);
  await ready(FakeSocket.last());
  assert.equal(client.state, "open");
  assert.deepEqual(errors, []);
  client.close();
});

test("4001 for an identify that came too late: the token provider is not told of a rejection, and the same token is sent again", async () => {
  const asked = [];
  const { client, clock, states } = make({
    token: (ctx) => {
      asked.push(ctx);
      return "T";
    },
  });
  client.connect();
  await flush();
  FakeSocket.last().open();
  FakeSocket.last().drop(4001, LATE_IDENTIFY);
  await clock.advance(states.at(-1)[1].delayMs);
  await flush();
  assert.equal(FakeSocket.all.length, 2);
  const ws = FakeSocket.last();
  ws.open();
  assert.deepEqual(ws.take(), [{ type: "identify", token: "T" }]); // handed back: sent again
  ws.push({ type: "ready", userId: "me", socketId: "s", status: "online", heartbeatIntervalMs: 30_000 });
  await flush();
  assert.equal(client.state, "open");
  assert.deepEqual(asked.map((c) => c.rejected), [false, false]);
  client.close();
});

test("4001 for an identify that came too late after a refusal: the refused token stays the one refused", async () => {
  const asked = [];
  const { client, clock, states } = make({
    token: (ctx) => {
      asked.push(ctx);
      return asked.length === 1 ? "T1" : "T2";
    },
  });
  client.connect();
  await flush();
  FakeSocket.last().open();
  FakeSocket.last().drop(4001, "bad token"); // T1 refused
  await clock.advance(states.at(-1)[1].delayMs);
  await flush();
  FakeSocket.last().open();
  FakeSocket.last().drop(4001, LATE_IDENTIFY); // T2 late: not refused
  await clock.advance(states.at(-1)[1].delayMs);
  await flush();
  assert.equal(FakeSocket.all.length, 3);
  const ws = FakeSocket.last();
  ws.open();
  assert.deepEqual(ws.take(), [{ type: "identify", token: "T2" }]); // handed back: tried (only T1 was refused)
  ws.push({ type: "ready", userId: "me", socketId: "s", status: "online", heartbeatIntervalMs: 30_000 });
  await flush();
  assert.equal(client.state, "open");
  // Told of T1's refusal until a ready; the late T2 adds nothing to it.
  assert.deepEqual(asked.map((c) => c.rejected), [false, true, true]);
  assert.deepEqual(FakeSocket.all.slice(0, 2).map((w) => w.sent[0].token), ["T1", "T2"]);
  client.close();
});

test("subscriptions are restored after a reconnect and the picture reconciled: no ghost survives", async () => {
  const { client, clock } = make();
  const changes = [];
  let syncs = 0;
  client.on("change", (u, now) => changes.push([u, now?.status]));
  client.onSync(() => (syncs += 1));
  let ws = await opened(client);
  ws.take();
  const subscribed = client.subscribe(["a", "b", "c"]);
  await flush();
  assert.deepEqual(ws.sent, [{ type: "presence.subscribe", userIds: ["a", "b", "c"] }, { type: "heartbeat" }]);
  ackAll(ws, [{ type: "presence.sync", users: [{ userId: "a", status: "online" }, { userId: "b", status: "dnd" }] }]);
  await subscribed;
  assert.deepEqual(client.get("a"), { status: "online", lastSeenAt: undefined });
  assert.equal(client.get("c"), undefined); // outside the audience: nothing known
  ws.push({ type: "presence.changed", userId: "c", status: "online" }); // audience widened
  assert.equal(client.get("c").status, "online");
  assert.ok(syncs >= 2);

  // The edge dies; meanwhile a went offline and b left the audience.
  ws.drop(1006);
  await clock.advance(client._reconnectTimer === null ? 0 : 1_000);
  ws = FakeSocket.last();
  await ready(ws);
  const frames = ws.take();
  assert.deepEqual(frames, [{ type: "presence.subscribe", userIds: ["a", "b", "c"] }, { type: "heartbeat" }]);
  assert.equal(client.synced, false);
  changes.length = 0;
  ws.push({ type: "presence.sync", users: [{ userId: "a", status: "offline" }, { userId: "c", status: "online" }] });
  ws.push({ type: "heartbeat.ack" });
  await flush();
  assert.equal(client.synced, true);
  assert.deepEqual(client.list().map((e) => [e.userId, e.status]).sort(), [
    ["a", "offline"],
    ["c", "online"],
  ]);
  assert.deepEqual(changes, [
    ["a", "offline"],
    ["b", undefined],
  ]);
  client.unsubscribe(["c"]);
  assert.deepEqual(ws.take(), [{ type: "presence.unsubscribe", userIds: ["c"] }]);
  assert.equal(client.get("c"), undefined);
  client.close();
});

test("subscribe right after connect() resolves once the sync after open is applied (docs/clients.md's example)", async () => {
  const { client } = make();
  client.subscribeChannel("c1");
  client.connect();
  let resolved = false;
  const subscribed = client.subscribe(["bob"]).then(() => (resolved = true));
  await flush();
  assert.equal(resolved, false); // still connecting: nothing is applied yet
  const ws = FakeSocket.last();
  await ready(ws);
  assert.deepEqual(ws.take().filter((f) => f.type === "presence.subscribe"), [{ type: "presence.subscribe", userIds: ["bob"] }]);
  await flush();
  assert.equal(resolved, false);
  ws.push({ type: "presence.sync", users: [{ userId: "bob", status: "online" }] });
  ws.push({ type: "heartbeat.ack" });
  await subscribed;
  assert.equal(client.state, "open");
  assert.deepEqual(client.get("bob"), { status: "online", lastSeenAt: undefined });
  assert.equal(client.typing("c1"), true); // the example's next line: sent
  client.close();
});

test("subscribe while connecting: rejected by a refused resubscribe, by close(), by a refused token; at once before connect()", async () => {
  const { client } = make();
  await client.subscribe(["a"]); // not started: remembered, subscribed on connect
  client.connect();
  const refused = client.subscribe(["b"]);
  await flush();
  let ws = FakeSocket.last();
  await ready(ws);
  ackAll(ws, [{ type: "error", code: "rate_limited", message: "slow down" }]);
  await assert.rejects(refused, { code: "rate_limited" });
  ws.drop(1006);
  const closed = client.subscribe(["c"]);
  client.close();
  await assert.rejects(closed, { code: "disconnected" });

  const other = make();
  other.client.connect();
  await flush();
  const unauthorized = other.client.subscribe(["a"]);
  FakeSocket.last().drop(4001);
  await assert.rejects(unauthorized, { code: "unauthorized" });
});

test("a refused resubscribe (budget spent) is retried later, and forgets what it cannot confirm", async () => {
  const { client, clock } = make();
  const errors = [];
  client.on("error", (e) => errors.push(e.code));
  let ws = await opened(client);
  ws.take();
  const first = client.subscribe(["a"]);
  await flush();
  ackAll(ws, [{ type: "presence.sync", users: [{ userId: "a", status: "online" }] }]);
  await first;
  ws.drop(1006);
  ws = await reopened(clock);
  ackAll(ws, [{ type: "error", code: "rate_limited", message: "slow down" }]);
  await flush();
  assert.deepEqual(errors, ["rate_limited"]);
  assert.equal(client.get("a"), undefined);
  assert.equal(client.synced, false);
  await clock.advance(reconnectDelay(1, true, undefined, () => 0.5));
  assert.deepEqual(ws.sent[0], { type: "presence.subscribe", userIds: ["a"] });
  ackAll(ws, [{ type: "presence.sync", users: [{ userId: "a", status: "idle" }] }]);
  await flush();
  assert.equal(client.get("a").status, "idle");
  assert.equal(client.synced, true);
  client.close();
});

test("a malformed frame of a known type is dropped whole and reported; the client carries on", async () => {
  const { client } = make();
  const errors = [];
  client.on("error", (e) => errors.push(e.code));
  client.subscribeChannel("c1");
  client.connect();
  await flush();
  const ws = FakeSocket.last();
  await ready(ws);
  ws.take();
  const subscribed = client.subscribe(["a", "b"]);
  await flush();
  // Each of these threw inside the message handler: under `ws`, an uncaught exception.
  ws.push({ type: "presence.sync", users: [{ userId: "a", status: "online" }, null] });
  ws.push({ type: "voice.roster", channelId: "c1" });
  ws.push({ type: "voice.roster", channelId: "c1", userIds: null });
  ws.push({ type: "presence.sync", users: 7 });
  assert.deepEqual(errors, ["malformed_frame", "malformed_frame", "malformed_frame", "malformed_frame"]);
  assert.equal(client.get("a"), undefined); // nothing half-applied
  assert.deepEqual(client.roster("c1"), []);
  // The frames after it are read as ever.
  ackAll(ws, [{ type: "presence.sync", users: [{ userId: "a", status: "online" }, { userId: "b", status: "dnd" }] }]);
  await subscribed;
  ws.push({ type: "voice.roster", channelId: "c1", userIds: ["me"] });
  assert.equal(client.state, "open");
  assert.equal(client.get("b").status, "dnd");
  assert.deepEqual(client.roster("c1"), ["me"]);
  client.close();
});

test("a ready without a usable heartbeatIntervalMs: the contract's 30 s, as in presence_client", async () => {
  for (const interval of [-5, "soon", null]) {
    const { client, clock } = make();
    client.connect();
    await flush();
    const ws = FakeSocket.last();
    await ready(ws, "me", { heartbeatIntervalMs: interval });
    await clock.advance(29_999);
    assert.deepEqual(ws.types(), [], `${interval}`);
    await clock.advance(1);
    assert.deepEqual(ws.types(), ["heartbeat"], `${interval}`);
    client.close();
  }
});

test("query: <= 100 ids a frame, answers merged in the order asked, last-seen kept", async () => {
  const { client } = make();
  client.connect();
  await flush();
  const ws = FakeSocket.last();
  await ready(ws);
  ws.take();
  const ids = Array.from({ length: 250 }, (_, i) => `u${i}`);
  const answer = client.query([...ids, "u3"]);
  await flush();
  const sent = ws.take();
  assert.deepEqual(
    sent.map((f) => (f.type === "presence.query" ? f.userIds.length : f.type)),
    [100, "heartbeat", 100, "heartbeat", 50, "heartbeat"],
  );
  // The edge answers each frame in turn; u7 is outside the audience; a broadcast slips in.
  for (const f of sent) {
    if (f.type === "heartbeat") {
      ws.push({ type: "heartbeat.ack" });
      continue;
    }
    for (const u of f.userIds) {
      if (u === "u7") continue;
      const offline = u === "u1" || u === "u200";
      ws.push({ type: "presence.changed", userId: u, status: offline ? "offline" : "online", ...(u === "u1" ? { lastSeenAt: "2026-12-02T08:47:00.000Z" } : {}) });
      // A broadcast right after the answer (same status, no time): the answer's time is kept.
      if (u === "u1") ws.push({ type: "presence.changed", userId: "u1", status: "offline" });
    }
  }
  const got = await answer;
  assert.equal(got.size, 249);
  assert.deepEqual([...got.keys()].slice(0, 8), ["u0", "u1", "u2", "u3", "u4", "u5", "u6", "u8"]);
  assert.deepEqual(got.get("u1"), { status: "offline", lastSeenAt: "2026-12-02T08:47:00.000Z" });
  assert.deepEqual(got.get("u200"), { status: "offline", lastSeenAt: null });
  assert.deepEqual(got.get("u0"), { status: "online", lastSeenAt: null });
  client.close();
});

test("query refused by the budget rejects; a query while disconnected rejects", async () => {
  const { client } = make();
  await assert.rejects(client.query(["a"]), { code: "not_connected" });
  client.connect();
  await flush();
  const ws = FakeSocket.last();
  await ready(ws);
  ws.take();
  const q = client.query(["a"]);
  await flush();
  ackAll(ws, [{ type: "error", code: "rate_limited", message: "query budget spent" }]);
  await assert.rejects(q, { code: "rate_limited" });
  const lost = client.query(["a"]);
  await flush();
  ws.drop(1006);
  await assert.rejects(lost, { code: "disconnected" });
  client.close();
});

test("ids are chunked by count and by bytes", () => {
  assert.deepEqual(chunkIds(["a", "b", "a", "c"], 2), [["a", "b"], ["c"]]);
  const long = Array.from({ length: 100 }, (_, i) => `${i}`.padEnd(128, "é"));
  for (const chunk of chunkIds(long)) {
    assert.ok(new TextEncoder().encode(JSON.stringify({ type: "presence.query", userIds: chunk })).length < 16 * 1024);
  }
});

test("typing: typing.start throttled, others lapse locally after 10 s", async () => {
  const { client, clock } = make();
  const seen = [];
  client.on("typing", (channelId, users) => seen.push([channelId, users]));
  client.connect();
  await flush();
  const ws = FakeSocket.last();
  await ready(ws);
  client.subscribeChannel("c1");
  ws.take();
  assert.equal(client.typing("c1"), true);
  await clock.advance(3_000);
  assert.equal(client.typing("c1"), false);
  await clock.advance(5_000);
  assert.equal(client.typing("c1"), true);
  client.stopTyping("c1");
  assert.deepEqual(ws.take().filter((f) => f.type !== "heartbeat").map((f) => f.type), [
    "typing.start",
    "typing.start",
    "typing.stop",
  ]);
  ws.push({ type: "typing", channelId: "c1", userId: "zed" });
  ws.push({ type: "typing", channelId: "c1", userId: "amy" });
  ws.push({ type: "typing", channelId: "elsewhere", userId: "amy" }); // not subscribed: ignored
  assert.deepEqual(client.typers("c1"), ["amy", "zed"]);
  await clock.advance(6_000);
  ws.push({ type: "typing", channelId: "c1", userId: "amy" }); // amy goes on typing
  await clock.advance(4_000);
  assert.deepEqual(client.typers("c1"), ["amy"]);
  await clock.advance(6_000);
  assert.deepEqual(client.typers("c1"), []);
  assert.deepEqual(seen.at(-1), ["c1", []]);
  client.close();
});

test("a roster that arrives after unsubscribeChannel is not kept (as typing is not)", async () => {
  const { client } = make();
  client.subscribeChannel("c1");
  const ws = await opened(client);
  ws.push({ type: "voice.roster", channelId: "c1", userIds: ["me"] });
  client.unsubscribeChannel("c1");
  // Sent by the edge before it read the unsubscribe.
  ws.push({ type: "voice.roster", channelId: "c1", userIds: ["me", "bob"] });
  ws.push({ type: "typing", channelId: "c1", userId: "bob" });
  assert.deepEqual(client.roster("c1"), []);
  assert.deepEqual(client.typers("c1"), []);
  client.close();
});

test("channels, voice, idle and focus are restored on the new socket; rosters kept", async () => {
  const { client, clock } = make();
  const rosters = [];
  client.on("roster", (c, users) => rosters.push([c, users]));
  client.subscribeChannel("c1"); // before connecting: remembered
  client.setStatus("idle");
  let ws = await opened(client);
  assert.deepEqual(ws.take(), [
    { type: "presence.update", status: "idle" },
    { type: "channel.subscribe", channelId: "c1" },
  ]);
  client.joinVoice("c1");
  client.setFocus("c1");
  ws.push({ type: "voice.roster", channelId: "c1", userIds: ["me", "bob"] });
  assert.deepEqual(client.roster("c1"), ["me", "bob"]);
  ws.drop(1001);
  ws = await reopened(clock);
  assert.deepEqual(ws.take(), [
    { type: "presence.update", status: "idle" },
    { type: "focus", channelId: "c1" },
    { type: "channel.subscribe", channelId: "c1" },
    { type: "voice.join", channelId: "c1" },
  ]);
  assert.deepEqual(rosters, [["c1", ["me", "bob"]]]);
  client.setStatus("online");
  client.leaveVoice();
  ws.drop(1001);
  ws = await reopened(clock);
  // Not idle any more, out of voice; `online` again because no heartbeat after it was answered.
  assert.deepEqual(ws.take(), [
    { type: "presence.update", status: "online" },
    { type: "focus", channelId: "c1" },
    { type: "channel.subscribe", channelId: "c1" },
  ]);
  client.close();
});

test("choices queued behind the pacing, or sent but not yet confirmed, at a close are sent again after the next ready", async () => {
  const { client, clock } = make({ rateBurst: 2, ratePerSecond: 1 });
  const choices = (frames) => frames.filter((f) => f.type === "presence.update" || f.type === "settings.update");
  let ws = await opened(client);
  client.subscribeChannel("a");
  client.subscribeChannel("b"); // the burst
  client.setStatus("invisible");
  client.setLastSeenVisibility("nobody"); // both queued behind the pacing
  assert.deepEqual(ws.types(), ["channel.subscribe", "channel.subscribe"]);
  ws.drop(1012); // a drain: the queue never went out
  ws = await reopened(clock);
  const restored = [
    { type: "presence.update", status: "invisible" },
    { type: "settings.update", lastSeenVisibility: "nobody" },
  ];
  assert.deepEqual(choices(ws.take()), restored);
  // Sent, but no heartbeat after them answered: the edge may not have read them.
  ws.drop(1012);
  ws = await reopened(clock);
  assert.deepEqual(choices(ws.take()), restored);
  // Read (a heartbeat queued after them answered): durable upstream, not sent again.
  await clock.advance(30_000);
  ackAll(ws);
  ws.drop(1012);
  ws = await reopened(clock);
  await clock.advance(5_000);
  assert.deepEqual(choices(ws.take()), []);
  client.close();
});

test("a status chosen while disconnected and the socket's idle flag are both restored", async () => {
  const { client, clock } = make();
  let ws = await opened(client);
  client.setStatus("idle");
  await clock.advance(30_000);
  ackAll(ws); // read by the edge
  ws.drop(1001);
  client.setStatus("dnd"); // while disconnected
  ws = await reopened(clock);
  assert.deepEqual(ws.take(), [
    { type: "presence.update", status: "dnd" },
    { type: "presence.update", status: "idle" },
  ]);
  // Idle chosen after a pending invisible does not replace it: invisible must hold.
  ws.drop(1001);
  client.setStatus("invisible");
  client.setStatus("idle");
  await clock.advance(2_000);
  ws = FakeSocket.last();
  await ready(ws);
  assert.deepEqual(ws.take(), [
    { type: "presence.update", status: "invisible" },
    { type: "presence.update", status: "idle" },
  ]);
  client.close();
});

test("back from a drain to a resumed idle place while awake: says online (its last online may never have been read)", async () => {
  const { client, clock } = make();
  let ws = await opened(client);
  client.setStatus("idle");
  client.setStatus("online"); // sent; the draining edge closes the socket before reading it
  ws.take();
  ws.drop(1012);
  ws = await reopened(clock, { status: "idle" }); // the held place it took was idle
  assert.deepEqual(ws.take(), [{ type: "presence.update", status: "online" }]);
  await clock.advance(30_000);
  ackAll(ws); // this time the edge read it
  ws.drop(1012);
  ws = await reopened(clock, { status: "online" }); // nothing to restore
  assert.deepEqual(ws.take(), []);
  client.close();
});

test("an idle socket back from a drain does not wake to repeat an online the ready shows chosen", async () => {
  // `online` chosen, then idle, and a drain before a heartbeat confirmed the choice: the old
  // client sent `online` again after the next ready, waking the idle socket, then `idle`; the
  // account's watchers saw it online, then idle (seen live through `presence drain`).
  for (const [shown, restored] of [
    ["idle", ["idle"]],
    ["online", ["idle"]],
    ["dnd", ["online", "idle"]], // the choice never read: it still goes first
  ]) {
    const { client, clock } = make();
    let ws = await opened(client);
    client.setStatus("online");
    client.setStatus("idle");
    ws.take();
    ws.drop(1012);
    ws = await reopened(clock, { status: shown });
    const statuses = ws.take().filter((f) => f.type === "presence.update").map((f) => f.status);
    assert.deepEqual(statuses, restored, shown);
    client.close();
  }
});

test("outgoing frames are paced under the edge's rate limit", async () => {
  const { client, clock } = make({ rateBurst: 10, ratePerSecond: 5 });
  client.connect();
  await flush();
  const ws = FakeSocket.last();
  await ready(ws);
  ws.take();
  for (let i = 0; i < 30; i += 1) client.subscribeChannel(`c${i}`); // frames no later one supersedes
  assert.equal(ws.sent.length, 10);
  await clock.advance(1_000);
  assert.equal(ws.sent.length, 15);
  await clock.advance(10_000);
  assert.equal(ws.sent.length, 30);
  assert.equal(ws.sent.at(-1).channelId, "c29");
  client.close();
});

test("calls in a loop: each frame takes the place of the queued ones it supersedes; the last word reaches the edge, and is what a close restores", async () => {
  // The old queue took every frame (21,000 here), drained at the pacing's rate.
  const { client, clock } = make({ rateBurst: 1, ratePerSecond: 5 });
  let ws = await opened(client);
  client.subscribeChannel("warm-up"); // the burst's one frame: what follows waits for the pacing
  ws.take();
  client.subscribeChannel("c1");
  for (let i = 0; i < 3_000; i += 1) {
    client.setStatus("idle");
    client.setStatus("online");
    client.setStatus("dnd");
    client.setFocus(`c${i}`);
    client.typing("c1");
    client.stopTyping("c1");
    client.setLastSeenVisibility(i % 2 ? "friends" : "nobody");
  }
  client.joinVoice("c1");
  client.setStatus("invisible");
  assert.equal(client._queue.length, 8);
  await clock.advance(2_000);
  assert.deepEqual(ws.take(), [
    { type: "channel.subscribe", channelId: "c1" },
    { type: "presence.update", status: "online" }, // the socket woke: invisible keeps that
    { type: "focus", channelId: "c2999" },
    { type: "typing.start", channelId: "c1" },
    { type: "settings.update", lastSeenVisibility: "friends" },
    { type: "presence.update", status: "invisible" },
    { type: "typing.stop", channelId: "c1" },
    { type: "voice.join", channelId: "c1" },
  ]);
  ws.drop(1012); // no heartbeat answered: the choices may not have been read
  ws = await reopened(clock);
  await clock.advance(2_000); // what is restored, at the pacing's rate
  assert.deepEqual(ws.take().filter((f) => f.type === "presence.update" || f.type === "settings.update"), [
    { type: "presence.update", status: "invisible" },
    { type: "settings.update", lastSeenVisibility: "friends" },
  ]);
  client.close();
});

test("nothing moves past a request and its heartbeat: a setting after a query does not take the place of one before it", async () => {
  const { client, clock } = make({ rateBurst: 1, ratePerSecond: 5 });
  const ws = await opened(client);
  client.subscribeChannel("warm-up");
  ws.take();
  client.setLastSeenVisibility("nobody"); // the query's answer depends on it: no last-seen times
  const asked = client.query(["a"]);
  client.setLastSeenVisibility("everyone");
  assert.deepEqual(client._queue.map((q) => q.frame.type), ["settings.update", "presence.query", "heartbeat", "settings.update"]);
  await clock.advance(1_000);
  assert.deepEqual(ws.take(), [
    { type: "settings.update", lastSeenVisibility: "nobody" },
    { type: "presence.query", userIds: ["a"] },
    { type: "heartbeat" },
    { type: "settings.update", lastSeenVisibility: "everyone" },
  ]);
  ws.push({ type: "presence.changed", userId: "a", status: "offline" });
  ws.push({ type: "heartbeat.ack" });
  assert.deepEqual((await asked).get("a"), { status: "offline", lastSeenAt: null });
  client.close();
});

/**
 * What an edge makes of `frames` read in order: its state for the socket at each request (what the
 * request's answer may depend on) and at the end, with the channels that had a typing.start (a
 * broadcast) since the request before; and the frames never merged, in order.
 */
function edgeReading(frames) {
  const state = { idle: null, chosen: null, visibility: null, focus: "unset", channels: {}, typing: {} };
  let broadcast = new Set();
  const atRequests = [];
  const others = [];
  const snapshot = () => JSON.stringify([state, [...broadcast].sort()]);
  for (const f of frames) {
    if (f.type === "presence.update") {
      if (f.status === "idle" || f.status === "online") state.idle = f.status === "idle";
      if (f.status !== "idle") state.chosen = f.status;
    } else if (f.type === "settings.update") state.visibility = f.lastSeenVisibility;
    else if (f.type === "focus") state.focus = f.channelId;
    else if (f.type === "channel.subscribe" || f.type === "channel.unsubscribe") {
      state.channels[f.channelId] = f.type === "channel.subscribe";
    } else if (f.type === "typing.start" || f.type === "typing.stop") {
      state.typing[f.channelId] = f.type === "typing.start";
      if (f.type === "typing.start") broadcast.add(f.channelId);
    } else {
      others.push(f);
      if (f.type === "presence.query") {
        atRequests.push(snapshot());
        broadcast = new Set();
      }
    }
  }
  atRequests.push(snapshot());
  return { atRequests, others };
}

test("whatever is sent while frames wait, the merged queue tells the edge what every frame would (presence_client's model test)", async () => {
  let seed = 7; // xorshift32 from a fixed seed: the run is the same every time
  const draw = (n) => {
    seed ^= seed << 13;
    seed ^= seed >>> 17;
    seed ^= seed << 5;
    return Math.floor(((seed >>> 0) / 2 ** 32) * n);
  };
  const pick = (list) => list[draw(list.length)];
  const channels = ["c1", "c2"];
  const makers = [
    () => ({ type: "presence.update", status: pick(["online", "idle", "dnd", "invisible"]) }),
    () => ({ type: "settings.update", lastSeenVisibility: pick(["everyone", "nobody"]) }),
    () => ({ type: "focus", channelId: pick([...channels, null]) }),
    () => ({ type: pick(["channel.subscribe", "channel.unsubscribe", "typing.start", "typing.stop"]), channelId: pick(channels) }),
    () => pick([{ type: "heartbeat" }, { type: "voice.join", channelId: "c1" }, { type: "voice.leave" }, { type: "presence.unsubscribe", userIds: ["u1"] }]),
    () => ({ type: "presence.query", userIds: ["u1"] }), // sent with its heartbeat, in a window
  ];
  const most = { "presence.update": 3, "settings.update": 1, focus: 1, channel: 1, typing: 2 };
  for (let run = 0; run < 300; run += 1) {
    const { client } = make({ rateBurst: 1, ratePerSecond: 0.001 });
    await opened(client);
    client.subscribeChannel("warm-up"); // the burst's one frame: every frame after it waits
    const every = [];
    for (let i = draw(60); i > 0; i -= 1) {
      const frame = pick([0, 0, 0, 1, 2, 3, 3, 3, 4, 5].map((k) => makers[k]))();
      if (frame.type === "presence.query") {
        const window = { startAfter: null, endAt: null, received: [], resolve() {}, reject() {} };
        for (const part of [frame, { type: "heartbeat" }]) {
          client._send(part, { window });
          every.push(part);
        }
      } else {
        assert.equal(client._send(frame), true);
        every.push(frame);
      }
    }
    const queued = client._queue.map((q) => q.frame);
    assert.deepEqual(edgeReading(queued), edgeReading(every), JSON.stringify(every));
    let held = new Map();
    for (const { frame, window } of client._queue) {
      if (window !== null) {
        held = new Map();
        continue;
      }
      const family = frame.type.split(".")[0];
      const kind = family === "channel" || family === "typing" ? family : frame.type;
      if (!(kind in most)) continue;
      const key = kind === "channel" || kind === "typing" ? `${kind} ${frame.channelId}` : kind;
      held.set(key, (held.get(key) ?? 0) + 1);
      assert.ok(held.get(key) <= most[kind], `${key}: ${JSON.stringify(queued)}`);
    }
    client.close();
  }
});

test("past MAX_QUEUED_FRAMES a call is refused (queue_full) with nothing remembered, until the queue drains", async () => {
  // The old queue took every frame.
  const { client, clock } = make({ rateBurst: 1, ratePerSecond: 100 });
  const ws = await opened(client);
  client.subscribeChannel("warm-up"); // the burst's one frame: what follows waits for the pacing
  ws.take();
  for (let i = 0; i < MAX_QUEUED_FRAMES; i += 1) client.subscribeChannel(`c${i}`);
  const full = { code: "queue_full" };
  assert.throws(() => client.subscribeChannel("one more"), full);
  assert.throws(() => client.joinVoice("c1"), full);
  assert.throws(() => client.setFocus("c1"), full);
  assert.throws(() => client.setStatus("dnd"), full);
  assert.throws(() => client.typing("c1"), full);
  await assert.rejects(client.query(["a"]), full);
  await assert.rejects(client.subscribe(["a"]), full);
  assert.deepEqual(client.watched, []);
  // A frame that supersedes a queued one takes its place: accepted, the queue no longer.
  client.unsubscribeChannel("c7");
  assert.equal(client._queue.length, MAX_QUEUED_FRAMES);
  await clock.advance(10_000); // drained at 100 a second
  const sent = ws.take();
  assert.equal(sent.length, MAX_QUEUED_FRAMES);
  assert.deepEqual(sent[7], { type: "channel.unsubscribe", channelId: "c7" });
  client.setFocus("c1"); // room again
  assert.equal(client.typing("c1"), true);
  await clock.advance(1_000);
  assert.deepEqual(ws.take(), [{ type: "focus", channelId: "c1" }, { type: "typing.start", channelId: "c1" }]);
  client.close();
});

test("the client's own frames pass the bound: a heartbeat due while the queue is full is queued", async () => {
  const { client, clock } = make({ rateBurst: 1, ratePerSecond: 0.001 });
  const ws = await opened(client);
  client.subscribeChannel("warm-up");
  ws.take();
  for (let i = 0; i < MAX_QUEUED_FRAMES; i += 1) client.subscribeChannel(`c${i}`);
  assert.throws(() => client.subscribeChannel("one more"), { code: "queue_full" });
  await clock.advance(30_000); // a refused heartbeat would throw out of its timer, and beat no more
  assert.equal(client._queue.length, MAX_QUEUED_FRAMES + 1);
  assert.deepEqual(client._queue.at(-1).frame, { type: "heartbeat" });
  client.close();
});

test("trackLastSeen asks when a watched account goes offline", async () => {
  const { client, clock } = make({ trackLastSeen: true });
  client.connect();
  await flush();
  const ws = FakeSocket.last();
  await ready(ws);
  ws.take();
  const sub = client.subscribe(["a"]);
  await flush();
  ackAll(ws, [{ type: "presence.sync", users: [{ userId: "a", status: "online" }] }]);
  await sub;
  ws.push({ type: "presence.changed", userId: "a", status: "offline" });
  await clock.advance(250);
  const sent = ws.take();
  assert.deepEqual(sent[0], { type: "presence.query", userIds: ["a"] });
  ws.push({ type: "presence.changed", userId: "a", status: "offline", lastSeenAt: "2026-12-02T08:47:00.000Z" });
  ws.push({ type: "heartbeat.ack" });
  await flush();
  assert.deepEqual(client.get("a"), { status: "offline", lastSeenAt: "2026-12-02T08:47:00.000Z" });
  ws.push({ type: "presence.changed", userId: "a", status: "online" });
  assert.deepEqual(client.get("a"), { status: "online", lastSeenAt: undefined });
  client.close();
});
