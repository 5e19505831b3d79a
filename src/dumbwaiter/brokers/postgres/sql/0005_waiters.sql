-- dumbwaiter PostgreSQL schema, migration 0005: idle workers, for the direct handoff.
--
-- An idle fetch (its claim found nothing) registers here, in the same
-- statement as that claim.  A single enqueue of a ready job takes one live
-- waiter of its queue (FOR UPDATE SKIP LOCKED: producers never wait for each
-- other), deletes it, stores the job already running for that worker (attempt
-- 1, the waiter's fencing token and lease) and sends it the job in a NOTIFY
-- on the waiter's own channel: the worker starts it without a claim.
--
-- One row is one wait of one fetch, taken at most once.  A row is never used
-- after `expires` (the fetch's deadline), so a worker that died or left is
-- handed nothing once its wait would have ended; the worker deletes its row
-- with its next claim, and the maintenance leader deletes rows left by dead
-- workers.  UNLOGGED: waiters live as long as connections do, so a server
-- crash may forget them (the table is then empty, which is what it should be)
-- and their churn writes no WAL.

CREATE UNLOGGED TABLE dw_waiters (
    token   bigint PRIMARY KEY,             -- the fencing token a handed job gets
    queues  text[] NOT NULL,                -- the queues the fetch serves
    worker  text NOT NULL,                  -- the worker's id (dw_jobs.worker)
    lease   double precision NOT NULL,      -- seconds of lease a handed job gets
    channel text NOT NULL,                  -- the LISTEN channel of the worker's process
    expires timestamptz NOT NULL            -- the end of the wait
);

-- Every wait inserts a row and deletes one: vacuum it often, it stays tiny.
ALTER TABLE dw_waiters SET (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.0,
    autovacuum_vacuum_insert_threshold = 1000
);

INSERT INTO dw_schema_version (version, name) VALUES (5, 'waiters');
