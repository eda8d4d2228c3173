// Types of @presence-cluster/client. The frames (./frames.d.ts) are generated from
// docs/asyncapi.yaml by clients/js/gen_types.py.
import type { BackoffPolicy } from "./backoff.js";
import type { ErrorFrame, ReadyFrame, ServerFrame } from "./frames.js";

export type * from "./frames.js";
export {
  DEFAULT_BACKOFF,
  RESTART_CLOSE_CODES,
  THROTTLING_CLOSE_CODES,
  reconnectDelay,
  restartDelay,
} from "./backoff.js";
export type { BackoffPolicy } from "./backoff.js";
export { describeLastSeen } from "./lastseen.js";
export type { DescribeOptions } from "./lastseen.js";

export type Status = "online" | "idle" | "dnd" | "invisible" | "offline";
export type ChosenStatus = "online" | "idle" | "dnd" | "invisible";
export type LastSeenVisibility = "everyone" | "friends" | "nobody";
export type ConnectionState = "idle" | "connecting" | "open" | "reconnecting" | "closed";

export declare const TYPING_LAPSE_MS: 10000;
export declare const MAX_QUERY_IDS: 100;
/** Frames the outgoing queue holds at most; past it a call that would queue one more throws `queue_full`. */
export declare const MAX_QUEUED_FRAMES: 1000;
export declare const PRESENT: readonly ["online", "idle", "dnd"];

export declare function chunkIds(ids: Iterable<string>, maxIds?: number, maxBytes?: number): string[][];

export type PresenceErrorCode =
  | ErrorFrame["code"]
  | "not_connected"
  | "disconnected"
  | "unauthorized"
  | "token"
  | "connect"
  /** A server frame that could not be applied: dropped, the client carries on. */
  | "malformed_frame"
  /** The outgoing queue holds MAX_QUEUED_FRAMES frames: the call queued nothing. */
  | "queue_full";

export declare class PresenceError extends Error {
  constructor(code: PresenceErrorCode, message?: string);
  readonly code: PresenceErrorCode;
}

/** A watched account: lastSeenAt undefined = not asked, null = none (or withheld). */
export interface PresenceEntry {
  status: Status;
  lastSeenAt: string | null | undefined;
}

export interface QueryAnswer {
  status: Status;
  lastSeenAt: string | null;
}

export interface TokenContext {
  attempt: number;
  /** The previous token was refused (4001): fetch a fresh one (handing it back stops the client). */
  rejected: boolean;
}

export interface Clock {
  now(): number;
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

export interface StateInfo {
  code?: number | null;
  reason?: string;
  attempt?: number;
  delayMs?: number;
  throttled?: boolean;
  userId?: string;
  socketId?: string;
}

export interface PresenceClientOptions {
  /** One URL, a list (the next one on each reconnect), or a function returning one. */
  url: string | string[] | (() => string);
  /** A token, or a provider called on every connect. */
  token: string | ((ctx: TokenContext) => string | Promise<string>);
  /** The WebSocket constructor (default globalThis.WebSocket). */
  WebSocket?: unknown;
  /** Caps the server's heartbeatIntervalMs (default: the server's). */
  heartbeatIntervalMs?: number | null;
  /** No frame at all this long after a heartbeat: the connection is dead (default: the interval). */
  deadAfterMs?: number | null;
  connectTimeoutMs?: number;
  stableAfterMs?: number;
  typingThrottleMs?: number;
  trackLastSeen?: boolean;
  maxSubscriptions?: number;
  rateBurst?: number;
  ratePerSecond?: number;
  backoff?: Partial<BackoffPolicy>;
  random?: () => number;
  clock?: Clock;
}

export interface PresenceEvents {
  state: (state: ConnectionState, info: StateInfo) => void;
  ready: (frame: ReadyFrame) => void;
  change: (userId: string, entry: PresenceEntry | undefined, previous: PresenceEntry | undefined) => void;
  sync: (client: PresenceClient) => void;
  self: (status: Status) => void;
  typing: (channelId: string, userIds: string[]) => void;
  roster: (channelId: string, userIds: string[]) => void;
  error: (error: PresenceError) => void;
  frame: (frame: ServerFrame) => void;
}

export declare class PresenceClient {
  constructor(options: PresenceClientOptions);
  readonly state: ConnectionState;
  readonly userId: string | null;
  readonly socketId: string | null;
  /** The account's real status (from ready and presence.self). */
  readonly status: Status | null;
  /** Every remembered subscription confirmed on the current socket. */
  readonly synced: boolean;
  readonly url: string | undefined;
  readonly watched: string[];

  on<E extends keyof PresenceEvents>(event: E, callback: PresenceEvents[E]): () => void;
  onSync(callback: (client: PresenceClient) => void): () => void;
  connect(): void;
  close(): void;

  /**
   * Watch these accounts (remembered across reconnects). Resolves once their sync is applied;
   * while connecting, once the sync after the socket opens is (so `await subscribe()` right
   * after `connect()` finds the client open). Before `connect()`: at once. Rejects with the
   * refusal (`rate_limited`, retried later all the same), or `disconnected` / `unauthorized`
   * when the client closes first.
   */
  subscribe(userIds: Iterable<string>): Promise<void>;
  unsubscribe(userIds: Iterable<string>): void;
  get(userId: string): PresenceEntry | undefined;
  list(): Array<{ userId: string } & PresenceEntry>;
  query(userIds: Iterable<string>): Promise<Map<string, QueryAnswer>>;

  setStatus(status: ChosenStatus): void;
  setLastSeenVisibility(visibility: LastSeenVisibility): void;
  setFocus(channelId: string | null): void;

  subscribeChannel(channelId: string): void;
  unsubscribeChannel(channelId: string): void;
  joinVoice(channelId: string): void;
  leaveVoice(): void;
  roster(channelId: string): string[];
  typing(channelId: string): boolean;
  stopTyping(channelId: string): void;
  typers(channelId: string): string[];
}
