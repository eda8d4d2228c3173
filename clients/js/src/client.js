// The presence client: one socket to /ws/presence, kept alive and kept right.
//
// Plain ES module, no dependencies, no build step: browsers use their WebSocket, Node passes one
// (`ws`, or Node 22's global; `node --experimental-websocket` on Node 20). Everything a chat
// front end otherwise writes itself:
//   - identify with a token or a token provider (called on every connect; told when the last
//     token was refused), heartbeat at the server's heartbeatIntervalMs, dead-connection detection;
//   - reconnect with capped exponential backoff and full jitter (./backoff.js), close codes
//     honoured (4001: a fresh token, or the usual backoff when it was for an identify that came too
//     late; 4029/1008: back off harder; 1012/1011: back at once, jittered; 1000: stop), the state
//     exposed;
//   - subscriptions (accounts, channels), idle, focus and voice remembered and restored after
//     every reconnect; the local picture reconciled from the fresh presence.sync, so no ghost
//     survives a reconnect;
//   - a presence store with change callbacks (in the manner of Phoenix's onSync), a query helper
//     that splits lists into <= 100-id frames and merges the answers, a typing helper (throttled
//     typing.start, others lapse locally after 10 s), voice rosters, and outgoing frames paced
//     under the server's per-socket rate limit, in a bounded queue where a frame takes the place of
//     the queued ones it supersedes (`overrides`).
//
// How answers are matched to requests: an edge handles one socket's frames in order and writes
// each answer before it reads the next frame, so a heartbeat sent right after a request is
// acknowledged only after the request's answers. Every request (a subscribe chunk, a query chunk)
// is followed by a heartbeat, and its answers are what arrives between the previous heartbeat's
// acknowledgement and its own.

import { DEFAULT_BACKOFF, RESTART_CLOSE_CODES, THROTTLING_CLOSE_CODES, reconnectDelay, restartDelay } from "./backoff.js";

export const TYPING_LAPSE_MS = 10_000; // the contract: typing lapses after 10 s unless repeated
export const MAX_QUERY_IDS = 100; // the contract's limit per presence.query
export const PRESENT = Object.freeze(["online", "idle", "dnd"]);
const PRESENT_SET = new Set(PRESENT);
const CHOSEN = new Set(["online", "idle", "dnd", "invisible"]);
const VISIBILITY = new Set(["everyone", "friends", "nobody"]);
// Frames stay well under the edge's 16 KiB frame limit whatever the ids hold.
const MAX_FRAME_BYTES = 12 * 1024;
// Frames waiting for the pacing at most: at the default 15 a second, about a minute's worth. An
// application that outruns the pacing with frames nothing supersedes is told (queue_full) instead
// of filling memory with frames that would reach the edge ever later.
export const MAX_QUEUED_FRAMES = 1_000;
// The reason of the edge's 4001 for a socket that sent no identify in time (10 s after it opened):
// edge/session.py IDENTIFY_DEADLINE, the same text (tests/unit/test_client_core.py keeps them
// equal). Not the token's fault (a loaded edge, its opening gate, a slow network can delay a
// healthy client's identify): reconnect as usual.
const IDENTIFY_DEADLINE = "no identify within the time allowed";
const NOTHING = Object.freeze(new Set());
const encoder = new TextEncoder();

/** An error frame from the service, or a request that could not be answered. */
export class PresenceError extends Error {
  constructor(code, message) {
    super(message ? `${code}: ${message}` : code);
    this.name = "PresenceError";
    // The service's: bad_frame | too_many_ids | rate_limited | not_allowed; the client's:
    // not_connected | disconnected | unauthorized | token | connect | malformed_frame (a server
    // frame that could not be applied, dropped) | queue_full (the outgoing queue is at
    // MAX_QUEUED_FRAMES, and the call queued nothing).
    this.code = code;
  }
}

/**
 * The parts of the socket's state at the edge that `frame` sets, each wholly: a queued frame whose
 * every part a later frame sets again is superseded by it (the later one takes its place). Empty
 * for frames that are never merged: heartbeats (they count for request windows and choices),
 * requests, presence.unsubscribe, voice (each join and leave is seen by others).
 * (presence_client's `_overrides`; "\0" cannot be in an id.)
 */
function overrides(frame) {
  switch (frame.type) {
    case "presence.update":
      if (frame.status === "idle") return new Set(["idle flag"]);
      if (frame.status === "online") return new Set(["idle flag", "chosen status"]); // also wakes the socket
      return new Set(["chosen status"]);
    case "settings.update":
      return new Set(["last-seen visibility"]);
    case "focus":
      return new Set(["focus"]);
    case "channel.subscribe":
    case "channel.unsubscribe":
      return new Set([`channel\0${frame.channelId}`]);
    case "typing.start":
      // Typing, and the broadcast watchers may see: a later typing.stop sends nothing, so it must
      // not swallow a start still queued.
      return new Set([`typing\0${frame.channelId}`, `typing broadcast\0${frame.channelId}`]);
    case "typing.stop":
      return new Set([`typing\0${frame.channelId}`]);
    default:
      return NOTHING;
  }
}

const isSubset = (small, big) => [...small].every((part) => big.has(part));

/**
 * Split ids (duplicates dropped, order kept) into lists of at most `maxIds` whose JSON stays
 * under `maxBytes`: the shape of presence.subscribe and presence.query frames.
 */
