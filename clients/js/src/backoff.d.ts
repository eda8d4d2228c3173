/** The reconnect policy's windows, in milliseconds. */
export interface BackoffPolicy {
  baseMs: number;
  capMs: number;
  throttledBaseMs: number;
  throttledCapMs: number;
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
