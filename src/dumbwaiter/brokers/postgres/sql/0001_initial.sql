-- dumbwaiter PostgreSQL schema, migration 0001: jobs, queues, locks, key-value.
--
-- Plain SQL, run in one transaction with search_path set to the target
-- schema: by `dumbwaiter migrate`, or by hand from an Alembic or Django
-- migration (see docs/postgres.md).  Table names are unqualified on purpose.
--
-- One table holds every job.  The states a worker polls (ready, scheduled,
-- running) each have a small partial index, so a claim or a rescue reads only
-- live rows however many finished rows are kept; finished rows get an
-- expires_at and are pruned after the retention window.

CREATE TABLE dw_schema_version (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE dw_jobs (
    id              uuid PRIMARY KEY,           -- UUIDv7 from the producer, time-ordered
    queue           text NOT NULL,
    name            text NOT NULL,              -- task name (or event type)
    kind            text NOT NULL,              -- task | event
    state           text NOT NULL DEFAULT 'ready' CHECK (state IN
                        ('scheduled', 'ready', 'running', 'succeeded', 'dead', 'cancelled')),
    priority        integer NOT NULL DEFAULT 0, -- higher runs first
    run_at          timestamptz NOT NULL DEFAULT now(), -- ready since / due at (eta, retry)
    updated_at      timestamptz NOT NULL DEFAULT now(), -- when it entered its state
    attempt         integer NOT NULL DEFAULT 0,
    max_attempts    integer NOT NULL,
    key             text,                       -- task uniqueness key
    lease_until     timestamptz,                -- running: the lease of the holder
    token           bigint,                     -- running: fencing token of the holder
    worker          text,                       -- the last worker that claimed it
    body            bytea NOT NULL,             -- the envelope JSON as enqueued
    errors          jsonb,                      -- one object per failed attempt
    last_error_type text,
    result          bytea,                      -- JSON {"value": ...} of keep_result tasks
    expires_at      timestamptz,                -- finished rows are pruned after this
    replays         integer NOT NULL DEFAULT 0
);

-- The claim: per queue, priority then FIFO.  Only ready rows are in it.
CREATE INDEX dw_jobs_ready ON dw_jobs (queue, priority DESC, run_at, id) WHERE state = 'ready';
-- Promotion of due scheduled jobs (eta, retries) and the next due time.
CREATE INDEX dw_jobs_scheduled ON dw_jobs (run_at) WHERE state = 'scheduled';
-- The rescue of expired leases.
CREATE INDEX dw_jobs_running ON dw_jobs (lease_until) WHERE state = 'running';
-- A task key is held by one stored job until that job is pruned.
CREATE UNIQUE INDEX dw_jobs_key ON dw_jobs (key) WHERE key IS NOT NULL;
-- Pruning of finished rows.
CREATE INDEX dw_jobs_expires ON dw_jobs (expires_at) WHERE expires_at IS NOT NULL;
-- The dead-letter queue, listed newest first.
CREATE INDEX dw_jobs_dead ON dw_jobs (queue, id) WHERE state = 'dead';

-- Every state change is a new row version; vacuum this table well before the
-- default fifth of it is dead, so the partial indexes above stay small, and
-- leave room in each page for the new versions of its rows.
ALTER TABLE dw_jobs SET (
    fillfactor = 85,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.05
);

CREATE TABLE dw_queues (
    name   text PRIMARY KEY,
    paused boolean NOT NULL DEFAULT false
);

-- Coordination: named leases with fencing tokens that grow with every change
-- of owner (the scheduler's leader, the maintenance leader).
CREATE SEQUENCE dw_fence;
CREATE TABLE dw_locks (
    name    text PRIMARY KEY,
    owner   text NOT NULL,
    token   bigint NOT NULL,
    expires timestamptz NOT NULL
);

-- Small shared state (schedules, workflow counters, kept results).
CREATE TABLE dw_kv (
    key     text PRIMARY KEY,
    value   bytea NOT NULL,
    expires timestamptz
);
CREATE INDEX dw_kv_expires ON dw_kv (expires) WHERE expires IS NOT NULL;

INSERT INTO dw_schema_version (version, name) VALUES (1, 'initial');