export function chunkIds(ids, maxIds = MAX_QUERY_IDS, maxBytes = MAX_FRAME_BYTES) {
  const chunks = [];
  let current = [];
  let bytes = 0;
  for (const id of new Set(ids)) {
    const size = encoder.encode(JSON.stringify(id)).length + 1;
    if (current.length > 0 && (current.length >= maxIds || bytes + size > maxBytes)) {
      chunks.push(current);
      current = [];
      bytes = 0;
    }
    current.push(id);
    bytes += size;
  }
  if (current.length > 0) chunks.push(current);
  return chunks;
}

const SYSTEM_CLOCK = Object.freeze({
  now: () => Date.now(),
  setTimeout: (fn, ms) => setTimeout(fn, ms),
  clearTimeout: (handle) => clearTimeout(handle),
});

const DEFAULTS = Object.freeze({
  heartbeatIntervalMs: null, // null: the server's (ready.heartbeatIntervalMs); a number caps it
  deadAfterMs: null, // no frame at all this long after a heartbeat: dead (null: the interval)
  connectTimeoutMs: 10_000, // socket open + identify + ready
  stableAfterMs: 5_000, // a connection that lived this long resets the backoff
  typingThrottleMs: 8_000, // between 7 s (the edge's re-broadcast gap) and 10 s (the lapse)
  trackLastSeen: false, // query the last-seen time of watched accounts seen going offline
  maxSubscriptions: 1_000, // the edge's per-socket cap
  rateBurst: 40, // outgoing pacing, under the edge's 60-frame burst ...
  ratePerSecond: 15, // ... and 20 frames/s
});

/**
 * A presence connection. `options`:
 *   url: "ws://host:8765/ws/presence", a list (tried in turn on each reconnect) or a function;
 *   token: a string, or a function ({attempt, rejected}) => token | Promise<token>; a fixed token
 *     that is refused (4001) stops the client, and so does a provider handing back the very
 *     token just refused (a 4001 for an identify that came too late refused no token: the client
 *     reconnects as usual);
 *   WebSocket: the constructor (default: globalThis.WebSocket);
 *   backoff: {baseMs, capMs, throttledBaseMs, throttledCapMs} (see backoff.js);
 *   random, clock: injectable for tests; and the DEFAULTS above.
 */
export class PresenceClient {
  constructor(options) {
    const o = { ...DEFAULTS, ...options };
    if (!o.url) throw new TypeError("url is required");
    if (typeof o.token !== "string" && typeof o.token !== "function") {
      throw new TypeError("token must be a string or a function returning one");
    }
    this.options = o;
    this._WebSocket = o.WebSocket ?? globalThis.WebSocket;
    if (typeof this._WebSocket !== "function") {
      throw new TypeError("no WebSocket: pass options.WebSocket (e.g. from the ws package)");
    }
    this._clock = o.clock ?? SYSTEM_CLOCK;
    this._random = o.random ?? Math.random;
    this._backoff = { ...DEFAULT_BACKOFF, ...o.backoff };
    this._listeners = new Map();

    /** idle | connecting | open | reconnecting | closed */
    this.state = "idle";
    this.userId = null;
    this.socketId = null;
    this.status = null; // the account's real status (ready, presence.self)
    this.synced = false; // every remembered subscription confirmed on the current socket

    // Remembered across reconnects.
    this._watched = new Set();
    this._channels = new Set();
    this._idle = false;
    this._focus = null;
    this._voice = null;
    // online, dnd or invisible (a setting below), for the next ready: chosen while disconnected,
    // or on a socket that closed before its edge surely read it (_endConnection).
    this._pendingStatus = null;
    this._pendingVisibility = null;

    // The local picture.
    this._presence = new Map(); // userId -> {status, lastSeenAt: string | null | undefined}
    this._typers = new Map(); // channelId -> Map(userId -> lapse time)
    this._rosters = new Map(); // channelId -> [userId]
    this._typingSent = new Map(); // channelId -> time of our last typing.start

    // Connection machinery.
    this._gen = 0;
    this._attempt = 0;
    this._urlIndex = 0;
    this._rejected = false;
    // The token the last 4001 refused, until a ready: a provider that hands it back has nothing
    // fresh, and trying it again would be refused again, for ever.
    this._refusedToken = null;
    this._tokenInUse = null; // the token of the current (or last) attempt
    this._stopped = true;
    this._ws = null;
    this._timers = new Set();
    this._reconnectTimer = null;
    this._lastSeenTimer = null;
    this._lastSeenWanted = new Set();
    this._typingTimer = null;
    this._syncWaiters = []; // subscribe() calls made while connecting: settled by the next resubscribe
    this._resetConnection();
  }

  // ------------------------------------------------------------------------------ events

  /**
   * Listen: "state" (state, info), "ready" (frame), "change" (userId, entry|undefined, previous),
   * "sync" (client) after any change of the picture, "self" (status), "typing" (channelId,
   * userIds), "roster" (channelId, userIds), "error" (PresenceError), "frame" (every frame).
   * Returns a function that stops listening.
   */
  on(event, callback) {
    if (!this._listeners.has(event)) this._listeners.set(event, new Set());
    this._listeners.get(event).add(callback);
    return () => this._listeners.get(event)?.delete(callback);
  }

  /** Phoenix style: called with the client after every change of the presence picture. */
  onSync(callback) {
    return this.on("sync", callback);
  }

  _emit(event, ...args) {
    for (const callback of this._listeners.get(event) ?? []) {
      try {
        callback(...args);
      } catch (e) {
        console.error(`presence client: a "${event}" listener threw`, e);
      }
    }
  }

