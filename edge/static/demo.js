// The presence demo: one page, one demo account, the public protocol over /ws/presence.
//
// Served by the edge in demo mode (edge/demo.py) with /demo/config and /demo/token beside it.
// Plain ES module, no build step. The socket work is the JavaScript client's (clients/js, served
// at /client/): this file only draws what the client knows.
//   - member list: client.subscribe(members); the client keeps the picture (presence.sync, then
//     presence.changed, reconciled after every reconnect) and calls back on every change;
//   - last-seen lines: trackLastSeen makes the client query whoever it sees going offline (the
//     only moment the answer changes); text from the shared display helper, refreshed every 30 s;
//   - typing: client.typing() on every keystroke (the client throttles typing.start), the others'
//     lines lapsing after 10 s;
//   - voice: client.joinVoice / leaveVoice and the channel's roster.
//
// Stable hooks for tests: data-testid="dot-<user>" (with data-status), "lastseen-<user>" (with
// data-last-seen-at), "member-<user>", "status-picker", "typing", "voice-roster", "voice-join",
// "voice-leave", "my-dot", "dm-line", "connection" (data-state connecting|open|closed).

import { PresenceClient } from "./client/client.js";
import { describeLastSeen } from "./client/lastseen.js";

const LAST_SEEN_REFRESH_MS = 30_000;
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
  myStatus: "offline", // the account's real status (may be invisible), from the client
  els: new Map(), // userId -> {li, dot, line}
  typers: [],
  roster: [],
  client: null,
};

// ---------------------------------------------------------------------------------- start

// Demo accounts live in a reserved namespace ("demo:ada"), so no real account can be one; the
// page shows, and its URLs and test hooks use, the name without the prefix.
function nameOf(userId) {
  const prefix = state.config?.prefix ?? "";
  return userId.startsWith(prefix) ? userId.slice(prefix.length) : userId;
}

async function main() {
  const config = await (await fetch("/demo/config", { cache: "no-store" })).json();
  state.config = config;
  const wanted = new URLSearchParams(location.search).get("as");
  fillAccountPicker(config.accounts, wanted);
  const me = config.accounts.find((a) => nameOf(a) === wanted);
  if (!me) {
    showChooser(config.accounts);
    return;
  }
  state.me = me;
  document.title = `${wanted} · Presence demo`;
  buildMe();
  buildMembers();
  $("channel-name").textContent = `# ${nameOf(config.channel)}`;
  state.client = connect();
  wireControls();
  $("app").hidden = false;
  setInterval(renderAllLines, LAST_SEEN_REFRESH_MS);
}

function fillAccountPicker(accounts, selected) {
  const picker = $("account-picker");
  const names = accounts.map(nameOf);
  if (!names.includes(selected)) picker.append(new Option("choose…", "", true, true));
  for (const n of names) picker.append(new Option(n, n, false, n === selected));
  picker.addEventListener("change", () => {
    if (picker.value) location.search = `?as=${encodeURIComponent(picker.value)}`;
  });
}

function showChooser(accounts) {
  const box = $("chooser-accounts");
  for (const a of accounts.map(nameOf)) {
    const link = document.createElement("a");
    link.href = `?as=${encodeURIComponent(a)}`;
    link.textContent = a;
    link.dataset.testid = `choose-${a}`;
    box.append(link);
  }
  $("chooser").hidden = false;
  setConnection("closed", "not connected");
}

// ---------------------------------------------------------------------------------- the client

async function demoToken() {
  const res = await fetch(`/demo/token?user=${encodeURIComponent(state.me)}`, { cache: "no-store" });
  if (!res.ok) throw new Error(`token: HTTP ${res.status}`);
  return (await res.json()).token;
}

function connect() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const client = new PresenceClient({
    url: `${scheme}://${location.host}/ws/presence`,
    token: demoToken, // asked on every connect: a refused (expired) token is replaced
    trackLastSeen: true,
  });
  const channel = state.config.channel;
  client.on("state", (kind, info) => {
    if (kind === "open") setConnection("open", `connected as ${nameOf(info.userId)}`);
    else if (kind === "reconnecting") {
      const why = info.code ? `disconnected (${info.code})` : "disconnected";
      setConnection("closed", `${why}; reconnecting in ${(info.delayMs / 1000).toFixed(1)} s…`);
    } else if (kind === "connecting") setConnection("connecting", "connecting…");
    else setConnection("closed", "closed");
  });
  client.on("ready", (frame) => setMyStatus(frame.status));
  client.on("self", setMyStatus);
  client.on("change", (userId) => renderMember(userId));
  client.onSync(() => {
    renderCount();
    renderRoster();
  });
  client.on("typing", (channelId, userIds) => {
    if (channelId !== channel) return;
    state.typers = userIds.filter((u) => u !== state.me);
    renderTyping();
  });
  client.on("roster", (channelId, userIds) => {
    if (channelId !== channel) return;
    state.roster = userIds;
    renderRoster();
  });
  client.on("error", (e) => console.warn("presence error", e.code, e.message));
  client.subscribe(others()).catch(() => {}); // remembered: (re)subscribed on every connect
  client.subscribeChannel(channel);
  if (document.hasFocus()) client.setFocus(channel);
  client.connect();
  return client;
}

