//! The PostgreSQL schema: its migrations, one per version, applied under
//! an advisory lock.

use tokio_postgres::Client;

#[cfg(test)]
use std::time::Duration;

use crate::StoreError;

/// The schema, one migration per version; `egress_schema` holds how many
/// were applied. Never edit a migration that shipped; add one.
const MIGRATIONS: &[&str] = &[
    "
    CREATE TABLE egress_stream (
        stream text PRIMARY KEY,
        incarnation bytea NOT NULL CHECK (length(incarnation) = 16),
        generation bigint NOT NULL DEFAULT 0 CHECK (generation >= 0),
        next_sequence bigint NOT NULL DEFAULT 0 CHECK (next_sequence >= 0),
        acked_through bigint CHECK (acked_through >= 0),
        lease bigint NOT NULL DEFAULT 0,
        owner text,
        lease_until timestamptz
    );
    CREATE TABLE egress_outbox (
        stream text NOT NULL,
        seq bigint NOT NULL CHECK (seq >= 0),
        payload bytea NOT NULL,
        dead_reason smallint,
        dead_held boolean,
        PRIMARY KEY (stream, seq)
    );
",
    "
    -- One Ready of a leased stream as one statement (one round trip, one
    -- implicit transaction): NULL when the lease is not the stream's any
    -- more (fenced, nothing written); otherwise the stored next sequence,
    -- and the appends were written only if it is where they start. The
    -- stream's row is locked NOWAIT: an application's transaction holding
    -- it (an append not yet committed) fails this call at once with
    -- lock_not_available instead of stalling every stream behind it on the
    -- worker's connection. Arguments that break the store's rules raise
    -- (nothing written). Meant to run as a statement of its own: inside a
    -- caller's transaction, p_sync false turns synchronous_commit off for
    -- the rest of that transaction.
    CREATE FUNCTION egress_apply(
        p_stream text, p_lease bigint, p_start bigint, p_seqs bigint[], p_payloads bytea[],
        p_generation bigint, p_dead_seqs bigint[], p_dead_reasons smallint[], p_dead_held boolean[],
        p_acked bigint, p_sync boolean)
    RETURNS bigint LANGUAGE plpgsql AS $$
    DECLARE
        stored bigint;
        appended bigint := coalesce(cardinality(p_seqs), 0);
    BEGIN
        IF coalesce(cardinality(p_payloads), 0) <> appended
           OR p_seqs IS DISTINCT FROM ARRAY(SELECT generate_series(p_start, p_start + appended - 1)) AND appended > 0
        THEN
            RAISE EXCEPTION 'egress_apply: the appends are not % payloads from %', appended, p_start;
        END IF;
        IF coalesce(cardinality(p_dead_seqs), 0) <> coalesce(cardinality(p_dead_reasons), 0)
           OR coalesce(cardinality(p_dead_seqs), 0) <> coalesce(cardinality(p_dead_held), 0)
        THEN
            RAISE EXCEPTION 'egress_apply: the dead letters'' arrays differ in length';
        END IF;
        IF NOT p_sync THEN
            PERFORM set_config('synchronous_commit', 'off', true);
        END IF;
        SELECT next_sequence INTO stored FROM egress_stream
        WHERE stream = p_stream AND lease = p_lease FOR UPDATE NOWAIT;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        IF p_acked IS NOT NULL AND p_acked >= stored + appended THEN
            RAISE EXCEPTION 'egress_apply: acknowledged through % but the next sequence is %', p_acked, stored + appended;
        END IF;
        IF appended > 0 THEN
            IF stored <> p_start THEN
                RETURN stored;
            END IF;
            INSERT INTO egress_outbox (stream, seq, payload)
            SELECT p_stream, u.seq, u.payload FROM unnest(p_seqs, p_payloads) AS u(seq, payload);
        END IF;
        IF appended > 0 OR p_generation IS NOT NULL OR p_acked IS NOT NULL THEN
            UPDATE egress_stream SET
                next_sequence = next_sequence + appended,
                generation = GREATEST(generation, coalesce(p_generation, generation)),
                acked_through = CASE WHEN p_acked IS NULL THEN acked_through
                                     ELSE GREATEST(coalesce(acked_through, -1), p_acked) END
            WHERE stream = p_stream;
        END IF;
        IF coalesce(cardinality(p_dead_seqs), 0) > 0 THEN
            UPDATE egress_outbox o SET dead_reason = d.reason, dead_held = d.held
            FROM unnest(p_dead_seqs, p_dead_reasons, p_dead_held) AS d(seq, reason, held)
            WHERE o.stream = p_stream AND o.seq = d.seq;
        END IF;
        IF p_acked IS NOT NULL THEN
            -- Dead letters stay, below the watermark too, until requeued
            -- or discarded.
            DELETE FROM egress_outbox WHERE stream = p_stream AND seq <= p_acked AND dead_reason IS NULL;
        END IF;
        RETURN stored;
    END $$;

    -- Dead letters, for people: every record held or tombstoned, with why
    -- and who holds its stream.
    CREATE VIEW egress_dead_letters AS
    SELECT o.stream, o.seq,
           CASE o.dead_reason WHEN 0 THEN 'permanent' WHEN 1 THEN 'retries' WHEN 2 THEN 'replays' END AS reason,
           o.dead_held AS held, length(o.payload) AS bytes, s.owner, s.lease_until
    FROM egress_outbox o JOIN egress_stream s USING (stream)
    WHERE o.dead_reason IS NOT NULL;
",
    "
    -- Leases in a table of their own: renewing or taking a lease never
    -- waits for a stream's row, which an application's transaction holds
    -- from its append to its commit. Every stream has one lease row (the
    -- trigger adds it with the stream); its number still fences every
    -- write of the stream (egress_apply share-locks it, so a take waits
    -- for no write and no write passes a take).
    CREATE TABLE egress_lease (
        stream text PRIMARY KEY REFERENCES egress_stream (stream) ON DELETE CASCADE,
        lease bigint NOT NULL DEFAULT 0,
        owner text,
        until timestamptz
    );
    INSERT INTO egress_lease (stream, lease, owner, until)
    SELECT stream, lease, owner, lease_until FROM egress_stream;
    CREATE FUNCTION egress_lease_row() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO egress_lease (stream) VALUES (NEW.stream) ON CONFLICT (stream) DO NOTHING;
        RETURN NULL;
    END $$;
    CREATE TRIGGER egress_lease_row AFTER INSERT ON egress_stream
    FOR EACH ROW EXECUTE FUNCTION egress_lease_row();
    DROP VIEW egress_dead_letters;
    ALTER TABLE egress_stream DROP COLUMN lease, DROP COLUMN owner, DROP COLUMN lease_until;
    CREATE VIEW egress_dead_letters AS
    SELECT o.stream, o.seq,
           CASE o.dead_reason WHEN 0 THEN 'permanent' WHEN 1 THEN 'retries' WHEN 2 THEN 'replays' END AS reason,
           o.dead_held AS held, length(o.payload) AS bytes, l.owner, l.until AS lease_until
    FROM egress_outbox o JOIN egress_lease l USING (stream)
    WHERE o.dead_reason IS NOT NULL;

    -- As version 2's, fenced by the lease row (share-locked NOWAIT: a take
    -- of the stream in progress fails this call with lock_not_available,
    -- retried, then fenced) and the stream's row locked NOWAIT as before.
    CREATE OR REPLACE FUNCTION egress_apply(
        p_stream text, p_lease bigint, p_start bigint, p_seqs bigint[], p_payloads bytea[],
        p_generation bigint, p_dead_seqs bigint[], p_dead_reasons smallint[], p_dead_held boolean[],
        p_acked bigint, p_sync boolean)
    RETURNS bigint LANGUAGE plpgsql AS $$
    DECLARE
        stored bigint;
        appended bigint := coalesce(cardinality(p_seqs), 0);
    BEGIN
        IF coalesce(cardinality(p_payloads), 0) <> appended
           OR p_seqs IS DISTINCT FROM ARRAY(SELECT generate_series(p_start, p_start + appended - 1)) AND appended > 0
        THEN
            RAISE EXCEPTION 'egress_apply: the appends are not % payloads from %', appended, p_start;
        END IF;
        IF coalesce(cardinality(p_dead_seqs), 0) <> coalesce(cardinality(p_dead_reasons), 0)
           OR coalesce(cardinality(p_dead_seqs), 0) <> coalesce(cardinality(p_dead_held), 0)
        THEN
            RAISE EXCEPTION 'egress_apply: the dead letters'' arrays differ in length';
        END IF;
        IF NOT p_sync THEN
            PERFORM set_config('synchronous_commit', 'off', true);
        END IF;
        PERFORM 1 FROM egress_lease WHERE stream = p_stream AND lease = p_lease FOR SHARE NOWAIT;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        SELECT next_sequence INTO stored FROM egress_stream WHERE stream = p_stream FOR UPDATE NOWAIT;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        IF p_acked IS NOT NULL AND p_acked >= stored + appended THEN
            RAISE EXCEPTION 'egress_apply: acknowledged through % but the next sequence is %', p_acked, stored + appended;
        END IF;
        IF appended > 0 THEN
            IF stored <> p_start THEN
                RETURN stored;
            END IF;
            INSERT INTO egress_outbox (stream, seq, payload)
            SELECT p_stream, u.seq, u.payload FROM unnest(p_seqs, p_payloads) AS u(seq, payload);
        END IF;
        IF appended > 0 OR p_generation IS NOT NULL OR p_acked IS NOT NULL THEN
            UPDATE egress_stream SET
                next_sequence = next_sequence + appended,
                generation = GREATEST(generation, coalesce(p_generation, generation)),
                acked_through = CASE WHEN p_acked IS NULL THEN acked_through
                                     ELSE GREATEST(coalesce(acked_through, -1), p_acked) END
            WHERE stream = p_stream;
        END IF;
        IF coalesce(cardinality(p_dead_seqs), 0) > 0 THEN
            UPDATE egress_outbox o SET dead_reason = d.reason, dead_held = d.held
            FROM unnest(p_dead_seqs, p_dead_reasons, p_dead_held) AS d(seq, reason, held)
            WHERE o.stream = p_stream AND o.seq = d.seq;
        END IF;
        IF p_acked IS NOT NULL THEN
            DELETE FROM egress_outbox WHERE stream = p_stream AND seq <= p_acked AND dead_reason IS NULL;
        END IF;
        RETURN stored;
    END $$;