  _setState(state, info = {}) {
    if (this.state === state && state !== "reconnecting") return;
    this.state = state;
    this._emit("state", state, info);
  }

  // ------------------------------------------------------------------------------ lifecycle

  /** Start connecting (and keep connected until close()). */
  connect() {
    if (!this._stopped) return;
    this._stopped = false;
    this._attempt = 0;
    this._open();
  }

  /** Close for good (code 1000); nothing is retried. */
  close() {
    this._stopped = true;
    this._gen += 1;
    const ws = this._ws;
    const error = new PresenceError("disconnected", "closed by the application");
    this._endConnection(error);
    this._settleSyncWaiters(error);
    for (const handle of [...this._timers]) this._cancel(handle);
    this._reconnectTimer = null;
    this._typingTimer = null;
    if (ws) {
      detach(ws);
      try {
        ws.close(1000, "bye");
      } catch {
        // already closing
      }
    }
    this._setState("closed", { code: 1000, reason: "closed by the application" });
  }

  _after(ms, fn) {
    const handle = this._clock.setTimeout(() => {
      this._timers.delete(handle);
      fn();
    }, ms);
    this._timers.add(handle);
    return handle;
  }

  _cancel(handle) {
    if (handle === null || handle === undefined) return;
    this._timers.delete(handle);
    this._clock.clearTimeout(handle);
  }

  _nextUrl() {
    const { url } = this.options;
    if (typeof url === "function") return url();
    if (Array.isArray(url)) return url[this._urlIndex++ % url.length];
    return url;
  }

  async _open() {
    const gen = ++this._gen;
    this._setState("connecting", { attempt: this._attempt });
    let token = this.options.token;
    if (typeof token === "function") {
      const provider = token;
      const context = { attempt: this._attempt, rejected: this._rejected };
      let timer = null;
      try {
        // Under the connect timeout too: a provider that never answers would leave the client
        // "connecting" for good instead of trying again.
        token = await new Promise((resolve, reject) => {
          const ms = this.options.connectTimeoutMs;
          timer = this._after(ms, () => reject(new Error(`no token within ${ms} ms`)));
          Promise.resolve()
            .then(() => provider(context))
            .then(resolve, reject);
        });
      } catch (e) {
        if (gen !== this._gen || this._stopped) return;
        this._emit("error", new PresenceError("token", String(e?.message ?? e)));
        this._scheduleReconnect({ code: null, reason: "token provider failed" });
        return;
      } finally {
        this._cancel(timer);
      }
      if (gen !== this._gen || this._stopped) return;
    }
    this._tokenInUse = token;
    if (this._refusedToken !== null && token === this._refusedToken) {
      const why = "the token provider returned the token just refused";
      this._giveUpUnauthorized(4001, why, `${why} (4001)`);
      return;
    }
    let url;
    let ws;
    try {
      url = this._nextUrl(); // a url function may throw: retried as a socket that could not open
      ws = new this._WebSocket(url);
    } catch (e) {
      this._emit("error", new PresenceError("connect", String(e?.message ?? e)));
      this._scheduleReconnect({ code: null, reason: "could not open a socket" });
      return;
    }
    this._resetConnection();
    this._ws = ws;
    this.url = url;
    this._connectTimer = this._after(this.options.connectTimeoutMs, () =>
      this._drop(ws, "no ready within the connect timeout"),
    );
    ws.onopen = () => {
      if (ws === this._ws) ws.send(JSON.stringify({ type: "identify", token }));
    };
    ws.onmessage = (event) => this._onMessage(ws, event.data);
    ws.onclose = (event) => this._onClose(ws, event.code, event.reason);
    ws.onerror = () => {}; // a close event follows
  }

  /** Give up on a socket that stopped answering: do not wait for its close handshake. */
  _drop(ws, reason) {
    if (ws !== this._ws) return;
    detach(ws);
    try {
      ws.close(4000, "dead connection");
    } catch {
      // already closing
    }
    this._onClose(ws, 4000, reason);
  }

  _onClose(ws, code, reason) {
    if (ws !== this._ws) return;
    detach(ws);
    const lived = this._readyAt === null ? 0 : this._clock.now() - this._readyAt;
    this._endConnection(new PresenceError("disconnected", `socket closed (${code})`));
    if (this._stopped) return;
    if (lived >= this.options.stableAfterMs) this._attempt = 0;
    if (code === 1000) {
      this._stopped = true;
      this._settleSyncWaiters(new PresenceError("disconnected", "closed by the server (1000)"));
      this._setState("closed", { code, reason });
      return;
    }
    // A 4001 for a missed identify deadline refused no token: the usual backoff below, the
    // provider not told of a rejection, a fixed token kept.
    if (code === 4001 && reason !== IDENTIFY_DEADLINE) {
      if (typeof this.options.token !== "function") {
        this._giveUpUnauthorized(code, reason, "the token was refused (4001)");
        return;
      }
      this._refusedToken = this._tokenInUse;
      this._rejected = true; // the provider is told, so it fetches a fresh token
    }
    const restart = RESTART_CLOSE_CODES.includes(code);
    // The server restarts this edge (or lost a shard) and holds our place: back at once, to any
    // edge; a failure after that backs off from the first window.
    if (restart) this._attempt = 0;
    this._scheduleReconnect({ code, reason, throttled: THROTTLING_CLOSE_CODES.includes(code), restart });
  }

