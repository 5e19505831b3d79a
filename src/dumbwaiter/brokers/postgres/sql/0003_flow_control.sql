-- dumbwaiter PostgreSQL schema, migration 0003: flow control, and who we are.
--
-- Rate limits keep a log of permits per key (a sliding window, exact); a
-- concurrency limit keeps one row per hold.  Both are taken by a function,
-- one round trip each, that first locks the key's row in dw_rate_keys or
-- dw_slot_keys: takers of one key run one after the other, takers of other
-- keys do not wait, and every statement after the lock reads what the
-- previous holder of the lock committed (READ COMMITTED takes a snapshot per
-- statement), so no permit and no slot is ever given twice.
--
-- dw_instance holds a random id made once per database: the transactional
-- outbox compares it (with the database's name and, where it may be read,
-- the cluster's system identifier) to tell that the caller's connection is
-- to the broker's own database.

CREATE TABLE dw_instance (
    id         text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO dw_instance (id) VALUES (md5(random()::text || clock_timestamp()::text || pg_backend_pid()::text));

-- One row per rate-limited key: its lock, and until when its permits matter
-- (the latest permit plus two windows; the maintenance leader prunes keys
-- past it, with their permits).  Updated at every take: room for HOT updates.
CREATE TABLE dw_rate_keys (
    key     text PRIMARY KEY,
    expires double precision NOT NULL      -- epoch seconds
) WITH (fillfactor = 50);

-- The permits given: their start times, stamped by the workers (epoch seconds).
CREATE TABLE dw_rate (
    key text NOT NULL,
    t   double precision NOT NULL
);
CREATE INDEX dw_rate_key ON dw_rate (key, t);

-- One row per concurrency-limited key (its lock), and one per hold.
CREATE TABLE dw_slot_keys (
    key text PRIMARY KEY
);
CREATE TABLE dw_slots (
    key     text NOT NULL,
    holder  text NOT NULL,
    expires timestamptz NOT NULL,
    PRIMARY KEY (key, holder)
);
CREATE INDEX dw_slots_expires ON dw_slots (expires);

-- Take the permit of p_key stamped p_at if, with it, no window of p_per
-- seconds holds more than p_rate permits; return 0 if taken, else the seconds
-- until one would be (taking nothing).  The rule is flow.window_wait's, step
-- for step: permits may come out of order, so every window holding p_at is
-- checked (those ending at p_at and at each later permit).
CREATE FUNCTION dw_rate_take(p_key text, p_rate integer, p_per double precision,
                             p_at double precision)
RETURNS double precision
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    near double precision[];
    n    integer;
    hi   integer := 0;   -- permits of near at or before x
    lo   integer := 0;   -- permits of near at or before x - p_per
    nb   integer := 0;   -- permits of near before p_at
    x    double precision := p_at;
BEGIN
    LOOP  -- lock the key's row (make it first if it is new)
        UPDATE dw_rate_keys SET expires = greatest(expires, p_at + 2 * p_per)
        WHERE key = p_key;
        EXIT WHEN FOUND;
        INSERT INTO dw_rate_keys (key, expires) VALUES (p_key, p_at + 2 * p_per)
        ON CONFLICT DO NOTHING;
    END LOOP;
    DELETE FROM dw_rate WHERE key = p_key AND t <= p_at - 2 * p_per;
    SELECT coalesce(array_agg(t ORDER BY t), '{}') INTO near FROM dw_rate
    WHERE key = p_key AND t > p_at - p_per AND t < p_at + p_per;
    n := cardinality(near);
    LOOP  -- the windows (x - p_per, x] for x = p_at, then each later permit
        WHILE hi < n AND near[hi + 1] <= x LOOP
            hi := hi + 1;
        END LOOP;
        WHILE lo < n AND near[lo + 1] <= x - p_per LOOP
            lo := lo + 1;
        END LOOP;
        IF hi - lo + 1 > p_rate THEN  -- over the limit: how long until a permit
            WHILE nb < n AND near[nb + 1] < p_at LOOP
                nb := nb + 1;
            END LOOP;
            IF nb >= p_rate THEN  -- the usual case: the oldest must leave the window
                RETURN greatest(near[nb - p_rate + 1] + p_per - p_at, 1e-6);
            END IF;
            RETURN p_per / p_rate;
        END IF;
        EXIT WHEN hi >= n;
        x := near[hi + 1];
    END LOOP;
    INSERT INTO dw_rate (key, t) VALUES (p_key, p_at);
    RETURN 0;
END
$$;

-- Take one of p_limit slots of p_key for p_holder until now + p_ttl seconds;
-- true if taken or already held by p_holder (then its expiry moves).  Expired
-- holds are dropped first: a crashed worker's hold frees itself.
CREATE FUNCTION dw_slot_acquire(p_key text, p_limit integer, p_holder text,
                                p_ttl double precision)
RETURNS boolean
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    held integer;
BEGIN
    LOOP  -- lock the key's row (make it first if it is new)
        PERFORM FROM dw_slot_keys WHERE key = p_key FOR UPDATE;
        EXIT WHEN FOUND;
        INSERT INTO dw_slot_keys (key) VALUES (p_key) ON CONFLICT DO NOTHING;
    END LOOP;
    DELETE FROM dw_slots WHERE key = p_key AND expires <= now();
    UPDATE dw_slots SET expires = now() + make_interval(secs => p_ttl)
    WHERE key = p_key AND holder = p_holder;
    IF FOUND THEN
        RETURN true;
    END IF;
    SELECT count(*) INTO held FROM dw_slots WHERE key = p_key;
    IF held >= p_limit THEN
        RETURN false;
    END IF;
    INSERT INTO dw_slots (key, holder, expires)
    VALUES (p_key, p_holder, now() + make_interval(secs => p_ttl));
    RETURN true;
END
$$;

INSERT INTO dw_schema_version (version, name) VALUES (3, 'flow_control');
