// The presence demo: one page, one demo account, the public protocol over /ws/presence.
//
// Served by the edge in demo mode (edge/demo.py) with /demo/config and /demo/token beside it.
// Plain ES module, no build step. What it shows, and how a real client would do the same:
//   - member list: presence.subscribe for every member, presence.sync then presence.changed;
//   - last-seen lines: presence.query on load and again whenever a member is seen going offline
//     (the only moment the answer changes), text from lastseen.js, refreshed every 30 s;
//   - typing: typing.start at most every 3 s while typing, "X is typing…" lapsing after 10 s;
//   - voice: voice.join / voice.leave and the channel's voice.roster.
//
// Stable hooks for tests: data-testid="dot-<user>" (with data-status), "lastseen-<user>" (with
// data-last-seen-at), "member-<user>", "status-picker", "typing", "voice-roster", "voice-join",
// "voice-leave", "my-dot", "dm-line", "connection" (data-state connecting|open|closed).

import { describeLastSeen } from "./client/lastseen.js";

const TYPING_LAPSE_MS = 10_000; // the contract: typing lapses after 10 s unless repeated
const TYPING_SEND_EVERY_MS = 3_000; // we repeat typing.start at most this often
const LAST_SEEN_REFRESH_MS = 30_000;
const RECONNECT_MAX_MS = 10_000;
const PRESENT = new Set(["online", "idle", "dnd"]);
const OWN_WORDS = {
  online: "Online",
  idle: "Idle",
  dnd: "Do not disturb",
  invisible: "Invisible: everybody else sees you offline",
  offline: "Offline",
};

const $ = (id) => document.getElementById(id);

const state = {
  config: null, // {accounts, server, channel}
  me: null,
  myStatus: "offline", // the account's real status (may be invisible), from ready/presence.self
  members: new Map(), // userId -> {status, lastSeenAt, pending, els}
  typers: new Map(), // userId -> lapse time (ms)
  roster: [],
  ws: null,
  heartbeat: null,
  reconnectMs: 1000,
  typingSentAt: 0,
};

// ---------------------------------------------------------------------------------- start

async function main() {
  const config = await (await fetch("/demo/config", { cache: "no-store" })).json();
  state.config = config;
  const wanted = new URLSearchParams(location.search).get("as");
  fillAccountPicker(config.accounts, wanted);
  if (!config.accounts.includes(wanted)) {
    showChooser(config.accounts);
    return;
  }
  state.me = wanted;
  document.title = `${wanted} · Presence demo`;
  buildMe();
  buildMembers();
  $("channel-name").textContent = `# ${config.channel}`;
  wireControls();
  $("app").hidden = false;
  setInterval(renderAllLines, LAST_SEEN_REFRESH_MS);
  setInterval(expireTypers, 500);
  connect();
}

function fillAccountPicker(accounts, selected) {
  const picker = $("account-picker");
  if (!accounts.includes(selected)) picker.append(new Option("choose…", "", true, true));
  for (const a of accounts) picker.append(new Option(a, a, false, a === selected));
  picker.addEventListener("change", () => {
    if (picker.value) location.search = `?as=${encodeURIComponent(picker.value)}`;
  });
}

function showChooser(accounts) {
  const box = $("chooser-accounts");
  for (const a of accounts) {
    const link = document.createElement("a");
    link.href = `?as=${encodeURIComponent(a)}`;
    link.textContent = a;
    link.dataset.testid = `choose-${a}`;
    box.append(link);
  }
  $("chooser").hidden = false;
  setConnection("closed", "not connected");
}

// ---------------------------------------------------------------------------------- connection

async function connect() {
  setConnection("connecting", "connecting…");
  let token;
  try {
    const res = await fetch(`/demo/token?user=${encodeURIComponent(state.me)}`, { cache: "no-store" });
    if (!res.ok) throw new Error(`token: HTTP ${res.status}`);
    token = (await res.json()).token;
  } catch (e) {
    console.warn(e);
    scheduleReconnect();
    return;
  }
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const ws = new WebSocket(`${scheme}://${location.host}/ws/presence`);
  state.ws = ws;
  ws.addEventListener("open", () => send({ type: "identify", token }));
  ws.addEventListener("message", (event) => {
    let frame;
    try {
      frame = JSON.parse(event.data);
    } catch {
      return;
    }
    handle(frame);
  });
  ws.addEventListener("close", (event) => {
    if (state.ws !== ws) return;
    state.ws = null;
    clearInterval(state.heartbeat);
    setConnection("closed", `disconnected (${event.code}); reconnecting…`);
    scheduleReconnect();
  });
}

function scheduleReconnect() {
  const delay = state.reconnectMs;
  state.reconnectMs = Math.min(state.reconnectMs * 2, RECONNECT_MAX_MS);
  setTimeout(connect, delay);
}

function send(frame) {
  if (state.ws && state.ws.readyState === WebSocket.OPEN) state.ws.send(JSON.stringify(frame));
}

