-- dumbwaiter PostgreSQL schema, migration 0002: events.
--
-- The event log (every published event, kept event_retention for replay)
-- and the bindings of subscriber groups' queues to event types.  Publishing
-- logs an event once (a second publish of the same id is not delivered
-- again) and inserts one job per bound queue in the same transaction.

CREATE TABLE dw_events (
    id           uuid PRIMARY KEY,          -- the event's own id (UUIDv7)
    type         text NOT NULL,             -- domain.action
    published_at timestamptz NOT NULL DEFAULT now(),
    body         bytea NOT NULL             -- the envelope JSON as published
);
CREATE INDEX dw_events_type ON dw_events (type, id);
CREATE INDEX dw_events_age ON dw_events (published_at);

CREATE TABLE dw_bindings (
    pattern      text NOT NULL,             -- an event type
    queue        text NOT NULL,             -- a subscriber group's queue
    max_attempts integer NOT NULL,          -- the group's retry policy
    PRIMARY KEY (pattern, queue)
);

INSERT INTO dw_schema_version (version, name) VALUES (2, 'events');
