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
];

/// How long a store's statement waits for a row lock an application's
/// transaction holds before it fails as [`StoreError::Busy`].
pub(super) const LOCK_TIMEOUT_MS: u32 = 50;

/// The PostgreSQL schema version this library writes.
pub const PG_SCHEMA_VERSION: u32 = 3;

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