function others() {
  return state.config.accounts.filter((a) => a !== state.me);
}

function query(userIds) {
  if (userIds.length === 0) return;
  for (const u of userIds) state.members.get(u).pending += 1;
  send({ type: "presence.query", userIds });
}

function setConnection(kind, text) {
  const el = $("connection");
  el.dataset.state = kind;
  el.textContent = text;
}

// ---------------------------------------------------------------------------------- frames

function handle(frame) {
  switch (frame.type) {
    case "ready":
      onReady(frame);
      break;
    case "presence.sync":
      for (const { userId, status } of frame.users) onStatus(userId, status, false, undefined);
      break;
    case "presence.changed":
      onChanged(frame);
      break;
    case "presence.self":
      setMyStatus(frame.status);
      break;
    case "typing":
      if (frame.channelId === state.config.channel && frame.userId !== state.me) {
        state.typers.set(frame.userId, Date.now() + TYPING_LAPSE_MS);
        renderTyping();
      }
      break;
    case "voice.roster":
      if (frame.channelId === state.config.channel) {
        state.roster = frame.userIds;
        renderRoster();
      }
      break;
    case "error":
      console.warn("presence error", frame.code, frame.message);
      break;
    default:
      break; // heartbeat.ack and anything newer
  }
}

function onReady(frame) {
  state.reconnectMs = 1000;
  setConnection("open", `connected as ${frame.userId}`);
  setMyStatus(frame.status);
  clearInterval(state.heartbeat);
  const every = Math.max(1000, Math.min(frame.heartbeatIntervalMs || 30_000, 30_000));
  state.heartbeat = setInterval(() => send({ type: "heartbeat" }), every);
  for (const m of state.members.values()) m.pending = 0;
  const ids = others();
  send({ type: "presence.subscribe", userIds: ids });
  query(ids); // statuses come with the sync; the query brings last-seen times of who is away
  send({ type: "channel.subscribe", channelId: state.config.channel });
  if (document.hasFocus()) send({ type: "focus", channelId: state.config.channel });
}

// One presence.changed: a broadcast (never carries lastSeenAt) or the answer to our query (carries
// it when the member is offline and lets us read it). Answers arrive in the order asked, so the
// oldest pending query for that member is the one answered.
function onChanged(frame) {
  const m = state.members.get(frame.userId);
  if (!m) return;
  const answer = m.pending > 0;
  if (answer) m.pending -= 1;
  let lastSeenAt;
  if (Object.hasOwn(frame, "lastSeenAt")) lastSeenAt = frame.lastSeenAt;
  else if (answer) lastSeenAt = null; // withheld or never seen: the same on the wire, no line
  onStatus(frame.userId, frame.status, true, lastSeenAt);
}

function onStatus(userId, status, mayQuery, lastSeenAt) {
  const m = state.members.get(userId);
  if (!m || userId === state.me) return;
  const wasPresent = PRESENT.has(m.status);
  m.status = status;
  if (lastSeenAt !== undefined) m.lastSeenAt = lastSeenAt;
  if (!PRESENT.has(status)) state.typers.delete(userId);
  // Seen going away: ask when (the one moment the answer changes); broadcasts never say.
  if (wasPresent && !PRESENT.has(status) && mayQuery) query([userId]);
  renderMember(userId);
  renderCount();
  renderTyping();
  if (state.roster.includes(userId)) renderRoster();
}

function setMyStatus(status) {
  state.myStatus = status;
  const picker = $("status-picker");
  if ([...picker.options].some((o) => o.value === status)) picker.value = status;
  $("me-dot").dataset.status = status;
  $("me-line").textContent = OWN_WORDS[status] ?? status;
  renderMember(state.me);
  renderCount();
  if (state.roster.includes(state.me)) renderRoster();
}

// ---------------------------------------------------------------------------------- controls

function wireControls() {
  $("status-picker").addEventListener("change", (e) => {
    send({ type: "presence.update", status: e.target.value });
  });

  const input = $("message-input");
  input.addEventListener("input", () => {
    const now = Date.now();
    if (input.value === "") {
      stopTyping();
    } else if (now - state.typingSentAt >= TYPING_SEND_EVERY_MS) {
      state.typingSentAt = now;
      send({ type: "typing.start", channelId: state.config.channel });
    }
  });
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter") {
      input.value = "";
      stopTyping();
    }
  });

  $("voice-join").addEventListener("click", () =>
    send({ type: "voice.join", channelId: state.config.channel }),
  );
  $("voice-leave").addEventListener("click", () => send({ type: "voice.leave" }));

  // Focus is per socket: the channel counts as focused while this window has the focus.
  window.addEventListener("focus", () => send({ type: "focus", channelId: state.config.channel }));
  window.addEventListener("blur", () => send({ type: "focus", channelId: null }));
}

function stopTyping() {
  if (state.typingSentAt !== 0) send({ type: "typing.stop", channelId: state.config.channel });
  state.typingSentAt = 0;
}

// ---------------------------------------------------------------------------------- drawing