  /** Stop for good: the token at hand would be refused again (a fixed one, or one handed back). */
  _giveUpUnauthorized(code, reason, message) {
    this._stopped = true;
    const error = new PresenceError("unauthorized", message);
    this._emit("error", error);
    this._settleSyncWaiters(error);
    this._setState("closed", { code, reason });
  }

  _scheduleReconnect({ code, reason, throttled = false, restart = false }) {
    const delayMs = restart
      ? restartDelay(this._backoff, this._random)
      : reconnectDelay(this._attempt, throttled, this._backoff, this._random);
    const attempt = this._attempt;
    this._attempt += 1;
    this._setState("reconnecting", { code, reason, attempt, delayMs, throttled });
    this._reconnectTimer = this._after(delayMs, () => {
      this._reconnectTimer = null;
      if (!this._stopped) this._open();
    });
  }

  _resetConnection() {
    this._readyAt = null;
    this._queue = [];
    this._tokens = this.options.rateBurst;
    this._tokensAt = this._clock.now();
    this._pumpTimer = null;
    this._heartbeatTimer = null;
    this._deadTimer = null;
    this._connectTimer = null;
    this._probeAt = null;
    this._hbWritten = 0;
    this._hbAcked = 0;
    this._hbQueued = 0;
    // type -> {frame, hb}: the latest account choice (status, setting) queued on this socket,
    // after `hb` heartbeats; the edge has read it once a heartbeat queued after it is answered.
    this._unconfirmed = new Map();
    this._windows = new Set();
    this.synced = false;
  }

  _endConnection(error) {
    for (const handle of [this._pumpTimer, this._heartbeatTimer, this._deadTimer, this._connectTimer]) {
      this._cancel(handle);
    }
    this._cancel(this._lastSeenTimer);
    this._lastSeenTimer = null;
    // A choice still queued behind the pacing, or sent with no heartbeat after it answered, may
    // never have been read (an invisible lost would show the account online): it is sent again
    // after the next ready, as one made while disconnected is.
    for (const { frame, hb } of this._unconfirmed.values()) {
      if (this._hbAcked > hb) continue;
      if (frame.type === "presence.update") this._pendingStatus = frame.status;
      else this._pendingVisibility = frame.lastSeenVisibility;
    }
    const windows = [...this._windows];
    this._ws = null;
    this._resetConnection();
    for (const w of windows) w.reject(error);
  }

  // ------------------------------------------------------------------------------ sending

  _isOpen() {
    return this._ws !== null && this._readyAt !== null;
  }

  /**
   * Queue a frame for the current socket, paced by a token bucket under the edge's limit; false
   * when there is none (what the client remembers is restored on the next). A frame that
   * supersedes queued ones takes the place of the first (_supersede). Otherwise, past
   * MAX_QUEUED_FRAMES, throws PresenceError("queue_full"), unless not `bounded`: the client's own
   * frames (heartbeats, what it restores after ready, requests whose room the caller checked)
   * are few, and never refused.
   */
  _send(frame, { window = null, bounded = true } = {}) {
    if (!this._isOpen()) return false;
    const parts = window === null ? overrides(frame) : NOTHING;
    if (parts.size > 0 && this._supersede(frame, parts)) return true;
    if (bounded) this._checkRoom(1);
    if (frame.type === "heartbeat") this._hbQueued += 1;
    this._queue.push({ frame, window, parts });
    this._pump();
    return true;
  }

  /** Throw queue_full unless `frames` more fit in the current socket's queue. */
  _checkRoom(frames) {
    if (this._isOpen() && this._queue.length + frames > MAX_QUEUED_FRAMES) {
      const waiting = `${this._queue.length} frames wait to be sent (${this.options.ratePerSecond} a second)`;
      throw new PresenceError("queue_full", `${waiting}, at most ${MAX_QUEUED_FRAMES}: nothing was queued`);
    }
  }

  /**
   * Put `frame` in the place of the queued frames it supersedes (every part of theirs is one of
   * its own): the first of them takes it, the others go. False if there is none.
   *
   * Only frames queued after the last request are looked at: nothing moves past a request (a
   * query's answer depends on the last-seen setting before it), nor past its heartbeat, so request
   * windows keep their frames and their markers. Moving `frame` up to the first one's place
   * reorders nothing that matters: a frame left between that shared a part with it would set a
   * part it does not, so be `online` or typing.start, each setting every part of its family, and
   * that frame superseded the first one when it was queued. Heartbeats are never merged, so the
   * count that confirms choices (_unconfirmed) stays exact; the choice is recorded with the count
   * at its call, which only a heartbeat behind its new place can reach.
   */
  _supersede(frame, parts) {
    const superseded = []; // indexes, last first
    for (let index = this._queue.length - 1; index >= 0; index -= 1) {
      const queued = this._queue[index];
      if (queued.window !== null) break;
      if (queued.parts.size > 0 && isSubset(queued.parts, parts)) superseded.push(index);
    }
    if (superseded.length === 0) return false;
    this._queue[superseded.at(-1)] = { frame, window: null, parts };
    // From the last: the indexes before it stay right.
    for (const index of superseded.slice(0, -1)) this._queue.splice(index, 1);
    return true;
  }

  /** Send a choice of the account (a chosen status, a setting), kept until the edge has read it. */
  _sendChoice(frame, { bounded = true } = {}) {
    if (!this._send(frame, { bounded })) return false;
    this._unconfirmed.set(frame.type, { frame, hb: this._hbQueued });
    return true;
  }

