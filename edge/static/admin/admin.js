// The operator page: served by every edge on its internal port at /admin (edge/http.py).
//
// Plain ES module, no build step, no data of its own: everything comes from the internal API
// (users/U, cluster), which the page calls with `Authorization: Bearer <token>`: the internal
// token (PRESENCE_INTERNAL_TOKEN, or the data directory's `internal-token`) is always required,
// so the page asks for it at the first 401 and keeps it in this tab's sessionStorage. Exact last-seen times are shown here, and only here: this is the operator
// reading their own deployment (seed 003), with the account's lastSeenVisibility beside it.
//
// Stable hooks for tests: data-testid="token-form", "token-input", "search-input", "user-status",
// "user-chosen", "user-last-seen", "user-visibility", "user-sockets" (rows "socket-<id>"),
// "shards" (rows "shard-<n>"), "edges", "pending", "flush", "health-postgres", "health-redis",
// "active-1h", "active-24h", "active-168h", "state" (data-state loading|ok|token|error).

const API = "/api/v1/internal/presence";
const TOKEN_KEY = "presence.internalToken";
const REFRESH_MS = 5_000;

const $ = (id) => document.getElementById(id);

class NeedToken extends Error {}

const state = { edges: new Map(), timer: null, user: null };

async function api(path) {
  const headers = {};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  const res = await fetch(path, { headers, cache: "no-store" });
  if (res.status === 401) throw new NeedToken(token ? "refused" : "missing");
  let body = null;
  try {
    body = await res.json();
  } catch {
    body = { error: `HTTP ${res.status}` };
  }
  return { status: res.status, body };
}

function setState(name, text) {
  const el = $("state");
  el.dataset.state = name;
  el.textContent = text;
}

function askForToken(refused) {
  clearInterval(state.timer);
  state.timer = null;
  if (refused) sessionStorage.removeItem(TOKEN_KEY);
  $("app").hidden = true;
  $("token-form").hidden = false;
  $("token-error").hidden = !refused;
  $("token-input").focus();
  setState("token", "token needed");
}

async function guarded(fn) {
  try {
    await fn();
  } catch (e) {
    if (e instanceof NeedToken) askForToken(e.message === "refused");
    else setState("error", `failed: ${e.message}`);
  }
}

// ---------------------------------------------------------------------------------- cluster

async function refreshCluster() {
  const { status, body } = await api(`${API}/cluster`);
  if (status !== 200) {
    setState("error", body.error ?? `HTTP ${status}`);
    return;
  }
  $("token-form").hidden = true;
  $("app").hidden = false;
  $("where").textContent = `answered by ${body.edge}`;
  state.edges = new Map(body.edges.map((e) => [e.edgeId, e]));
  renderShards(body.shards);
  renderEdges(body.edges);
  health("health-postgres", body.postgres);
  health("health-redis", body.redis);
  $("accounts-online").textContent = shown(body.accountsOnline);
  $("pending").textContent = shown(body.pendingLastSeen);
  const fl = body.flush;
  $("flush").textContent =
    fl.error !== undefined
      ? `FlushActor: ${fl.error}`
      : `${shown(fl.pending_rows + fl.in_flight_rows)} rows, oldest ${Number(fl.oldest_pending_age_s).toFixed(1)} s`;
  for (const [key, n] of Object.entries(body.active)) {
    const el = $(`active-${key}`);
    if (el) el.textContent = shown(n);
  }
  setState("ok", `updated ${new Date().toLocaleTimeString()}`);
}

function shown(v) {
  return v === null || v === undefined ? "unknown" : Number(v).toLocaleString("en-US");
}

function health(id, ok) {
  const el = $(id);
  el.dataset.ok = String(ok);
  el.textContent = ok ? "ok" : "UNREACHABLE";
}

function cells(tr, values) {
  for (const v of values) {
    const td = document.createElement("td");
    td.textContent = v;
    tr.append(td);
  }
}

function renderShards(shards) {
  const body = $("shards");
  body.replaceChildren();
  for (const s of shards) {
    const tr = document.createElement("tr");
    tr.dataset.testid = `shard-${s.shard}`;
    if (s.error) {
      cells(tr, [s.shard, "unavailable", "", "", "", "", "", ""]);
      tr.className = "bad";
    } else {
      cells(tr, [s.shard, s.node_ip ?? "?", s.slots ?? "?", s.accounts, s.online, s.sockets, s.edges, s.pending_last_seen]);
    }
    body.append(tr);
  }
}

function edgeLabel(edgeId) {
  const e = state.edges.get(edgeId);
  return e && e.internalPort ? `${edgeId} (:${e.wsPort ?? "?"})` : edgeId;
}

function renderEdges(edges) {
  const body = $("edges");
  body.replaceChildren();
  for (const e of edges) {
    const tr = document.createElement("tr");
    tr.dataset.testid = `edge-${e.edgeId}`;
    cells(tr, [e.edgeId, e.wsPort ?? "?", e.internalPort ?? "?", shown(e.sockets)]);
    body.append(tr);
  }
}

// ---------------------------------------------------------------------------------- one account

async function lookUp(userId) {
  state.user = userId;
  const { status, body } = await api(`${API}/users/${encodeURIComponent(userId)}`);
  const err = $("user-error");
  if (status !== 200) {
    $("user").hidden = true;
    err.hidden = false;
    err.textContent = status === 404 ? `No account "${userId}".` : (body.error ?? `HTTP ${status}`);
    return;
  }
  err.hidden = true;
  $("user").hidden = false;
  $("user-id").textContent = body.userId;
  $("user-dot").dataset.status = body.status;
  $("user-status").textContent = body.status;
  $("user-chosen").textContent = body.chosenStatus ?? "";
  $("user-last-seen").textContent = body.lastSeenAt ?? "never";
  $("user-visibility").textContent = body.lastSeenVisibility;
  const sockets = body.liveSockets ?? [];
  $("user-socket-count").textContent = `(${body.sockets})`;
  const rows = $("user-sockets");
  rows.replaceChildren();
  for (const s of sockets) {
    const tr = document.createElement("tr");
    tr.dataset.testid = `socket-${s.socketId}`;
    cells(tr, [s.socketId, edgeLabel(s.edgeId), s.idle ? "idle" : "active", s.focus ?? "—"]);
    rows.append(tr);
  }
  const url = new URL(location.href);
  url.searchParams.set("user", userId);
  history.replaceState(null, "", url);
}

// ---------------------------------------------------------------------------------- start

function start() {
  clearInterval(state.timer);
  state.timer = setInterval(() => guarded(refreshCluster), REFRESH_MS);
  guarded(async () => {
    await refreshCluster();
    const wanted = state.user ?? new URLSearchParams(location.search).get("user");
    if (wanted) {
      $("search-input").value = wanted;
      await lookUp(wanted);
    }
  });
}

$("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const token = $("token-input").value.trim();
  if (!token) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  $("token-input").value = "";
  start();
});

$("search").addEventListener("submit", (event) => {
  event.preventDefault();
  const userId = $("search-input").value.trim();
  if (userId) guarded(() => lookUp(userId));
});

start();