function avatar(userId, dotTestId) {
  const wrap = document.createElement("span");
  wrap.className = "avatar-wrap";
  const face = document.createElement("span");
  face.className = "avatar";
  face.textContent = userId.slice(0, 1);
  face.style.setProperty("--avatar", colourOf(userId));
  const dot = document.createElement("span");
  dot.className = "dot";
  dot.dataset.status = "offline";
  if (dotTestId) dot.dataset.testid = dotTestId;
  wrap.append(face, dot);
  return { wrap, dot };
}

function colourOf(userId) {
  let h = 0;
  for (const ch of userId) h = (h * 31 + ch.codePointAt(0)) % 360;
  return `hsl(${h} 45% 45%)`;
}

function buildMe() {
  $("me-name").textContent = state.me;
  const face = $("me-avatar");
  face.textContent = state.me.slice(0, 1);
  face.style.setProperty("--avatar", colourOf(state.me));
}

function buildMembers() {
  const list = $("member-list");
  const order = [state.me, ...others()];
  for (const userId of order) {
    const li = document.createElement("li");
    li.className = "member is-offline";
    li.dataset.testid = `member-${userId}`;
    li.dataset.user = userId;
    const { wrap, dot } = avatar(userId, `dot-${userId}`);
    const text = document.createElement("div");
    const name = document.createElement("div");
    name.className = "name";
    name.textContent = userId;
    if (userId === state.me) {
      const you = document.createElement("span");
      you.className = "you";
      you.textContent = " (you)";
      name.append(you);
    }
    const line = document.createElement("div");
    line.className = "line";
    line.dataset.testid = `lastseen-${userId}`;
    text.append(name, line);
    li.append(wrap, text);
    list.append(li);
    state.members.set(userId, { status: "offline", lastSeenAt: null, pending: 0, els: { li, dot, line } });
    renderMember(userId);
  }
}

function renderMember(userId) {
  const m = state.members.get(userId);
  if (!m) return;
  const own = userId === state.me;
  const status = own ? state.myStatus : m.status;
  const { li, dot, line } = m.els;
  dot.dataset.status = status;
  dot.title = OWN_WORDS[status] ?? status;
  li.classList.toggle("is-offline", !PRESENT.has(status));
  let text;
  if (own) {
    text = OWN_WORDS[status] ?? status;
  } else {
    try {
      text = describeLastSeen(status, m.lastSeenAt, Date.now());
    } catch {
      text = "Offline";
    }
  }
  if (line.textContent !== text) line.textContent = text;
  if (userId === others()[0]) renderDmHeader(userId, status, m.lastSeenAt);
  if (!own && !PRESENT.has(status) && m.lastSeenAt) line.dataset.lastSeenAt = m.lastSeenAt;
  else delete line.dataset.lastSeenAt;
}

// The direct-message header with the first other account: the conversation-header form.
function renderDmHeader(userId, status, lastSeenAt) {
  $("dm-name").textContent = userId;
  $("dm-line").textContent = describeLastSeen(status, lastSeenAt, Date.now(), { form: "header" });
}

function renderAllLines() {
  for (const userId of state.members.keys()) renderMember(userId);
}

function renderCount() {
  let n = 0;
  for (const [userId, m] of state.members) {
    if (PRESENT.has(userId === state.me ? state.myStatus : m.status)) n += 1;
  }
  $("online-count").textContent = `— ${n} online`;
}

function expireTypers() {
  const now = Date.now();
  let changed = false;
  for (const [userId, until] of state.typers) {
    if (until <= now) {
      state.typers.delete(userId);
      changed = true;
    }
  }
  if (changed) renderTyping();
}

function renderTyping() {
  const names = [...state.typers.keys()].sort();
  let text = "";
  if (names.length === 1) text = `${names[0]} is typing…`;
  else if (names.length === 2) text = `${names[0]} and ${names[1]} are typing…`;
  else if (names.length > 2) text = "Several people are typing…";
  const el = $("typing");
  if (el.textContent !== text) el.textContent = text;
  el.dataset.users = names.join(" ");
}

function renderRoster() {
  const list = $("voice-roster");
  list.replaceChildren();
  for (const userId of state.roster) {
    const li = document.createElement("li");
    li.dataset.testid = `voice-${userId}`;
    li.dataset.user = userId;
    const status = userId === state.me ? state.myStatus : state.members.get(userId)?.status;
    const { wrap, dot } = avatar(userId, null);
    dot.dataset.status = status ?? "offline";
    const name = document.createElement("span");
    name.textContent = userId === state.me ? `${userId} (you)` : userId;
    li.append(wrap, name);
    list.append(li);
  }
  const inVoice = state.roster.includes(state.me);
  $("voice-join").disabled = inVoice;
  $("voice-leave").disabled = !inVoice;
  $("voice-empty").hidden = state.roster.length > 0;
}

main().catch((e) => {
  console.error(e);
  setConnection("closed", `failed: ${e.message}`);
});
