// Compiled (never run) by tests/unit/test_js_types.py when a TypeScript compiler is at hand:
// the declarations describe the client as an application uses it.
import { PresenceClient, describeLastSeen, reconnectDelay, chunkIds, type ServerFrame, type ClientFrame, type PresenceEntry } from "../src/index.js";
const c = new PresenceClient({ url: "ws://x/ws/presence", token: async (ctx) => (ctx.rejected ? "a" : "b"), trackLastSeen: true });
c.on("change", (u: string, e: PresenceEntry | undefined) => { if (e) describeLastSeen(e.status, e.lastSeenAt, Date.now(), { form: "header" }); });
c.on("state", (s, info) => { if (s === "reconnecting") console.log(info.delayMs); });
c.onSync((cl) => cl.list().map((x) => x.userId));
const f: ClientFrame = { type: "presence.query", userIds: chunkIds(["a"])[0] };
function handle(fr: ServerFrame) { if (fr.type === "presence.changed") console.log(fr.lastSeenAt?.length); }
const d: number = reconnectDelay(1, true, { baseMs: 5 }, Math.random);
c.query(["a"]).then((m) => m.get("a")?.lastSeenAt);
console.log(f, handle, d);