",
    "
    -- Durable lanes. The lanes' own row is a stream named after them
    -- (lanes = stream, lane NULL): its lease row fences every lane, its
    -- generation is theirs, and its next_sequence is their next ordinal.
    -- Each lane is a stream marked with its lanes and its key (JSON), with
    -- no lease row of its own; each of its records keeps its ordinal. A
    -- plain take never takes lanes (egress_stream.lanes must match).
    ALTER TABLE egress_stream ADD COLUMN lanes text, ADD COLUMN lane text;
    ALTER TABLE egress_outbox ADD COLUMN ordinal bigint CHECK (ordinal >= 0);
    CREATE INDEX egress_stream_lanes ON egress_stream (lanes) WHERE lanes IS NOT NULL;
    CREATE OR REPLACE FUNCTION egress_lease_row() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF NEW.lane IS NULL THEN
            INSERT INTO egress_lease (stream) VALUES (NEW.stream) ON CONFLICT (stream) DO NOTHING;
        END IF;
        RETURN NULL;
    END $$;

    -- The write of one stream's Ready once its writer is known to hold it
    -- (egress_apply's lease, or egress_apply_lanes's): NULL when the stream
    -- has no row; otherwise the stored next sequence, and the appends were
    -- written only if it is where they start. The stream must belong to
    -- p_lanes (NULL: to no lanes). Arguments that break the store's rules
    -- raise (nothing written).
    CREATE FUNCTION egress_write(
        p_stream text, p_lanes text, p_start bigint, p_seqs bigint[], p_payloads bytea[], p_ordinals bigint[],
        p_generation bigint, p_dead_seqs bigint[], p_dead_reasons smallint[], p_dead_held boolean[],
        p_acked bigint)
    RETURNS bigint LANGUAGE plpgsql AS $$
    DECLARE
        stored bigint;
        owner_lanes text;
        appended bigint := coalesce(cardinality(p_seqs), 0);
    BEGIN
        IF coalesce(cardinality(p_payloads), 0) <> appended
           OR p_ordinals IS NOT NULL AND coalesce(cardinality(p_ordinals), 0) <> appended
           OR p_seqs IS DISTINCT FROM ARRAY(SELECT generate_series(p_start, p_start + appended - 1)) AND appended > 0
        THEN
            RAISE EXCEPTION 'egress_write: the appends are not % payloads from %', appended, p_start;
        END IF;
        IF coalesce(cardinality(p_dead_seqs), 0) <> coalesce(cardinality(p_dead_reasons), 0)
           OR coalesce(cardinality(p_dead_seqs), 0) <> coalesce(cardinality(p_dead_held), 0)
        THEN
            RAISE EXCEPTION 'egress_write: the dead letters'' arrays differ in length';
        END IF;
        SELECT next_sequence, lanes INTO stored, owner_lanes FROM egress_stream
        WHERE stream = p_stream FOR UPDATE NOWAIT;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        IF owner_lanes IS DISTINCT FROM p_lanes THEN
            RAISE EXCEPTION 'egress_write: stream % belongs to lanes %, not %', p_stream, owner_lanes, p_lanes
                USING ERRCODE = 'EGR01', DETAIL = p_stream, HINT = coalesce(owner_lanes, '');
        END IF;
        IF p_acked IS NOT NULL AND p_acked >= stored + appended THEN
            RAISE EXCEPTION 'egress_write: acknowledged through % but the next sequence is %', p_acked, stored + appended;
        END IF;
        IF appended > 0 THEN
            IF stored <> p_start THEN
                RETURN stored;
            END IF;
            INSERT INTO egress_outbox (stream, seq, payload, ordinal)
            SELECT p_stream, u.seq, u.payload, u.ordinal
            FROM unnest(p_seqs, p_payloads, coalesce(p_ordinals, array_fill(NULL::bigint, ARRAY[appended::int])))
                 AS u(seq, payload, ordinal);
        END IF;
        IF appended > 0 OR p_generation IS NOT NULL OR p_acked IS NOT NULL THEN
            UPDATE egress_stream SET
                next_sequence = next_sequence + appended,
                generation = GREATEST(generation, coalesce(p_generation, generation)),
                acked_through = CASE WHEN p_acked IS NULL THEN acked_through
                                     ELSE GREATEST(coalesce(acked_through, -1), p_acked) END
            WHERE stream = p_stream;
        END IF;
        IF coalesce(cardinality(p_dead_seqs), 0) > 0 THEN
            UPDATE egress_outbox o SET dead_reason = d.reason, dead_held = d.held
            FROM unnest(p_dead_seqs, p_dead_reasons, p_dead_held) AS d(seq, reason, held)
            WHERE o.stream = p_stream AND o.seq = d.seq;
        END IF;
        IF p_acked IS NOT NULL THEN
            -- Dead letters stay, below the watermark too, until requeued
            -- or discarded.
            DELETE FROM egress_outbox WHERE stream = p_stream AND seq <= p_acked AND dead_reason IS NULL;
        END IF;
        RETURN stored;
    END $$;

    -- As version 3's, its write egress_write's: a plain stream only.
    CREATE OR REPLACE FUNCTION egress_apply(
        p_stream text, p_lease bigint, p_start bigint, p_seqs bigint[], p_payloads bytea[],
        p_generation bigint, p_dead_seqs bigint[], p_dead_reasons smallint[], p_dead_held boolean[],
        p_acked bigint, p_sync boolean)
    RETURNS bigint LANGUAGE plpgsql AS $$
    BEGIN
        IF NOT p_sync THEN
            PERFORM set_config('synchronous_commit', 'off', true);
        END IF;
        PERFORM 1 FROM egress_lease WHERE stream = p_stream AND lease = p_lease FOR SHARE NOWAIT;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        RETURN egress_write(p_stream, NULL, p_start, p_seqs, p_payloads, NULL, p_generation,
                            p_dead_seqs, p_dead_reasons, p_dead_held, p_acked);
    END $$;

    -- One LanesReady of the lanes p_lanes as one statement, fenced by the
    -- lanes' lease: fenced true (nothing written) when the lease is not
    -- theirs any more; conflict and stored set (nothing written) when a
    -- lane's stored counter is not where its appends start; otherwise
    -- every part written. The streams of p_forget go first; then each
    -- lane i (p_streams[i], its key p_keys[i]) gets its next p_counts[i]
    -- appends of the flat p_seqs, p_payloads and p_ordinals, its
    -- generation and watermark, and the dead letters whose p_dead_lanes is
    -- i; then the lanes' next ordinal and generation rise.
    CREATE FUNCTION egress_apply_lanes(
        p_lanes text, p_lease bigint, p_forget text[],
        p_streams text[], p_keys text[], p_starts bigint[], p_counts integer[], p_generations bigint[],
        p_acked bigint[], p_seqs bigint[], p_payloads bytea[], p_ordinals bigint[],
        p_dead_lanes integer[], p_dead_seqs bigint[], p_dead_reasons smallint[], p_dead_held boolean[],
        p_next_ordinal bigint, p_generation bigint, p_sync boolean,
        OUT fenced boolean, OUT conflict text, OUT stored bigint)
    LANGUAGE plpgsql AS $$
    DECLARE
        n integer := coalesce(cardinality(p_streams), 0);
        at integer := 1;
        got bigint;
        owner_lanes text;
        i integer;
    BEGIN
        fenced := false;
        IF coalesce(cardinality(p_keys), 0) <> n OR coalesce(cardinality(p_starts), 0) <> n
           OR coalesce(cardinality(p_counts), 0) <> n OR coalesce(cardinality(p_generations), 0) <> n
           OR coalesce(cardinality(p_acked), 0) <> n
           OR coalesce(cardinality(p_seqs), 0) <> (SELECT coalesce(sum(c), 0) FROM unnest(p_counts) AS c)
           OR EXISTS (SELECT 1 FROM unnest(p_counts) AS c WHERE c < 0)
           OR coalesce(cardinality(p_dead_lanes), 0) <> coalesce(cardinality(p_dead_seqs), 0)
           OR EXISTS (SELECT 1 FROM unnest(p_dead_lanes) AS d WHERE d IS NULL OR d < 1 OR d > n)
        THEN
            RAISE EXCEPTION 'egress_apply_lanes: the lanes'' arrays do not match';
        END IF;
        IF NOT p_sync THEN
            PERFORM set_config('synchronous_commit', 'off', true);
        END IF;
        PERFORM 1 FROM egress_lease WHERE stream = p_lanes AND lease = p_lease FOR SHARE NOWAIT;
        IF NOT FOUND THEN
            fenced := true;
            RETURN;
        END IF;
        PERFORM 1 FROM egress_stream WHERE stream = p_lanes AND lanes = p_lanes FOR UPDATE NOWAIT;
        IF NOT FOUND THEN
            fenced := true;
            RETURN;
        END IF;
        -- Every lane's counter checked (and its row locked) before anything
        -- is written: a forgotten lane starts again at 0.
        FOR i IN 1 .. n LOOP
            SELECT next_sequence, lanes INTO got, owner_lanes FROM egress_stream
            WHERE stream = p_streams[i] FOR UPDATE NOWAIT;
            IF NOT FOUND OR p_streams[i] = ANY(coalesce(p_forget, '{}')) THEN
                got := 0;
                owner_lanes := p_lanes;
            END IF;
            IF owner_lanes IS DISTINCT FROM p_lanes THEN
                RAISE EXCEPTION 'egress_apply_lanes: stream % is not a lane of %', p_streams[i], p_lanes
                    USING ERRCODE = 'EGR01', DETAIL = p_streams[i], HINT = coalesce(owner_lanes, '');
            END IF;
            IF p_counts[i] > 0 AND got <> p_starts[i] THEN
                conflict := p_streams[i];
                stored := got;
                RETURN;
            END IF;
        END LOOP;
        DELETE FROM egress_outbox o USING egress_stream s
        WHERE o.stream = s.stream AND s.stream = ANY(p_forget) AND s.lanes = p_lanes AND s.lane IS NOT NULL;
        DELETE FROM egress_stream WHERE stream = ANY(p_forget) AND lanes = p_lanes AND lane IS NOT NULL;
        FOR i IN 1 .. n LOOP
            INSERT INTO egress_stream (stream, incarnation, lanes, lane)
            SELECT p_streams[i], l.incarnation, p_lanes, p_keys[i] FROM egress_stream l WHERE l.stream = p_lanes
            ON CONFLICT (stream) DO NOTHING;
            PERFORM egress_write(
                p_streams[i], p_lanes, p_starts[i],
                p_seqs[at:at + p_counts[i] - 1], p_payloads[at:at + p_counts[i] - 1],
                p_ordinals[at:at + p_counts[i] - 1], p_generations[i],
                ARRAY(SELECT p_dead_seqs[j] FROM generate_subscripts(p_dead_lanes, 1) AS j
                      WHERE p_dead_lanes[j] = i ORDER BY j),
                ARRAY(SELECT p_dead_reasons[j] FROM generate_subscripts(p_dead_lanes, 1) AS j
                      WHERE p_dead_lanes[j] = i ORDER BY j),
                ARRAY(SELECT p_dead_held[j] FROM generate_subscripts(p_dead_lanes, 1) AS j
                      WHERE p_dead_lanes[j] = i ORDER BY j),
                p_acked[i]);
            at := at + p_counts[i];
        END LOOP;
        UPDATE egress_stream SET
            next_sequence = GREATEST(next_sequence, p_next_ordinal),
            generation = GREATEST(generation, coalesce(p_generation, generation))
        WHERE stream = p_lanes;
    END $$;

    -- Dead letters of lanes too: a lane's stream has no lease row of its
    -- own; its owner is its lanes' lease's.
    DROP VIEW egress_dead_letters;
    CREATE VIEW egress_dead_letters AS
    SELECT o.stream, o.seq,
           CASE o.dead_reason WHEN 0 THEN 'permanent' WHEN 1 THEN 'retries' WHEN 2 THEN 'replays' END AS reason,
           o.dead_held AS held, length(o.payload) AS bytes, l.owner, l.until AS lease_until
    FROM egress_outbox o
    JOIN egress_stream s USING (stream)
    LEFT JOIN egress_lease l ON l.stream = coalesce(s.lanes, o.stream)
    WHERE o.dead_reason IS NOT NULL;
