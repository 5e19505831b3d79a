-- dumbwaiter PostgreSQL schema, migration 0004: job counts kept as they change.
--
-- `stats` used to count dw_jobs (every finished row kept for the retention
-- window included).  Now statement-level triggers on dw_jobs write, per
-- statement, the net change of each (queue, state) it made, as new rows of
-- dw_count_deltas: append-only, so no two writers ever wait for each other
-- (a counter row updated in place would be held by the writer's transaction
-- until its commit, an outbox transaction of the application included).
-- `stats` folds the deltas into dw_counts (taking them with SKIP LOCKED, so
-- concurrent folders never wait either) and reads the few rows left.  Every
-- change is counted, whoever makes it: the broker, COPY, the outbox's fast
-- path in the application's transaction, or SQL run by hand.
--
-- The state counted is the one stats show: a scheduled job that has already
-- run (attempt > 0) counts as 'retrying'.

LOCK TABLE dw_jobs IN SHARE ROW EXCLUSIVE MODE;

CREATE TABLE dw_counts (
    queue text NOT NULL,
    state text NOT NULL,
    n     bigint NOT NULL,
    PRIMARY KEY (queue, state)
);

-- No key and no index: an append costs one heap insert (folders find rows
-- by a scan of this small table and lock them by ctid).
CREATE TABLE dw_count_deltas (
    queue text NOT NULL,
    state text NOT NULL,
    n     bigint NOT NULL
);
ALTER TABLE dw_count_deltas SET (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0.0,
    autovacuum_vacuum_insert_threshold = 5000
);

CREATE FUNCTION dw_count_inserted() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    INSERT INTO dw_count_deltas (queue, state, n)
    SELECT queue, CASE WHEN state = 'scheduled' AND attempt > 0 THEN 'retrying' ELSE state END,
           count(*)
    FROM dw_new GROUP BY 1, 2;
    RETURN NULL;
END
$$;

CREATE FUNCTION dw_count_deleted() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    INSERT INTO dw_count_deltas (queue, state, n)
    SELECT queue, CASE WHEN state = 'scheduled' AND attempt > 0 THEN 'retrying' ELSE state END,
           -count(*)
    FROM dw_old GROUP BY 1, 2;
    RETURN NULL;
END
$$;

-- An update that changes no (queue, state), such as a heartbeat or a freed
-- unique key, writes nothing.
CREATE FUNCTION dw_count_updated() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    INSERT INTO dw_count_deltas (queue, state, n)
    SELECT queue, s, sum(d) FROM (
        SELECT queue, CASE WHEN state = 'scheduled' AND attempt > 0 THEN 'retrying'
                           ELSE state END AS s, 1 AS d FROM dw_new
        UNION ALL
        SELECT queue, CASE WHEN state = 'scheduled' AND attempt > 0 THEN 'retrying'
                           ELSE state END, -1 FROM dw_old
    ) AS x GROUP BY 1, 2 HAVING sum(d) <> 0;
    RETURN NULL;
END
$$;

CREATE TRIGGER dw_jobs_count_insert AFTER INSERT ON dw_jobs
    REFERENCING NEW TABLE AS dw_new FOR EACH STATEMENT EXECUTE FUNCTION dw_count_inserted();
CREATE TRIGGER dw_jobs_count_delete AFTER DELETE ON dw_jobs
    REFERENCING OLD TABLE AS dw_old FOR EACH STATEMENT EXECUTE FUNCTION dw_count_deleted();
CREATE TRIGGER dw_jobs_count_update AFTER UPDATE ON dw_jobs
    REFERENCING OLD TABLE AS dw_old NEW TABLE AS dw_new
    FOR EACH STATEMENT EXECUTE FUNCTION dw_count_updated();

-- The jobs already stored: counted once.  Writers are held off from the
-- lock at the top of this file to its commit, and the count's snapshot is
-- taken after the lock: it sees every earlier commit, the triggers count
-- every later one.
INSERT INTO dw_counts (queue, state, n)
SELECT queue, CASE WHEN state = 'scheduled' AND attempt > 0 THEN 'retrying' ELSE state END,
       count(*)
FROM dw_jobs GROUP BY 1, 2;

INSERT INTO dw_schema_version (version, name) VALUES (4, 'counts');
