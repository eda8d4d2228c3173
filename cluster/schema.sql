-- The durable data of the presence service. Applied idempotently by `presence up` (and by tests):
-- every statement may run again on an existing database without effect.

CREATE TABLE IF NOT EXISTS users (
    id                   text PRIMARY KEY,
    -- The account's chosen status: durable so that an invisible account never flashes online.
    chosen_status        text NOT NULL DEFAULT 'online'
                         CHECK (chosen_status IN ('online', 'dnd', 'invisible')),
    last_seen_visibility text NOT NULL DEFAULT 'everyone'
                         CHECK (last_seen_visibility IN ('everyone', 'friends', 'nobody')),
    -- Written only in batches by the FlushActor, always through GREATEST.
    last_seen_at         timestamptz
);

-- When the chosen status and the visibility were chosen (the shard's clock; NULL: stored before
-- these columns existed, older than any choice). A write with an older time changes nothing, so
-- late or replayed writes never revert a newer choice, and the FlushActor freezes an invisible
-- account's last-seen at chosen_at (the moment it hid) without reading the row first.
ALTER TABLE users ADD COLUMN IF NOT EXISTS chosen_at timestamptz;
ALTER TABLE users ADD COLUMN IF NOT EXISTS visibility_at timestamptz;

-- Accepted friendships, stored once per pair with a < b.
CREATE TABLE IF NOT EXISTS friendships (
    a text NOT NULL,
    b text NOT NULL,
    PRIMARY KEY (a, b),
    CHECK (a < b)
);
CREATE INDEX IF NOT EXISTS friendships_b ON friendships (b);

CREATE TABLE IF NOT EXISTS servers (
    id text PRIMARY KEY
);

CREATE TABLE IF NOT EXISTS server_members (
    server_id text NOT NULL,
    user_id   text NOT NULL,
    PRIMARY KEY (server_id, user_id)
);
CREATE INDEX IF NOT EXISTS server_members_user ON server_members (user_id);

CREATE TABLE IF NOT EXISTS channels (
    id        text PRIMARY KEY,
    server_id text NOT NULL
);
CREATE INDEX IF NOT EXISTS channels_server ON channels (server_id);

-- The pool's size as `presence scale` last set it: `presence up` starts the pool at it. The slot
-- directory that knows it lives in Ray, which loses it when the head restarts without GCS fault
-- tolerance (issue 25: a pool scaled to 12 came back at 8).
CREATE TABLE IF NOT EXISTS pool_size (
    one    boolean PRIMARY KEY DEFAULT true CHECK (one),
    shards integer NOT NULL CHECK (shards > 0),
    set_at timestamptz NOT NULL DEFAULT now()
);

-- The slot map the directory last published (owner of each of the 4,096 slots), written by the
-- directory at each change: a directory Ray restarts (its node died, or the head with GCS fault
-- tolerance) serves it again instead of the even map it was created with (issue 25).
CREATE TABLE IF NOT EXISTS slot_map (
    one         boolean PRIMARY KEY DEFAULT true CHECK (one),
    version     integer NOT NULL,
    shard_count integer NOT NULL CHECK (shard_count > 0),
    owners      smallint[] NOT NULL,
    set_at      timestamptz NOT NULL DEFAULT now()
);