",
    "
    -- Durable latest projections. A projection's own row is a stream
    -- marked latest, with lanes = '' (the name of no lanes': no plain take,
    -- plain write or outbox append meets it, and no lanes' write passes
    -- egress_apply_lanes's check, which wants lanes = the row's own name):
    -- its lease row fences its writes and its generation is the
    -- projection's. Each key is a row of
    -- egress_latest_key: its newest version not yet applied with the value
    -- (both or neither), and its frontier.
    ALTER TABLE egress_stream ADD COLUMN latest boolean NOT NULL DEFAULT false;
    CREATE TABLE egress_latest_key (
        name text NOT NULL REFERENCES egress_stream (stream) ON DELETE CASCADE,
        key text NOT NULL,
        version bigint CHECK (version >= 0),
        value bytea,
        durable_through bigint CHECK (durable_through >= 0),
        PRIMARY KEY (name, key),
        CHECK ((version IS NULL) = (value IS NULL))
    );

    -- No lane under a projection's name: lanes written with a
    -- projection's lease make none (nor any other row that would make the
    -- projection's row lanes).
    CREATE FUNCTION egress_lane_of_latest() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF NEW.lane IS NOT NULL AND EXISTS (SELECT 1 FROM egress_stream WHERE stream = NEW.lanes AND latest) THEN
            RAISE EXCEPTION 'stream % would be a lane of the latest projection %', NEW.stream, NEW.lanes
                USING ERRCODE = 'EGR01', DETAIL = NEW.stream, HINT = NEW.lanes;
        END IF;
        RETURN NEW;
    END $$;
    CREATE TRIGGER egress_lane_of_latest BEFORE INSERT ON egress_stream
    FOR EACH ROW EXECUTE FUNCTION egress_lane_of_latest();

    -- One LatestReady of the projection p_name as one statement, fenced by
    -- its lease: true (nothing written) when the lease is not its any
    -- more; otherwise the keys of p_forget deleted, then each key of
    -- p_keys written with its newest version, value and frontier.
    -- Arguments that break the store's rules raise (nothing written).
    CREATE FUNCTION egress_apply_latest(
        p_name text, p_lease bigint, p_forget text[], p_keys text[], p_versions bigint[], p_values bytea[],
        p_frontiers bigint[], p_sync boolean)
    RETURNS boolean LANGUAGE plpgsql AS $$
    DECLARE
        n integer := coalesce(cardinality(p_keys), 0);
    BEGIN
        IF coalesce(cardinality(p_versions), 0) <> n OR coalesce(cardinality(p_values), 0) <> n
           OR coalesce(cardinality(p_frontiers), 0) <> n
        THEN
            RAISE EXCEPTION 'egress_apply_latest: the keys'' arrays do not match';
        END IF;
        IF NOT p_sync THEN
            PERFORM set_config('synchronous_commit', 'off', true);
        END IF;
        PERFORM 1 FROM egress_lease WHERE stream = p_name AND lease = p_lease FOR SHARE NOWAIT;
        IF NOT FOUND THEN
            RETURN true;
        END IF;
        PERFORM 1 FROM egress_stream WHERE stream = p_name AND latest;
        IF NOT FOUND THEN
            RETURN true;
        END IF;
        DELETE FROM egress_latest_key WHERE name = p_name AND key = ANY(coalesce(p_forget, '{}'));
        INSERT INTO egress_latest_key (name, key, version, value, durable_through)
        SELECT p_name, u.key, u.version, u.value, u.frontier
        FROM unnest(p_keys, p_versions, p_values, p_frontiers) AS u(key, version, value, frontier)
        ON CONFLICT (name, key) DO UPDATE SET
            version = excluded.version, value = excluded.value, durable_through = excluded.durable_through;
        RETURN false;
    END $$;
