// presence-cluster's JavaScript client: `import { PresenceClient } from "@presence-cluster/client"`.
export { PresenceClient, PresenceError, chunkIds, MAX_QUERY_IDS, MAX_QUEUED_FRAMES, PRESENT, TYPING_LAPSE_MS } from "./client.js";
export { DEFAULT_BACKOFF, RESTART_CLOSE_CODES, THROTTLING_CLOSE_CODES, reconnectDelay, restartDelay } from "./backoff.js";
export { describeLastSeen } from "./lastseen.js";
