-- dumbwaiter SQLite schema, version 2 (schema.py refuses any other).
-- One table of jobs; each state the worker polls has a small partial index,
-- so the rows a fetch looks at stay few however many finished jobs are kept.
--
-- Every statement is safe to run again: the broker runs this file whenever it
-- opens a database, in one transaction.

CREATE TABLE IF NOT EXISTS dw_jobs (
    id              TEXT PRIMARY KEY,          -- UUIDv7, time-ordered
    queue           TEXT NOT NULL,
    name            TEXT NOT NULL,
    kind            TEXT NOT NULL,             -- task | event
    state           TEXT NOT NULL,             -- scheduled | ready | running | succeeded | dead | cancelled
    priority        INTEGER NOT NULL DEFAULT 0,
    run_at          REAL NOT NULL,             -- ready since / ready at (eta, next retry)
    updated_at      REAL NOT NULL,             -- when it entered its state
    attempt         INTEGER NOT NULL DEFAULT 0,
    max_attempts    INTEGER NOT NULL,
    key             TEXT,                      -- task uniqueness key while held (NULL for events)
    lease_until     REAL,
    token           INTEGER,                   -- lease fencing token of the current holder
    worker          TEXT,
    body            BLOB NOT NULL,             -- the envelope JSON as enqueued
    errors          TEXT,                      -- JSON array, one entry per failed attempt
    last_error_type TEXT,
    result          BLOB,
    expires_at      REAL,                      -- finished rows are pruned after this
    replays         INTEGER NOT NULL DEFAULT 0,
    msg_key         TEXT                       -- Message.key of every job, never freed (key search)
);