function others() {
  return state.config.accounts.filter((a) => a !== state.me);
}

function statusOf(userId) {
  if (userId === state.me) return state.myStatus;
  return state.client?.get(userId)?.status ?? "offline";
}

function setConnection(kind, text) {
  const el = $("connection");
  el.dataset.state = kind;
  el.textContent = text;
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
  const client = state.client;
  const channel = state.config.channel;
  $("status-picker").addEventListener("change", (e) => client.setStatus(e.target.value));

  const input = $("message-input");
  input.addEventListener("input", () => {
    if (input.value === "") client.stopTyping(channel);
    else client.typing(channel);
  });
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter") {
      input.value = "";
      client.stopTyping(channel);
    }
  });

  $("voice-join").addEventListener("click", () => client.joinVoice(channel));
  $("voice-leave").addEventListener("click", () => client.leaveVoice());

  // Focus is per socket: the channel counts as focused while this window has the focus.
  window.addEventListener("focus", () => client.setFocus(channel));
  window.addEventListener("blur", () => client.setFocus(null));
}

// ---------------------------------------------------------------------------------- drawing

function avatar(userId, dotTestId) {
  const wrap = document.createElement("span");
  wrap.className = "avatar-wrap";
  const face = document.createElement("span");
  face.className = "avatar";
  face.textContent = nameOf(userId).slice(0, 1);
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
  $("me-name").textContent = nameOf(state.me);
  const face = $("me-avatar");
  face.textContent = nameOf(state.me).slice(0, 1);
  face.style.setProperty("--avatar", colourOf(state.me));
}

function buildMembers() {
  const list = $("member-list");
  const order = [state.me, ...others()];
  for (const userId of order) {
    const li = document.createElement("li");
    li.className = "member is-offline";
    li.dataset.testid = `member-${nameOf(userId)}`;
    li.dataset.user = userId;
    const { wrap, dot } = avatar(userId, `dot-${nameOf(userId)}`);
    const text = document.createElement("div");
    const name = document.createElement("div");
    name.className = "name";
    name.textContent = nameOf(userId);
    if (userId === state.me) {
      const you = document.createElement("span");
      you.className = "you";
      you.textContent = " (you)";
      name.append(you);
    }
    const line = document.createElement("div");
    line.className = "line";
    line.dataset.testid = `lastseen-${nameOf(userId)}`;
    text.append(name, line);
    li.append(wrap, text);
    list.append(li);
    state.els.set(userId, { li, dot, line });
    renderMember(userId);
  }
}

function renderMember(userId) {
  const els = state.els.get(userId);
  if (!els) return;
  const own = userId === state.me;
  const status = statusOf(userId);
  const lastSeenAt = own ? null : state.client?.get(userId)?.lastSeenAt ?? null;
  const { li, dot, line } = els;
  dot.dataset.status = status;
  dot.title = OWN_WORDS[status] ?? status;
  li.classList.toggle("is-offline", !PRESENT.has(status));
  let text;
  if (own) {
    text = OWN_WORDS[status] ?? status;
  } else {
    try {
      text = describeLastSeen(status, lastSeenAt, Date.now());
    } catch {
      text = "Offline";
    }
  }
  if (line.textContent !== text) line.textContent = text;
  if (userId === others()[0]) renderDmHeader(userId, status, lastSeenAt);
  if (!own && !PRESENT.has(status) && lastSeenAt) line.dataset.lastSeenAt = lastSeenAt;
  else delete line.dataset.lastSeenAt;
}

// The direct-message header with the first other account: the conversation-header form.
function renderDmHeader(userId, status, lastSeenAt) {
  $("dm-name").textContent = nameOf(userId);
  $("dm-line").textContent = describeLastSeen(status, lastSeenAt, Date.now(), { form: "header" });
}

function renderAllLines() {
  for (const userId of state.els.keys()) renderMember(userId);
}

function renderCount() {
  let n = 0;
  for (const userId of state.els.keys()) {
    if (PRESENT.has(statusOf(userId))) n += 1;
  }
  $("online-count").textContent = `— ${n} online`;
}

function renderTyping() {
  const names = state.typers.map(nameOf); // sorted by the client
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
    li.dataset.testid = `voice-${nameOf(userId)}`;
    li.dataset.user = userId;
    const status = statusOf(userId);
    const { wrap, dot } = avatar(userId, null);
    dot.dataset.status = status ?? "offline";
    const name = document.createElement("span");
    name.textContent = userId === state.me ? `${nameOf(userId)} (you)` : nameOf(userId);
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