  _pump() {
    if (this._pumpTimer !== null || this._ws === null) return;
    const { rateBurst, ratePerSecond } = this.options;
    const now = this._clock.now();
    this._tokens = Math.min(rateBurst, this._tokens + ((now - this._tokensAt) / 1000) * ratePerSecond);
    this._tokensAt = now;
    while (this._queue.length > 0 && this._tokens >= 1) {
      this._tokens -= 1;
      const { frame, window } = this._queue.shift();
      if (window !== null && window.startAfter === null) window.startAfter = this._hbWritten;
      if (frame.type === "heartbeat") {
        this._hbWritten += 1;
        if (window !== null) window.endAt = this._hbWritten;
        if (this._probeAt === null) {
          this._probeAt = now;
          this._cancel(this._deadTimer);
          const deadAfter = this.options.deadAfterMs ?? this._heartbeatMs;
          const ws = this._ws;
          this._deadTimer = this._after(deadAfter, () => this._drop(ws, "no answer to a heartbeat"));
        }
      }
      this._ws.send(JSON.stringify(frame));
    }
    if (this._queue.length > 0) {
      const waitMs = Math.ceil(((1 - this._tokens) / ratePerSecond) * 1000);
      this._pumpTimer = this._after(waitMs, () => {
        this._pumpTimer = null;
        this._pump();
      });
    }
  }

  /**
   * Send `frames` followed by a heartbeat; resolves with every frame received between the
   * previous heartbeat's acknowledgement and this one's (the frames' answers, and possibly
   * broadcasts). Never refused for room: an application's request checks it first (_checkRoom),
   * for all its chunks at once, so that none is sent without the others.
   */
  _request(frames) {
    return new Promise((resolve, reject) => {
      if (!this._isOpen()) {
        reject(new PresenceError("not_connected", "not connected"));
        return;
      }
      const window = { startAfter: null, endAt: null, received: [], resolve, reject };
      this._windows.add(window);
      for (const frame of frames) this._send(frame, { window, bounded: false });
      this._send({ type: "heartbeat" }, { window, bounded: false });
    });
  }

  // ------------------------------------------------------------------------------ receiving

  _onMessage(ws, data) {
    if (ws !== this._ws) return;
    let frame;
    try {
      frame = JSON.parse(typeof data === "string" ? data : new TextDecoder().decode(data));
    } catch {
      return;
    }
    if (frame === null || typeof frame !== "object") return;
    this._probeAt = null;
    this._cancel(this._deadTimer);
    this._deadTimer = null;
    // A frame of a known type that cannot be applied is dropped whole, before any window takes
    // it: one bad frame must neither end the process (an exception in a `ws` handler does) nor
    // leave half of itself in the picture.
    const malformed = malformedFrame(frame);
    if (malformed !== null) {
      this._emit("error", new PresenceError("malformed_frame", `${frame.type}: ${malformed}`));
      return;
    }
    if (frame.type === "heartbeat.ack") {
      this._hbAcked += 1;
      for (const w of [...this._windows]) {
        if (w.endAt !== null && this._hbAcked >= w.endAt) {
          this._windows.delete(w);
          w.resolve(w.received);
        }
      }
      return;
    }
    for (const w of this._windows) {
      if (w.startAfter !== null && this._hbAcked >= w.startAfter) w.received.push(frame);
    }
    this._emit("frame", frame);
    try {
      this._apply(frame);
    } catch (e) {
      // Whatever slipped past malformedFrame: reported, and the client carries on.
      this._emit("error", new PresenceError("malformed_frame", `${frame.type}: ${e?.message ?? e}`));
    }
  }

  _apply(frame) {
    switch (frame.type) {
      case "ready":
        this._onReady(frame);
        break;
      case "presence.sync":
        for (const { userId, status } of frame.users) this._setPresence(userId, status, undefined);
        this._emit("sync", this);
        break;
      case "presence.changed":
        if (this._setPresence(frame.userId, frame.status, frame.lastSeenAt)) this._emit("sync", this);
        break;
      case "presence.self":
        this.status = frame.status;
        this._emit("self", frame.status);
        break;
      case "typing":
        this._onTyping(frame.channelId, frame.userId);
        break;
      case "voice.roster":
        // Sent before the edge read our unsubscribe: as for typing, not ours now.
        if (!this._channels.has(frame.channelId)) break;
        this._rosters.set(frame.channelId, [...frame.userIds]);
        this._emit("roster", frame.channelId, [...frame.userIds]);
        break;
      case "error":
        this._emit("error", new PresenceError(frame.code, frame.message));
        break;
      default:
        break; // anything newer than this client
    }
  }

