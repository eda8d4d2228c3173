import type { Status } from "./index.js";

export interface DescribeOptions {
  /** IANA time zone of the date shown after a week (default "UTC"). */
  timeZone?: string;
  /** "card" (default): the status in words; "header": a conversation header (idle, dnd read Online). */
  form?: "card" | "header";
}

/** The label for an account shown with `status` whose last-seen time is `lastSeenAt` (ISO 8601). */
export declare function describeLastSeen(
  status: Status,
  lastSeenAt: string | null | undefined,
  nowMs: number,
  options?: DescribeOptions,
): string;
