-- dumbwaiter PostgreSQL schema, migration 0007: the count triggers' functions
-- (migration 0004) name their table in full instead of setting search_path.
--
-- Each of them ran with `SET search_path FROM CURRENT`, so that the
-- application's own search_path (the outbox's fast path writes dw_jobs in the
-- caller's session) could not send its count elsewhere.  A function with a
-- SET clause saves, sets and restores the setting on every call, and every
-- statement that writes dw_jobs calls one: an enqueue, a claim, an ack, a
-- prune.  Naming the schema in the one table the functions write does the
-- same job without it (the functions they call, count and the like, come
-- from pg_catalog, which is searched first whatever search_path says).
-- docs/benchmarks-postgres.md has what it saves.
--
-- Same counts, same triggers: only the three functions are replaced, in
-- this schema (the one migrate set search_path to).  A schema renamed
-- later needs this migration's functions made again, as it did before
-- (`FROM CURRENT` kept the name as text too).

DO $do$
DECLARE
    deltas text := quote_ident(current_schema()) || '.dw_count_deltas';
    retrying text := 'CASE WHEN state = ''scheduled'' AND attempt > 0 THEN ''retrying'''
                     ' ELSE state END';
BEGIN
    EXECUTE 'CREATE OR REPLACE FUNCTION dw_count_inserted() RETURNS trigger'
        ' LANGUAGE plpgsql AS $f$ BEGIN'
        ' INSERT INTO ' || deltas || ' (queue, state, n)'
        ' SELECT queue, ' || retrying || ', count(*) FROM dw_new GROUP BY 1, 2;'
        ' RETURN NULL; END $f$';
    EXECUTE 'CREATE OR REPLACE FUNCTION dw_count_deleted() RETURNS trigger'
        ' LANGUAGE plpgsql AS $f$ BEGIN'
        ' INSERT INTO ' || deltas || ' (queue, state, n)'
        ' SELECT queue, ' || retrying || ', -count(*) FROM dw_old GROUP BY 1, 2;'
        ' RETURN NULL; END $f$';
    -- an update that changes no (queue, state), such as a heartbeat, writes nothing
    EXECUTE 'CREATE OR REPLACE FUNCTION dw_count_updated() RETURNS trigger'
        ' LANGUAGE plpgsql AS $f$ BEGIN'
        ' INSERT INTO ' || deltas || ' (queue, state, n)'
        ' SELECT queue, s, sum(d) FROM ('
        ' SELECT queue, ' || retrying || ' AS s, 1 AS d FROM dw_new'
        ' UNION ALL SELECT queue, ' || retrying || ', -1 FROM dw_old'
        ' ) AS x GROUP BY 1, 2 HAVING sum(d) <> 0;'
        ' RETURN NULL; END $f$';
END
$do$;

INSERT INTO dw_schema_version (version, name) VALUES (7, 'count_functions');