  _onReady(frame) {
    this._cancel(this._connectTimer);
    this._connectTimer = null;
    this._readyAt = this._clock.now();
    this._rejected = false;
    this._refusedToken = null;
    this.userId = frame.userId;
    this.socketId = frame.socketId;
    this.status = frame.status;
    // Anything but a positive number means the contract's 30 s (as in presence_client).
    const serverMs = Number(frame.heartbeatIntervalMs);
    const server = Number.isFinite(serverMs) && serverMs > 0 ? serverMs : 30_000;
    const cap = this.options.heartbeatIntervalMs;
    this._heartbeatMs = Math.max(50, cap ? Math.min(cap, server) : server);
    this._beat();
    this._setState("open", { userId: frame.userId, socketId: frame.socketId });
    // What belongs to the socket, restored: the account's choices are durable upstream, the
    // socket's own (idle, focus, voice, subscriptions) are not.
    // Into an empty queue, and never refused (not bounded): a socket comes back whole.
    const own = { bounded: false };
    let pending = this._pendingStatus;
    // The account shows online chosen already (the edge read it before the close, or it was the
    // choice all along): `online` again would wake this idle socket for a moment, and its
    // watchers saw the account online, then idle (an idle tab moved by a drain within 30 s of
    // choosing online). The idle flag below is all there is to restore.
    if (pending === "online" && this._idle && (this.status === "online" || this.status === "idle")) pending = null;
    if (pending !== null) this._sendChoice({ type: "presence.update", status: pending }, own);
    // A resumed place keeps the idle flag of the socket it replaces, and an `online` sent just
    // before the server closed that socket may never have been read: this socket is awake.
    else if (!this._idle && this.status === "idle") this._send({ type: "presence.update", status: "online" }, own);
    // The idle flag is the socket's own, whatever the account chose: restored after the choice.
    if (this._idle) this._send({ type: "presence.update", status: "idle" }, own);
    this._pendingStatus = null;
    if (this._pendingVisibility !== null) {
      this._sendChoice({ type: "settings.update", lastSeenVisibility: this._pendingVisibility }, own);
      this._pendingVisibility = null;
    }
    if (this._focus !== null) this._send({ type: "focus", channelId: this._focus }, own);
    for (const channelId of this._channels) this._send({ type: "channel.subscribe", channelId }, own);
    if (this._voice !== null) this._send({ type: "voice.join", channelId: this._voice }, own);
    this._emit("ready", frame);
    this._resubscribe();
  }

  _beat() {
    this._heartbeatTimer = this._after(this._heartbeatMs, () => {
      this._send({ type: "heartbeat" }, { bounded: false });
      this._beat();
    });
  }

  // ------------------------------------------------------------------------------ presence

  /**
   * Watch these accounts (remembered across reconnects). Resolves once their sync is applied:
   * while connecting (say right after connect()), the sync after the socket opens. Before
   * connect(), at once: they are subscribed on connect. Rejects with the refusal
   * (rate_limited: retried later all the same), or disconnected / unauthorized when the client
   * closes first, or queue_full (nothing remembered).
   */
  async subscribe(userIds) {
    const fresh = [...new Set(userIds)].filter((u) => !this._watched.has(u));
    if (this._watched.size + fresh.length > this.options.maxSubscriptions) {
      throw new PresenceError("too_many_ids", `at most ${this.options.maxSubscriptions} subscriptions`);
    }
    if (fresh.length > 0) this._checkRoom(2 * chunkIds(fresh).length); // before anything is remembered
    for (const u of fresh) this._watched.add(u);
    if (fresh.length === 0) return;
    if (this._isOpen()) await this._subscribeChunks(fresh);
    else if (!this._stopped) await new Promise((resolve, reject) => this._syncWaiters.push({ resolve, reject }));
  }

  /** Resolve (error null) or reject the subscribe() calls waiting for the next resubscribe. */
  _settleSyncWaiters(error) {
    const waiters = this._syncWaiters;
    this._syncWaiters = [];
    for (const { resolve, reject } of waiters) {
      if (error === null) resolve();
      else reject(error);
    }
  }

  /** Stop watching; their entries leave the picture. Throws queue_full with nothing changed. */
  unsubscribe(userIds) {
    const gone = [...new Set(userIds)].filter((u) => this._watched.has(u));
    const chunks = chunkIds(gone);
    this._checkRoom(chunks.length);
    for (const u of gone) this._watched.delete(u);
    for (const chunk of chunks) this._send({ type: "presence.unsubscribe", userIds: chunk }, { bounded: false });
    let changed = false;
    for (const u of gone) changed = this._forget(u) || changed;
    if (changed) this._emit("sync", this);
  }

  /** The watched accounts (remembered subscriptions). */
  get watched() {
    return [...this._watched];
  }

  /** {status, lastSeenAt} of a watched account, or undefined (unknown, or outside the audience). */
  get(userId) {
    const entry = this._presence.get(userId);
    return entry === undefined ? undefined : { ...entry };
  }

  /** Every known watched account: [{userId, status, lastSeenAt}]. */
  list() {
    return [...this._presence].map(([userId, entry]) => ({ userId, ...entry }));
  }

  async _resubscribe() {
    const gen = this._gen;
    const ids = [...this._watched];
    try {
      await this._subscribeChunks(ids);
    } catch (e) {
      // The socket went: the next one starts over, and the subscribe() calls waiting go on
      // waiting. A refusal is theirs too (as for a subscribe() on an open socket).
      if (e.code !== "disconnected" && e.code !== "not_connected") this._settleSyncWaiters(e);
      return;
    }
    if (gen !== this._gen) return;
    this.synced = true;
    this._settleSyncWaiters(null);
    this._emit("sync", this);
    if (this.options.trackLastSeen) {
      // Also the times already known: they may have moved while this client was away.
      for (const [userId, entry] of this._presence) {
        if (!PRESENT_SET.has(entry.status)) this._wantLastSeen(userId);
      }
    }
  }

