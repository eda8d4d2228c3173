# ruff: noqa: E501
"""The `# HELP` text of every metric family `/metrics` exports (names without `presence_`).

docs/operations.md's metrics table says the same (tests/unit/test_operations_doc.py keeps them equal).
"""

from __future__ import annotations

HELP: dict[str, str] = {
    "open_connections": "open websockets on this edge (refreshed every second)",
    "connections_total": "websocket connections accepted",
    "handshakes_refused_total": (
        "connections dropped at accept: too many still opening from the address, or too many new ones "
        "(max_handshakes_per_ip, accepts_per_ip_*)"
    ),
    "frames_in_total": "frames received, by frame type (refused when the frame was refused)",
    "frames_out_total": "frames sent to clients",
    "replies_total": "direct replies (ready, presence.sync, heartbeat.ack, error, …)",
    "closes_total": "sockets closed by the edge, by close code (4001 auth, 4000 silent, 1008 flood, 1009 too big, 1011 shard away)",
    "slow_clients_closed_total": "connections aborted because 1 MiB of output waited for them",
    "edge_batch_ops": "operations per batch sent to a shard",
    "edge_actor_call_seconds": "time of one batch call to a shard (histogram)",
    "edge_pull_items": "frames (each for one or more sockets) brought by one pull from a shard",
    "gc_pause_seconds": "pauses of CPython's cycle collector (histogram)",
    "edge_call_errors_total": "failed batch calls (the operations are retried for 10 s)",
    "edge_shard_restarts_total": "a shard came back with a new incarnation; this edge registered its sockets there again",
    "edge_reregister_undone_total": "a socket closed while it was being registered again on a restarted shard; its registration was undone (else it would stay a ghost)",
    "edge_lookups_refused_total": 'presence.query frames refused by the account\'s lookup budget (rate_limited); discarded="true": the lookup had left beside the charge and its answers were thrown away (a socket does that at most once a minute, then waits for each charge)',
    "edge_moved_total": "operations sent again because their slots were moving to another shard",
    "edge_departure_retries_total": "departures (disconnects and replays to a restarted shard) tried again after the retry window; each is retried until it lands",
    "repeats_dropped_total": "presence.changed frames not sent to a socket that already shows that status (e.g. re-announcements after a shard restart)",
    "resync_frames_total": "presence.changed frames sent after a shard restart to bring watchers' views back to the truth (only the differences)",
    "shard_accounts": "accounts the shard holds in memory",
    "shard_sockets": "live sockets registered on the shard",
    "shard_online": "accounts shown online, idle or dnd",
    "shard_edges": "edges holding a lease on the shard",
    "shard_pending_last_seen": "departures whose last-seen is not yet committed to PostgreSQL",
    "shard_ops_total": "operations applied, by kind (connect, status, watch, query, …)",
    "shard_batch_ops": "operations per applied batch",
    "shard_pull_items": "mail items (each for one or more sockets) answered by one pull of an edge",
    "shard_apply_seconds": "time to apply one batch, database reads included (histogram)",
    "events_total": "frames produced for clients, by type (each counted once however many recipients)",
    "deliveries_total": "socket deliveries of those frames",
    "mail_dropped_total": "frames dropped because an edge's mailbox was full (an edge not pulling)",
    "last_seen_acked_total": "last-seen values confirmed written by the FlushActor",
    "last_seen_flush_failures_total": "failed hand-overs to the FlushActor (retried with back-off up to 30 s)",
    "checkpoint_rows_total": "rows written by the 10-minute checkpoint of accounts that stay online",
    "shard_errors_total": "a background duty of the shard failed and was restarted",
    "shard_preload_failures_total": "loading accounts or channels from PostgreSQL failed; the batch was applied with what the shard had in memory",
    "shard_ops_unavailable_total": "operations refused because their account or channel could not be loaded (PostgreSQL away); the edge retries them",
    "slots_exported_total": "slots handed to another shard (resizing)",
    "slots_imported_total": "slots taken over from another shard (resizing)",
    "flush_statements_total": "UPDATE statements the FlushActor committed",
    "flush_rows_written_total": "last-seen rows it sent to PostgreSQL",
    "flush_errors_total": "failed writes (the rows stay and are written again)",
    "flush_retries_total": "writes retried after a failure",
    "flush_pending_rows": "rows waiting for the next write",
    "flush_in_flight_rows": "rows of the write under way",
    "flush_oldest_pending_age_seconds": "age of the oldest waiting row, in seconds (0 when none waits)",
    "edge_delivery_seconds": "time from a pull's answer to its frames written to every recipient socket on this edge (histogram)",
    "flush_write_seconds": "time of one last-seen UPDATE statement of the FlushActor, successful or not (histogram)",
    "process_open_fds": "open file descriptors of the process (sockets included)",
    "process_max_fds": "the process's soft limit on open files (RLIMIT_NOFILE)",
    "process_resident_memory_bytes": "resident memory of the process",
    "process_cpu_seconds": "CPU time (user + system) the process has used",
    "process_pid": "the process id (tells restarts apart)",
}
