// The client against the real service: tests/integration/test_clients_live.py starts the cluster,
// a `presence edge` process to kill and a surviving edge, and passes them in PRESENCE_LIVE.
// Skipped when run on its own (`node --test clients/js/test/`).
import assert from "node:assert/strict";
import { test } from "node:test";

import { PresenceClient, reconnectDelay } from "../src/index.js";

const live = process.env.PRESENCE_LIVE ? JSON.parse(process.env.PRESENCE_LIVE) : null;

async function eventually(check, what, timeoutMs = 15_000) {
  const deadline = Date.now() + timeoutMs;
  let value;
  while (Date.now() < deadline) {
    value = await check();
    if (value) return value;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  assert.fail(`${what}: not within ${timeoutMs} ms (last value ${JSON.stringify(value)})`);
}

/** A bare socket for another account: identify, wait for ready; `frames` keeps what it gets. */
async function rawSocket(url, token) {
  const ws = new WebSocket(url);
  ws.frames = [];
  ws.addEventListener("message", (e) => ws.frames.push(JSON.parse(e.data)));
  await new Promise((resolve, reject) => {
    ws.addEventListener("open", resolve, { once: true });
    ws.addEventListener("error", reject, { once: true });
  });
  ws.send(JSON.stringify({ type: "identify", token }));
  await eventually(() => ws.frames.some((f) => f.type === "ready"), "ready");
  return ws;
}

async function closeRaw(ws) {
  if (ws.readyState === WebSocket.CLOSED) return;
  const closed = new Promise((resolve) => ws.addEventListener("close", resolve, { once: true }));
  ws.close(1000);
  await closed;
}

const statuses = (client) => Object.fromEntries(client.list().map((e) => [e.userId, e.status]).sort());

test("reconnects with jitter after its edge is killed, resubscribes, ends equal to the truth", { skip: !live }, async () => {
  const { users: u, tokens } = live;
  const draws = [0.6, 0.3, 0.8, 0.5, 0.2, 0.9];
  const drawn = [];
  const asked = [];
  const client = new PresenceClient({
    url: [live.doomedUrl, live.survivorUrl],
    // The first token is refused (4001): the provider must be asked again, told so.
    token: (ctx) => {
      asked.push(ctx.rejected);
      return asked.length === 1 ? "not-a-token" : tokens.watcher;
    },
    heartbeatIntervalMs: 1_000,
    backoff: { baseMs: 400 },
    random: () => {
      drawn.push(draws[drawn.length % draws.length]);
      return drawn.at(-1);
    },
    trackLastSeen: true,
  });
  const seen = [];
  client.on("state", (state, info) => seen.push([state, info]));
  const a = await rawSocket(live.survivorUrl, tokens.a);
  const b = await rawSocket(live.survivorUrl, tokens.b);
  let c = null;
  const watched = [u.a, u.b, u.c, u.stranger];
  try {
    client.connect();
    // 4001 first (from the doomed edge), then the survivor ... then the doomed one again.
    await eventually(() => client.state === "open", "open after the refused token");
    assert.deepEqual(asked, [false, true]);
    const refused = seen.find(([s, info]) => s === "reconnecting" && info.code === 4001);
    assert.ok(refused, JSON.stringify(seen));
    // Make sure it sits on the edge we are about to kill.
    if (client.url !== live.doomedUrl) {
      client.close();
      client.connect();
      await eventually(() => client.state === "open" && client.url === live.doomedUrl, "on the doomed edge");
    }
    await client.subscribe(watched);
    client.subscribeChannel(live.channel);
    client.joinVoice(live.channel);
    await eventually(() => client.roster(live.channel).join() === u.watcher, "in the voice roster");
    assert.deepEqual(statuses(client), { [u.a]: "online", [u.b]: "online", [u.c]: "offline" });

    const before = seen.length;
    const drawnBefore = drawn.length;
    process.kill(live.doomedPid, "SIGKILL");
    await closeRaw(a); // a leaves while the client is away ...
    c = await rawSocket(live.survivorUrl, tokens.c); // ... and c arrives
    await eventually(
      () => client.url === live.survivorUrl && client.state === "open" && client.synced,
      "resynced on the survivor",
      20_000,
    );
    // Full jitter: the wait was drawn from the window (not the window itself).
    const first = seen.slice(before).find(([s]) => s === "reconnecting")[1];
    assert.equal(first.throttled, false);
    const expected = reconnectDelay(first.attempt, false, { baseMs: 400 }, () => drawn[drawnBefore]);
    assert.equal(first.delayMs, expected);
    assert.ok(expected < 400 * 2 ** first.attempt);

    // The truth: a fresh client's picture.
    const fresh = new PresenceClient({ url: live.survivorUrl, token: tokens.watcher });
    fresh.connect();
    await eventually(() => fresh.state === "open", "fresh client open");
    await fresh.subscribe(watched);
    const truth = statuses(fresh);
    fresh.close();
    assert.deepEqual(truth, { [u.a]: "offline", [u.b]: "online", [u.c]: "online" });
    await eventually(() => JSON.stringify(statuses(client)) === JSON.stringify(truth), "picture equals the truth");
    assert.equal(client.get(u.stranger), undefined);
    // trackLastSeen asked for a's last-seen time once it saw a offline.
    await eventually(() => typeof client.get(u.a)?.lastSeenAt === "string", "a's last-seen time");

    // Channel and voice restored on the new socket.
    await eventually(() => client.roster(live.channel).join() === u.watcher, "voice roster restored");
    b.send(JSON.stringify({ type: "typing.start", channelId: live.channel }));
    await eventually(() => client.typers(live.channel).join() === u.b, "typing seen");
    const answers = await client.query([u.a, u.b, u.stranger]);
    assert.deepEqual([...answers.keys()], [u.a, u.b]);
  } finally {
    client.close();
    for (const ws of [a, b, c]) if (ws) await closeRaw(ws);
  }
  assert.equal(client.state, "closed");
});