  async _subscribeChunks(ids) {
    const results = await Promise.all(
      chunkIds(ids).map((chunk) =>
        this._request([{ type: "presence.subscribe", userIds: chunk }]).then((received) => [chunk, received]),
      ),
    );
    let changed = false;
    let refused = null;
    for (const [chunk, received] of results) {
      const error = received.find((f) => f.type === "error" && (f.code === "rate_limited" || f.code === "too_many_ids"));
      const sync = received.find((f) => f.type === "presence.sync");
      if (sync === undefined) refused = error ?? { code: "rate_limited", message: "no presence.sync" };
      // Reconcile: an id the fresh sync leaves out (and no later frame named) is outside the
      // audience now, or unconfirmed: whatever the picture held for it goes.
      const named = new Set();
      let seenSync = false;
      for (const f of received) {
        if (f === sync) seenSync = true;
        if (f === sync) for (const u of f.users) named.add(u.userId);
        else if (seenSync && f.type === "presence.changed") named.add(f.userId);
      }
      for (const u of chunk) if (!named.has(u)) changed = this._forget(u) || changed;
    }
    if (changed) this._emit("sync", this);
    if (refused !== null) {
      // Budgets hold across reconnects: a refused resubscribe is retried, later.
      const error = new PresenceError(refused.code, refused.message);
      if (refused.type !== "error") this._emit("error", error); // an error frame was emitted already
      const gen = this._gen;
      const delay = reconnectDelay(1, true, this._backoff, this._random);
      this._after(delay, () => {
        if (gen === this._gen && this._isOpen()) this._resubscribe();
      });
      throw error;
    }
  }

  _forget(userId) {
    const previous = this._presence.get(userId);
    if (previous === undefined) return false;
    this._presence.delete(userId);
    this._emit("change", userId, undefined, { ...previous });
    return true;
  }

  /** Apply a status (and a last-seen time, when the frame carries one); true when it changed. */
  _setPresence(userId, status, lastSeenAt) {
    if (!this._watched.has(userId) || typeof status !== "string") return false;
    const previous = this._presence.get(userId);
    const entry = { status, lastSeenAt: previous?.lastSeenAt };
    if (lastSeenAt !== undefined) entry.lastSeenAt = lastSeenAt;
    else if (previous === undefined || previous.status !== status) entry.lastSeenAt = undefined;
    if (PRESENT_SET.has(status)) entry.lastSeenAt = undefined;
    if (previous !== undefined && previous.status === entry.status && previous.lastSeenAt === entry.lastSeenAt) {
      return false;
    }
    this._presence.set(userId, entry);
    this._emit("change", userId, { ...entry }, previous === undefined ? undefined : { ...previous });
    if (
      this.options.trackLastSeen &&
      !PRESENT_SET.has(status) &&
      entry.lastSeenAt === undefined &&
      (previous === undefined || PRESENT_SET.has(previous.status))
    ) {
      this._wantLastSeen(userId);
    }
    return true;
  }

  _wantLastSeen(userId) {
    this._lastSeenWanted.add(userId);
    if (this._lastSeenTimer !== null || !this._isOpen()) return;
    this._lastSeenTimer = this._after(250, () => {
      this._lastSeenTimer = null;
      const ids = [...this._lastSeenWanted].filter((u) => this._watched.has(u));
      this._lastSeenWanted.clear();
      if (ids.length > 0) {
        // The client's own: never refused for room.
        this._query(chunkIds(ids)).catch((e) => {
          if (e.code === "rate_limited") this._after(15_000, () => ids.forEach((u) => this._wantLastSeen(u)));
        });
      }
    });
  }

  /**
   * Status and last-seen of any number of accounts (split into <= 100-id frames, answers merged):
   * resolves to a Map userId -> {status, lastSeenAt: string | null}, in the order asked, without
   * the ids outside the caller's audience. Rejects with PresenceError (rate_limited,
   * too_many_ids, not_connected, disconnected, queue_full). Watched accounts' entries take the
   * answer too.
   */
  async query(userIds) {
    const chunks = chunkIds(userIds);
    this._checkRoom(2 * chunks.length); // every chunk is sent, or none
    return this._query(chunks);
  }

  async _query(chunks) {
    const windows = await Promise.all(
      chunks.map((chunk) => this._request([{ type: "presence.query", userIds: chunk }])),
    );
    const found = new Map();
    for (let i = 0; i < chunks.length; i += 1) {
      const asked = new Set(chunks[i]);
      for (const f of windows[i]) {
        if (f.type === "error" && (f.code === "rate_limited" || f.code === "too_many_ids")) {
          throw new PresenceError(f.code, f.message);
        }
        if (f.type !== "presence.changed" || !asked.has(f.userId)) continue;
        const entry = found.get(f.userId) ?? { status: f.status, lastSeenAt: null };
        entry.status = f.status;
        if (typeof f.lastSeenAt === "string") entry.lastSeenAt = f.lastSeenAt;
        if (PRESENT_SET.has(f.status)) entry.lastSeenAt = null;
        found.set(f.userId, entry);
      }
    }
    const answer = new Map();
    let changed = false;
    for (const chunk of chunks) {
      for (const u of chunk) {
        const entry = found.get(u);
        if (entry === undefined) continue;
        answer.set(u, entry);
        const mine = this._presence.get(u);
        if (mine !== undefined && mine.status === entry.status && mine.lastSeenAt !== entry.lastSeenAt) {
          changed = this._setPresence(u, entry.status, entry.lastSeenAt) || changed;
        }
      }
    }
    if (changed) this._emit("sync", this);
    return answer;
  }

  // ------------------------------------------------------------------------------ own status

