/** The reconnect policy's windows, in milliseconds. */
export interface BackoffPolicy {
  baseMs: number;
  capMs: number;
  throttledBaseMs: number;
  throttledCapMs: number;
  /** After a 1012 or 1011 close: the reconnect waits uniformly within this window. */
  restartWindowMs: number;
}

export declare const DEFAULT_BACKOFF: Readonly<BackoffPolicy>;

/**
 * Milliseconds to wait before reconnect attempt `attempt` (0 for the first retry): full jitter
 * over min(cap, base * 2^attempt); after 4029/1008 (`throttled`) at least half a longer window.
 */
export declare function reconnectDelay(
  attempt: number,
  throttled?: boolean,
  policy?: Partial<BackoffPolicy>,
  random?: () => number,
): number;

/** Close codes after which the client backs off harder (4029, 1008). */
export declare const THROTTLING_CLOSE_CODES: readonly number[];
/** Close codes after which the client comes back at once, to any edge (1011, 1012). */
export declare const RESTART_CLOSE_CODES: readonly number[];

/** Milliseconds to wait after a 1012 or 1011 close: uniform over `restartWindowMs`. */
export declare function restartDelay(policy?: Partial<BackoffPolicy>, random?: () => number): number;