-- Audience changes made by anybody (our `presence load` or the host application writing these
-- tables directly) reach the shards through NOTIFY, so no restart and no polling is needed.
-- Payload: 'u:<user id>' for a user whose friends or servers changed, 'c:<channel id>' for a
-- channel whose server changed, 's:<user id>' for a user whose settings changed.
-- 'a:' when more than 1,000 memberships changed in one statement (`presence load` of a big server):
-- every shard reloads every account it holds, as after a reconnection of its listener, instead
-- of receiving a notification per member (a million members loaded were a million notifications
-- to every shard and about 17 µs of row trigger each; issue 28 item 3).
-- On UPDATE both the old and the new row matter (a host application may rewrite a row in place);
-- pg_notify drops duplicate payloads within a transaction, so notifying an id twice costs nothing.
CREATE OR REPLACE FUNCTION presence_notify_friendship() RETURNS trigger AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        PERFORM pg_notify('presence_audience', 'u:' || OLD.a);
        PERFORM pg_notify('presence_audience', 'u:' || OLD.b);
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        PERFORM pg_notify('presence_audience', 'u:' || NEW.a);
        PERFORM pg_notify('presence_audience', 'u:' || NEW.b);
    END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION presence_notify_member() RETURNS trigger AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        PERFORM pg_notify('presence_audience', 'u:' || OLD.user_id);
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        PERFORM pg_notify('presence_audience', 'u:' || NEW.user_id);
    END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION presence_notify_channel() RETURNS trigger AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        PERFORM pg_notify('presence_audience', 'c:' || OLD.id);
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        PERFORM pg_notify('presence_audience', 'c:' || NEW.id);
    END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION presence_notify_settings() RETURNS trigger AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        PERFORM pg_notify('presence_audience', 's:' || OLD.id);
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        PERFORM pg_notify('presence_audience', 's:' || NEW.id);
    END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;

DROP TRIGGER IF EXISTS friendships_notify ON friendships;
CREATE TRIGGER friendships_notify AFTER INSERT OR UPDATE OR DELETE ON friendships
    FOR EACH ROW EXECUTE FUNCTION presence_notify_friendship();

-- Memberships come and go a row at a time (a member joins or leaves) or by the hundred thousand
-- (`presence load` of a big server): inserts and deletes notify once per statement, from its
-- transition table; an UPDATE (a host application rewriting a row in place) per row, as before.
CREATE OR REPLACE FUNCTION presence_notify_members() RETURNS trigger AS $$
BEGIN
    IF (SELECT count(*) FROM (SELECT 1 FROM changed_members LIMIT 1001) AS t) > 1000 THEN
        PERFORM pg_notify('presence_audience', 'a:');
    ELSE
        PERFORM pg_notify('presence_audience', 'u:' || user_id) FROM changed_members;
    END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;

DROP TRIGGER IF EXISTS server_members_notify ON server_members;
CREATE TRIGGER server_members_notify AFTER UPDATE ON server_members
    FOR EACH ROW EXECUTE FUNCTION presence_notify_member();

DROP TRIGGER IF EXISTS server_members_insert_notify ON server_members;
CREATE TRIGGER server_members_insert_notify AFTER INSERT ON server_members
    REFERENCING NEW TABLE AS changed_members
    FOR EACH STATEMENT EXECUTE FUNCTION presence_notify_members();

DROP TRIGGER IF EXISTS server_members_delete_notify ON server_members;
CREATE TRIGGER server_members_delete_notify AFTER DELETE ON server_members
    REFERENCING OLD TABLE AS changed_members
    FOR EACH STATEMENT EXECUTE FUNCTION presence_notify_members();

DROP TRIGGER IF EXISTS channels_notify ON channels;
CREATE TRIGGER channels_notify AFTER INSERT OR UPDATE OR DELETE ON channels
    FOR EACH ROW EXECUTE FUNCTION presence_notify_channel();

DROP TRIGGER IF EXISTS users_settings_notify ON users;
CREATE TRIGGER users_settings_notify AFTER UPDATE OF last_seen_visibility ON users
    FOR EACH ROW WHEN (OLD.last_seen_visibility IS DISTINCT FROM NEW.last_seen_visibility)
    EXECUTE FUNCTION presence_notify_settings();

-- A shard may have cached 'everyone' for an account that had no row yet (the default); a row
-- created or removed with any other setting changes what the shard must enforce.
DROP TRIGGER IF EXISTS users_settings_insert_notify ON users;
CREATE TRIGGER users_settings_insert_notify AFTER INSERT ON users
    FOR EACH ROW WHEN (NEW.last_seen_visibility <> 'everyone')
    EXECUTE FUNCTION presence_notify_settings();

DROP TRIGGER IF EXISTS users_settings_delete_notify ON users;
CREATE TRIGGER users_settings_delete_notify AFTER DELETE ON users
    FOR EACH ROW WHEN (OLD.last_seen_visibility <> 'everyone')
    EXECUTE FUNCTION presence_notify_settings();