  /** Choose online, dnd or invisible for the account, or mark this socket idle (online wakes it). */
  setStatus(status) {
    if (!CHOSEN.has(status)) throw new RangeError(`unknown status ${JSON.stringify(status)}`);
    // Sent first: one refused (queue_full) leaves what the client remembers as it was. Idle is not
    // a choice of the account: the flag below restores it, and the pending choice (say invisible)
    // stays.
    if (status === "idle") this._send({ type: "presence.update", status });
    else if (!this._sendChoice({ type: "presence.update", status })) this._pendingStatus = status;
    if (status === "idle" || status === "online") this._idle = status === "idle";
  }

  /** Who may read this account's last-seen time: everyone, friends or nobody. */
  setLastSeenVisibility(visibility) {
    if (!VISIBILITY.has(visibility)) throw new RangeError(`unknown visibility ${JSON.stringify(visibility)}`);
    if (!this._sendChoice({ type: "settings.update", lastSeenVisibility: visibility })) {
      this._pendingVisibility = visibility;
    }
  }

  /** The channel this socket has focused (null for none); restored after reconnects. */
  setFocus(channelId) {
    const focus = channelId ?? null;
    this._send({ type: "focus", channelId: focus });
    this._focus = focus;
  }

  // ------------------------------------------------------------------------------ channels

  /** Receive a channel's typing and voice events (remembered across reconnects). */
  subscribeChannel(channelId) {
    this._send({ type: "channel.subscribe", channelId });
    this._channels.add(channelId);
  }

  unsubscribeChannel(channelId) {
    this._send({ type: "channel.unsubscribe", channelId });
    this._channels.delete(channelId);
    this._typers.delete(channelId);
    this._rosters.delete(channelId);
  }

  /** Join a channel's voice roster with this socket (rejoined after reconnects). */
  joinVoice(channelId) {
    this._send({ type: "voice.join", channelId });
    this._voice = channelId;
  }

  leaveVoice() {
    this._send({ type: "voice.leave" });
    this._voice = null;
  }

  /** The voice roster of a subscribed channel (accounts, in order of joining). */
  roster(channelId) {
    return [...(this._rosters.get(channelId) ?? [])];
  }

  /** Call on every keystroke: typing.start goes out at most once per typingThrottleMs. */
  typing(channelId) {
    const now = this._clock.now();
    const last = this._typingSent.get(channelId);
    if (last !== undefined && now - last < this.options.typingThrottleMs) return false;
    if (!this._send({ type: "typing.start", channelId })) return false;
    this._typingSent.set(channelId, now);
    return true;
  }

  /** Stopped typing (message sent or input cleared). */
  stopTyping(channelId) {
    const last = this._typingSent.get(channelId);
    if (last === undefined) return;
    if (this._clock.now() - last < TYPING_LAPSE_MS) this._send({ type: "typing.stop", channelId });
    this._typingSent.delete(channelId);
  }

  /** Who is typing in a channel now (sorted), lapsing 10 s after their last typing frame. */
  typers(channelId) {
    const now = this._clock.now();
    const here = this._typers.get(channelId);
    if (here === undefined) return [];
    return [...here].filter(([, until]) => until > now).map(([u]) => u).sort();
  }

  _onTyping(channelId, userId) {
    if (!this._channels.has(channelId)) return;
    if (!this._typers.has(channelId)) this._typers.set(channelId, new Map());
    this._typers.get(channelId).set(userId, this._clock.now() + TYPING_LAPSE_MS);
    this._emit("typing", channelId, this.typers(channelId));
    this._armTypingLapse();
  }

  _armTypingLapse() {
    this._cancel(this._typingTimer);
    this._typingTimer = null;
    let next = Infinity;
    for (const here of this._typers.values()) for (const until of here.values()) next = Math.min(next, until);
    if (next === Infinity) return;
    this._typingTimer = this._after(Math.max(0, next - this._clock.now()), () => {
      this._typingTimer = null;
      const now = this._clock.now();
      for (const [channelId, here] of this._typers) {
        let lapsed = false;
        for (const [u, until] of here) {
          if (until <= now) {
            here.delete(u);
            lapsed = true;
          }
        }
        if (here.size === 0) this._typers.delete(channelId);
        if (lapsed) this._emit("typing", channelId, this.typers(channelId));
      }
      this._armTypingLapse();
    });
  }
}

const isString = (value) => typeof value === "string";
const isObject = (value) => value !== null && typeof value === "object";

/** Why a server frame of a known type cannot be applied, or null (presence_client's `malformed`). */
function malformedFrame(frame) {
  switch (frame.type) {
    case "presence.sync":
      if (!Array.isArray(frame.users)) return "users is not a list";
      if (!frame.users.every((u) => isObject(u) && isString(u.userId) && isString(u.status))) {
        return "a user without a string userId and status";
      }
      return null;
    case "presence.changed":
      return isString(frame.userId) && isString(frame.status) ? null : "userId or status not a string";
    case "presence.self":
      return isString(frame.status) ? null : "status not a string";
    case "typing":
      return isString(frame.channelId) && isString(frame.userId) ? null : "channelId or userId not a string";
    case "voice.roster":
      if (!isString(frame.channelId)) return "channelId not a string";
      return Array.isArray(frame.userIds) && frame.userIds.every(isString) ? null : "userIds not a list of strings";
    default:
      return null;
  }
}

function detach(ws) {
  ws.onopen = null;
  ws.onmessage = null;
  ws.onclose = null;
  // Not null: closing a socket that is still connecting makes the `ws` package emit "error", and
  // an "error" nobody listens to ends a Node process ("Unhandled 'error' event").
  ws.onerror = () => {};
}
