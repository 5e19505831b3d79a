-- dumbwaiter PostgreSQL schema, migration 0006: every job's message key, indexed.
--
-- A search by key (JobFilter.key: `jobs ls --key`, the dashboard, replay and
-- purge by key) read the whole selection: the `key` column holds a task's
-- key only while the job holds it (a newer unique job frees it to NULL, and
-- event deliveries never hold one), so every other job was matched by
-- parsing its body.  msg_key holds the job's Message.key for every job,
-- written at enqueue by every path (insert, COPY, the outbox's fast path) and
-- never freed.  dw_jobs_msg_key indexes it only where the key column does
-- not answer (key IS NULL: freed holders, event deliveries), so a search is
-- two index probes (key = k OR (msg_key = k AND key IS NULL)) and a job
-- that holds its key, the usual keyed task, costs no second index entry at
-- enqueue (it gets one when a newer unique job frees its key, in that
-- UPDATE).  Jobs without a key, most of them, cost it nothing.
--
-- Numbered 6: number 5 belongs to another change.  The broker applies each
-- of its migrations that is not recorded yet (migrations.py), so a schema
-- that got this one first still gets 5 later.  This one only adds to
-- dw_jobs (a column, a function, an index) and needs nothing of 5.
--
-- Jobs stored before this migration get their keys from their bodies here,
-- before the index is built.  Adding the column is instant (no default);
-- only rows that have a key are rewritten.  The bodies are read in one pass
-- (as json, which parses faster than jsonb: 0.4 s for 200,000 jobs); if one
-- is not JSON or not UTF-8, that pass fails as a whole and a second one
-- reads every body through dw_body_key, which returns NULL for such a body
-- (an exception block per row: 1.5 s for 200,000), so a broken body never
-- fails the migration.  dw_body_key is kept for the statement in
-- docs/postgres.md that fills in the keys of jobs stored by a process of an
-- older dumbwaiter that was still running after this migration.

-- Collation "C": the key is only ever compared for equality, and a btree
-- under a libc collation other than C calls strcoll() at every comparison
-- of an insert's descent.
ALTER TABLE dw_jobs ADD COLUMN msg_key text COLLATE "C";

CREATE FUNCTION dw_body_key(body bytea) RETURNS text
LANGUAGE plpgsql STABLE STRICT
AS $$
DECLARE
    d jsonb;
BEGIN
    d := convert_from(body, 'UTF8')::jsonb;
    IF jsonb_typeof(d -> 'key') = 'string' THEN
        RETURN d ->> 'key';
    END IF;
    RETURN NULL;
EXCEPTION WHEN others THEN
    RETURN NULL;
END
$$;

DO $$
BEGIN
    UPDATE dw_jobs SET msg_key = convert_from(body, 'UTF8')::json ->> 'key'
    WHERE position('"key"'::bytea IN body) > 0
      AND json_typeof(convert_from(body, 'UTF8')::json -> 'key') = 'string';
EXCEPTION WHEN others THEN
    UPDATE dw_jobs AS j SET msg_key = b.k
    FROM (SELECT id, dw_body_key(body) AS k FROM dw_jobs
          WHERE position('"key"'::bytea IN body) > 0) AS b
    WHERE j.id = b.id AND b.k IS NOT NULL;
END
$$;

CREATE INDEX dw_jobs_msg_key ON dw_jobs (msg_key, id) WHERE msg_key IS NOT NULL AND key IS NULL;

INSERT INTO dw_schema_version (version, name) VALUES (6, 'job_keys');