",
];

/// How long a store's statement waits for a row lock an application's
/// transaction holds before it fails as [`StoreError::Busy`].
pub(super) const LOCK_TIMEOUT_MS: u32 = 50;

/// The PostgreSQL schema version this library writes.
pub const PG_SCHEMA_VERSION: u32 = 5;

/// Installs (or upgrades) egress's tables, in one transaction, under an
/// advisory lock so that workers starting together migrate once.
/// Idempotent.
///
/// # Errors
/// A database written by a newer version of this library
/// ([`StoreError::SchemaTooNew`]), or PostgreSQL's error.
pub async fn migrate(client: &mut Client) -> Result<(), StoreError> {
    // Already at this version (every worker's connection asks): no lock.
    let current =
        client.query_opt("SELECT version FROM egress_schema WHERE to_regclass('egress_schema') IS NOT NULL", &[]).await;
    if let Ok(Some(row)) = current
        && u32::try_from(row.get::<_, i32>(0)).is_ok_and(|v| v == PG_SCHEMA_VERSION)
    {
        return Ok(());
    }
    let tx = client.transaction().await?;
    tx.batch_execute(
        "SELECT pg_advisory_xact_lock(7236450910388245059);
         CREATE TABLE IF NOT EXISTS egress_schema (version integer NOT NULL);
         INSERT INTO egress_schema (version) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM egress_schema);",
    )
    .await?;
    let version: i32 = tx.query_one("SELECT version FROM egress_schema", &[]).await?.get(0);
    let supported = PG_SCHEMA_VERSION;
    let version = u32::try_from(version).unwrap_or(u32::MAX);
    if version > supported {
        return Err(StoreError::SchemaTooNew { found: version, supported });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        tx.batch_execute(sql).await?;
        let applied = i32::try_from(i + 1).unwrap_or(i32::MAX);
        tx.execute("UPDATE egress_schema SET version = $1", &[&applied]).await?;
    }
    tx.commit().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::postgres::PgStore;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn version_two_leases_move_to_their_own_table_with_their_numbers_owners_and_ends() {
        let Some(url) = egress_testkit::pg_database("egress_schema").await else { return };
        let (mut client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        // A database at version 2, as that library left it.
        client
            .batch_execute(
                "CREATE TABLE egress_schema (version integer NOT NULL); INSERT INTO egress_schema VALUES (2);",
            )
            .await
            .unwrap();
        for sql in &MIGRATIONS[..2] {
            client.batch_execute(sql).await.unwrap();
        }
        client
            .batch_execute(
                "INSERT INTO egress_stream (stream, incarnation, lease, owner, lease_until) VALUES
                   ('held', '\\x000102030405060708090a0b0c0d0e0f', 5, 'w1', now() + interval '1 hour'),
                   ('free', '\\x000102030405060708090a0b0c0d0e0f', 3, NULL, NULL);
                 INSERT INTO egress_outbox (stream, seq, payload, dead_reason, dead_held)
                   VALUES ('held', 0, '\\x00', 0, true);",
            )
            .await
            .unwrap();
        migrate(&mut client).await.unwrap();
        let version: i32 = client.query_one("SELECT version FROM egress_schema", &[]).await.unwrap().get(0);
        assert_eq!(u32::try_from(version).unwrap(), PG_SCHEMA_VERSION);
        let leases: Vec<(String, i64, Option<String>, bool)> = client
            .query("SELECT stream, lease, owner, until > now() FROM egress_lease ORDER BY stream", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get::<_, Option<bool>>(3).unwrap_or(false)))
            .collect();
        assert_eq!(leases, [("free".into(), 3, None, false), ("held".into(), 5, Some("w1".into()), true)]);
        let owner: Option<String> =
            client.query_one("SELECT owner FROM egress_dead_letters", &[]).await.unwrap().get(0);
        assert_eq!(owner.as_deref(), Some("w1"), "the view reads the lease's table");
        // The numbers go on rising; a held lease stays held.
        let store = PgStore::connect(&url, "w2").await.unwrap();
        let (lease, _) = store.take_stream("free", Duration::from_secs(60)).await.unwrap().unwrap();
        assert_eq!(lease.number, 4);
        assert!(store.take_stream("held", Duration::from_secs(60)).await.unwrap().is_none());
        // A stream made after the migration has its lease row.
        let (lease, _) = store.take_stream("new", Duration::from_secs(60)).await.unwrap().unwrap();
        assert_eq!(lease.number, 1);
    }
}