CREATE INDEX IF NOT EXISTS dw_jobs_ready ON dw_jobs (queue, priority DESC, run_at) WHERE state = 'ready';
CREATE INDEX IF NOT EXISTS dw_jobs_scheduled ON dw_jobs (run_at) WHERE state = 'scheduled';
-- the age of the oldest ready job (lag) without reading every ready job
CREATE INDEX IF NOT EXISTS dw_jobs_ready_age ON dw_jobs (queue, run_at) WHERE state = 'ready';
CREATE INDEX IF NOT EXISTS dw_jobs_running ON dw_jobs (lease_until) WHERE state = 'running';
CREATE UNIQUE INDEX IF NOT EXISTS dw_jobs_key ON dw_jobs (key) WHERE key IS NOT NULL;
CREATE INDEX IF NOT EXISTS dw_jobs_expires ON dw_jobs (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS dw_jobs_queue_state ON dw_jobs (queue, state, id);

-- Job counts per queue and state, so stats never count rows (a million
-- finished jobs cost nothing).  "retrying" is a scheduled job that has
-- already run.  They must stay exact (a bounded queue's max_ready reads them):
-- * inserts are counted by the broker from INSERT ... RETURNING, once per
--   batch (a trigger per inserted row halved bulk enqueue);
-- * the claim (ready -> running) and the ack (running -> succeeded) are
--   counted by the broker, once per batch, in their own transaction
--   (transport.py; a trigger per row cost them about a quarter of their SQL);
--   nothing else makes those two moves;
-- * every other change, and every delete, is counted by the triggers below.
CREATE TABLE IF NOT EXISTS dw_counts (
    queue TEXT NOT NULL,
    state TEXT NOT NULL,
    n     INTEGER NOT NULL,
    PRIMARY KEY (queue, state)
) WITHOUT ROWID;

DROP TRIGGER IF EXISTS dw_jobs_count_insert;  -- inserts are counted by the broker (RETURNING)
-- the update trigger that also counted claims and acks: replaced (under a new
-- name, so that this file stays a no-op on a database that already has it)
DROP TRIGGER IF EXISTS dw_jobs_count_update;

CREATE TRIGGER IF NOT EXISTS dw_jobs_count_delete AFTER DELETE ON dw_jobs BEGIN
    UPDATE dw_counts SET n = n - 1
    WHERE queue = OLD.queue AND state = CASE WHEN OLD.state = 'scheduled' AND OLD.attempt > 0
                                             THEN 'retrying' ELSE OLD.state END;
END;

CREATE TRIGGER IF NOT EXISTS dw_jobs_count_change AFTER UPDATE OF state, attempt, queue ON dw_jobs
WHEN (OLD.queue != NEW.queue OR OLD.state != NEW.state
      OR (NEW.state = 'scheduled' AND (OLD.attempt > 0) != (NEW.attempt > 0)))
     AND NOT (OLD.queue = NEW.queue
              AND ((OLD.state = 'ready' AND NEW.state = 'running')
                   OR (OLD.state = 'running' AND NEW.state = 'succeeded'))) BEGIN
    UPDATE dw_counts SET n = n - 1
    WHERE queue = OLD.queue AND state = CASE WHEN OLD.state = 'scheduled' AND OLD.attempt > 0
                                             THEN 'retrying' ELSE OLD.state END;
    INSERT INTO dw_counts (queue, state, n)
    VALUES (NEW.queue, CASE WHEN NEW.state = 'scheduled' AND NEW.attempt > 0
                            THEN 'retrying' ELSE NEW.state END, 1)
    ON CONFLICT (queue, state) DO UPDATE SET n = n + 1;
END;

CREATE TABLE IF NOT EXISTS dw_queues (
    name   TEXT PRIMARY KEY,
    paused INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE IF NOT EXISTS dw_locks (
    name    TEXT PRIMARY KEY,
    owner   TEXT NOT NULL,
    token   INTEGER NOT NULL,
    expires REAL NOT NULL
);

-- Events: the log (kept for event_retention, for replay) and the bindings
-- of subscriber groups' queues to event types.
CREATE TABLE IF NOT EXISTS dw_events (
    id           TEXT PRIMARY KEY,
    type         TEXT NOT NULL,
    published_at REAL NOT NULL,
    body         BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS dw_events_type ON dw_events (type, id);
CREATE INDEX IF NOT EXISTS dw_events_age ON dw_events (published_at);

CREATE TABLE IF NOT EXISTS dw_bindings (
    pattern      TEXT NOT NULL,
    queue        TEXT NOT NULL,
    max_attempts INTEGER NOT NULL,
    PRIMARY KEY (pattern, queue)
);

CREATE TABLE IF NOT EXISTS dw_kv (
    key     TEXT PRIMARY KEY,
    value   BLOB NOT NULL,
    expires REAL
);
CREATE INDEX IF NOT EXISTS dw_kv_expires ON dw_kv (expires) WHERE expires IS NOT NULL;

-- Flow control: the sliding-window log of rate limits, and concurrency slots.
CREATE TABLE IF NOT EXISTS dw_rate (
    key TEXT NOT NULL,
    t   REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS dw_rate_key ON dw_rate (key, t);

CREATE TABLE IF NOT EXISTS dw_slots (
    key     TEXT NOT NULL,
    holder  TEXT NOT NULL,
    expires REAL NOT NULL,
    PRIMARY KEY (key, holder)
);

CREATE TABLE IF NOT EXISTS dw_meta (
    k TEXT PRIMARY KEY,
    v
);

INSERT OR IGNORE INTO dw_meta (k, v) VALUES ('schema_version', 2);
INSERT OR IGNORE INTO dw_meta (k, v) VALUES ('fence', 0);


-- Search by key (JobFilter.key): msg_key is the job's Message.key, written at
-- enqueue for tasks and event deliveries alike and never freed (unlike key,
-- which a newer unique job takes over), so a key search is one probe of this
-- index, in id order.  Partial: most jobs have no key and cost it nothing.
CREATE INDEX IF NOT EXISTS dw_jobs_msg_key ON dw_jobs (msg_key, id) WHERE msg_key IS NOT NULL;
