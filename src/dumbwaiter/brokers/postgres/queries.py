"""Every SQL statement of the PostgreSQL broker, named, for one schema.

Statements are rendered once per broker with the schema's quoted name and
kept as bytes (psycopg sends bytes as they are).  Batches travel as arrays
and are spread with ``unnest``: one statement, one round trip and one plan
for any number of jobs.  Times are the server's clock (``now()``), so
workers on machines whose clocks disagree still agree on leases.

Every statement that makes jobs ready also sends ``NOTIFY`` (channel
``dumbwaiter:<schema>``, payload the queue's name) in its own transaction: the
notification arrives when the jobs become visible, never before.
"""

from __future__ import annotations

from ...errors import LeaseExpired

LEASE_EXPIRED = f"dumbwaiter.errors.{LeaseExpired.__name__}"

# Columns a claim returns, in the order ``_delivery`` reads them.
_CLAIMED = (
    "j.id::text, j.queue, j.attempt, j.body, j.errors::text, j.priority,"
    " date_part('epoch', j.run_at), date_part('epoch', j.lease_until)"
)
#: a batch of (id, token) pairs, sent as two comma-joined strings: one text
#: parameter each is far cheaper to send than a Python list dumped as an array
_PAIRS = "unnest(string_to_array(%(id)s, ',')::uuid[], string_to_array(%(token)s, ',')::int8[])"
_TAKE = (
    "state = 'running', attempt = j.attempt + 1, token = %(token)s,"
    " lease_until = now() + make_interval(secs => %(lease)s), worker = %(worker)s,"
    " updated_at = now()"
)
#: columns of ``JobInfo`` (read by sql/rows.py's ``info_row``)
INFO_COLS = (
    "id::text, queue, state, attempt, body, errors::text, date_part('epoch', run_at),"
    " date_part('epoch', updated_at), worker, date_part('epoch', lease_until), result, replays"
)


def _notify_ready(rows: str) -> str:
    """A SELECT that notifies once per queue of ``rows`` that has ready jobs."""
    return (
        "SELECT count(pg_notify(%(channel)s, q)) FROM"
        f" (SELECT DISTINCT queue FROM {rows} WHERE state = 'ready') AS x(q)"
    )


#: the columns of new job rows and the rows themselves, from one array a
#: column (an enqueue's and a publish's insert; the caller closes ``unnest``)
_NEW_ROWS = (
    " (id, queue, name, kind, state, priority, run_at, updated_at, max_attempts, key, msg_key,"
    " body)"
    " SELECT v.id, v.queue, v.name, v.kind,"
    " CASE WHEN v.eta > date_part('epoch', now()) THEN 'scheduled' ELSE 'ready' END,"
    " v.priority,"
    " CASE WHEN v.eta > date_part('epoch', now()) THEN to_timestamp(v.eta) ELSE now() END,"
    " now(), v.max_attempts, v.key, v.msg_key, v.body"
    " FROM unnest(%(id)s::uuid[], %(queue)s::text[], %(name)s::text[], %(kind)s::text[],"
    " %(priority)s::int4[], %(eta)s::float8[], %(max_attempts)s::int4[], %(key)s::text[],"
    " %(msg_key)s::text[], %(body)s::bytea[]"
)


class Queries:
    """The broker's statements for schema ``schema`` (rendered as bytes)."""

    def __init__(self, schema: str) -> None:
        s = '"' + schema.replace('"', '""') + '"'
        self.schema = schema
        #: NOTIFY/LISTEN channel of this schema
        self.channel = f"dumbwaiter:{schema}"
        jobs, queues = f"{s}.dw_jobs", f"{s}.dw_queues"

        def q(text: str) -> bytes:
            return text.encode()

        # -- transport -----------------------------------------------------
        self.enqueue = q(
            f"WITH ins AS (INSERT INTO {jobs}{_NEW_ROWS}) WITH ORDINALITY"
            " AS v(id, queue, name, kind, priority, eta, max_attempts, key, msg_key, body, ord)"
            " ORDER BY v.ord ON CONFLICT DO NOTHING RETURNING queue, state)"
            f" SELECT (SELECT count(*) FROM ins), ({_notify_ready('ins')})"
        )
        self.enqueue_one = q(
            f"WITH ins AS (INSERT INTO {jobs} (id, queue, name, kind, state, priority, run_at,"
            " updated_at, max_attempts, key, msg_key, body) VALUES (%(id)s::uuid, %(queue)s,"
            " %(name)s, %(kind)s, CASE WHEN %(eta)s::float8 > date_part('epoch', now())"
            " THEN 'scheduled' ELSE 'ready' END, %(priority)s,"
            " CASE WHEN %(eta)s::float8 > date_part('epoch', now())"
            " THEN to_timestamp(%(eta)s::float8) ELSE now() END, now(), %(max_attempts)s,"
            " %(key)s, %(msg_key)s, %(body)s) ON CONFLICT DO NOTHING RETURNING queue, state)"
            f" SELECT (SELECT count(*) FROM ins), ({_notify_ready('ins')})"
        )
        # One job that is ready now (no eta), the one-at-a-time producer's
        # usual call: the state, run_at and updated_at take their column
        # defaults ('ready', now(), now()) instead of two CASEs on the eta,
        # the parameters are positional (no dict to build and reorder on the
        # client) and the one inserted row is counted and notified in one
        # pass over it (docs/benchmarks-postgres.md, "25.1: what the server
        # does per enqueue").  Parameters: id, queue, name, kind, priority,
        # max_attempts, key, msg_key, body, channel.
        self.enqueue_ready = q(
            f"WITH ins AS (INSERT INTO {jobs} (id, queue, name, kind, priority, max_attempts,"
            " key, msg_key, body) VALUES (%s::uuid, %s, %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT DO NOTHING RETURNING queue)"
            " SELECT count(*), count(pg_notify(%s, queue)) FROM ins"
        )
        # The direct handoff (migration 0005): a ready job of a queue that has
        # no ready job (so priority and FIFO order hold) and is not paused
        # goes to a live waiter of that queue, if one is free: the waiter is
        # deleted, the job stored running for it (attempt 1, its token, lease
        # and worker) and sent to the waiter's channel, with the envelope, in
        # the NOTIFY (the caller keeps it under the 8,000-byte payload limit).
        # A job not stored (its id or key is held) sends the waiter its token
        # alone: it was handed nothing and claims instead.  No waiter: the
        # same row and NOTIFY as enqueue_one.  The caller's own short
        # transaction only: the waiter stays locked until commit.
        waiters = f"{s}.dw_waiters"

        def hand(gate: str = "") -> str:
            """The CTEs w, t, ins and the final SELECT of a handoff; ``gate``
            (an SQL condition) must hold for the waiter to be taken and the
            job stored (a publish: its event was logged)."""
            also = f" AND {gate}" if gate else ""
            where = f" WHERE {gate}" if gate else ""
            return (
                f"w AS (SELECT token, worker, lease, channel FROM {waiters}"
                " WHERE %(queue)s = ANY(queues) AND expires > statement_timestamp()"
                " AND coalesce(%(eta)s::float8 <= date_part('epoch', now()), true)"
                f" AND NOT EXISTS (SELECT 1 FROM {queues} p WHERE p.name = %(queue)s AND p.paused)"
                f" AND NOT EXISTS (SELECT 1 FROM {jobs} WHERE state = 'ready'"
                f" AND queue = %(queue)s){also} LIMIT 1 FOR UPDATE SKIP LOCKED),"
                f" t AS (DELETE FROM {waiters} x USING w WHERE x.token = w.token"
                " RETURNING w.token, w.worker, w.lease, w.channel),"
                f" ins AS (INSERT INTO {jobs} (id, queue, name, kind, state, priority, run_at,"
                " updated_at, max_attempts, key, msg_key, body, attempt, token, lease_until,"
                " worker) SELECT %(id)s::uuid, %(queue)s, %(name)s, %(kind)s,"
                " CASE WHEN t.token IS NOT NULL THEN 'running'"
                " WHEN %(eta)s::float8 > date_part('epoch', now()) THEN 'scheduled'"
                " ELSE 'ready' END, %(priority)s,"
                " CASE WHEN %(eta)s::float8 > date_part('epoch', now())"
                " THEN to_timestamp(%(eta)s::float8) ELSE now() END, now(), %(max_attempts)s,"
                " %(key)s, %(msg_key)s, %(body)s, CASE WHEN t.token IS NULL THEN 0 ELSE 1 END,"
                " t.token, now() + make_interval(secs => t.lease), t.worker FROM (SELECT) AS one"
                f" LEFT JOIN t ON true{where} ON CONFLICT DO NOTHING"
                " RETURNING id::text, queue, state, token, lease_until)"
                f" SELECT (SELECT count(*) FROM ins), ({_notify_ready('ins')}),"
                " (SELECT count(pg_notify(t.channel, CASE WHEN i.token IS NULL"
                " THEN json_build_array(t.token)::text ELSE json_build_array(t.token, i.id,"
                " i.queue, date_part('epoch', i.lease_until))::text"
                " || chr(10) || convert_from(%(body)s, 'UTF8') END))"
                " FROM t LEFT JOIN ins i ON true)"
            )

        self.enqueue_hand = q("WITH " + hand())
        # Bulk: ready jobs only (state, run_at and updated_at take their defaults).
        self.copy = q(
            f"COPY {jobs} (id, queue, name, kind, priority, max_attempts, key, msg_key, body)"
            " FROM STDIN (FORMAT BINARY)"
        )
        # Before a COPY, in its transaction: room in memory for the insert
        # trigger's transition table (migration 0004), which holds every copied
        # row (~450 bytes each) until the statement ends.  Past work_mem (4 MB
        # by default: ~9,000 jobs) it spills to a temporary file; 32 MB keeps
        # a batch of ~70,000 in memory.  A higher setting is left as it is.
        self.copy_memory = q(
            "SELECT set_config('work_mem', '32MB', true)"
            " WHERE pg_size_bytes(current_setting('work_mem')) < 32 * 1024 * 1024"
        )
        self.notify = q("SELECT count(pg_notify(%s, q)) FROM unnest(%s::text[]) AS x(q)")
        self.holders = q(f"SELECT key, id::text FROM {jobs} WHERE key = ANY(%s::text[])")
        self.add_queues = q(
            f"INSERT INTO {queues} (name) SELECT unnest(%s::text[]) ON CONFLICT DO NOTHING"
        )
        # A claim first promotes due scheduled jobs (an index probe when none
        # is due).  Promoted rows are not claimable by the same statement (one
        # snapshot); the count comes back so the caller claims again at once.
        promote = (
            f"p AS (UPDATE {jobs} SET state = 'ready' WHERE id IN (SELECT id FROM {jobs}"
            " WHERE state = 'scheduled' AND run_at <= now() ORDER BY run_at LIMIT 1000"
            " FOR UPDATE SKIP LOCKED) RETURNING 1)"
        )

        # With nothing claimed, one row of NULLs carries the promoted count and
        # the seconds until the next scheduled job of these queues is due.
        def claimed(queue_is: str) -> str:
            return (
                " SELECT c.*, (SELECT count(*) FROM p), NULL::float8 FROM c UNION ALL"
                " SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, (SELECT count(*) FROM p),"
                f" (SELECT date_part('epoch', min(run_at) - now()) FROM {jobs}"
                f" WHERE state = 'scheduled' AND queue {queue_is})"
                " WHERE NOT EXISTS (SELECT FROM c)"
            )

        # A claim may carry the worker's last finished batch (see
        # transport._ack_with_claim): one statement acks it and claims the
        # next.  The ack touches running rows and the claim ready ones, so the
        # two never meet.
        _settled = "lease_until = NULL, token = NULL, updated_at = now()"
        _held = "j.id = u.id AND j.token = u.token AND j.state = 'running'"
        _is_task = "j.kind = 'task'"

        # A task without keep_result keeps a compact record (finished.py):
        # its body shrinks to its task name, its error history goes.
        def _compact(when: str) -> str:
            return (
                f"body = CASE WHEN {when} THEN convert_to("
                '\'{"c":1,"name":\' || to_json(j.name)::text || \',"key":\''
                " || coalesce(to_json(j.msg_key)::text, 'null') || '}', 'UTF8') ELSE j.body END,"
                f" errors = CASE WHEN {when} THEN NULL ELSE j.errors END,"
                f" last_error_type = CASE WHEN {when} THEN NULL ELSE j.last_error_type END"
            )

        # An ack stores each job's record of its attempt (``result``: when it
        # started and finished, and the value of a task that keeps results;
        # the worker sends one with every success), alone or riding: one
        # statement either way, its parameters named ``prefix``... (the
        # records binary, ``%b``: a list of bytes dumped as text costs far
        # more; transport.py's ``_acks``).
        def ack(prefix: str) -> str:
            p = f"%({prefix}"
            return (
                f"UPDATE {jobs} j SET state = 'succeeded', {_settled},"
                f" {_compact('u.keep IS NULL AND ' + _is_task)},"
                " result = coalesce(u.result, j.result), expires_at = now()"
                " + make_interval(secs => greatest(%(retention)s, coalesce(u.keep, 0)))"
                f" FROM unnest(string_to_array({p}id)s, ',')::uuid[],"
                f" string_to_array({p}token)s, ',')::int8[], {p}result)b::bytea[],"
                f" string_to_array({p}keep)s, ',', '')::float8[])"
                f" AS u(id, token, result, keep) WHERE {_held}"
            )

        acked = f"a AS ({ack('ack_')}), "
        take_one = (
            f"{promote}, c AS (UPDATE {jobs} j SET {_TAKE} FROM (SELECT id FROM {jobs}"
            " WHERE state = 'ready' AND queue = %(queue)s"
            f" AND NOT EXISTS (SELECT 1 FROM {queues} p WHERE p.name = %(queue)s AND p.paused)"
            " ORDER BY priority DESC, run_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) c"
            f" WHERE j.id = c.id RETURNING {_CLAIMED})"
        )
        take_many = (
            f"{promote}, c AS (UPDATE {jobs} j SET {_TAKE} FROM (SELECT c.id FROM"
            " (SELECT name, ord FROM unnest(%(queues)s::text[]) WITH ORDINALITY AS q(name, ord)"
            f" WHERE NOT EXISTS (SELECT 1 FROM {queues} p WHERE p.name = q.name AND p.paused)"
            " ORDER BY ord) q"
            f" CROSS JOIN LATERAL (SELECT id FROM {jobs} WHERE state = 'ready'"
            " AND queue = q.name ORDER BY priority DESC, run_at, id LIMIT %(limit)s"
            " FOR UPDATE SKIP LOCKED) c LIMIT %(limit)s) c"
            f" WHERE j.id = c.id RETURNING {_CLAIMED})"
        )
        one_is, many_is = "= %(queue)s", "= ANY(%(queues)s::text[])"
        claim_one = take_one + claimed(one_is)
        claim_many = take_many + claimed(many_is)
        self.claim_one = q("WITH " + claim_one)
        self.claim_many = q("WITH " + claim_many)
        self.ack_claim_one = q("WITH " + acked + claim_one)
        self.ack_claim_many = q("WITH " + acked + claim_many)

        # The claim of a fetch that will wait (migration 0005, see
        # transport.py's fetch).  Besides claiming, one statement:
        # * settles the waits this process registered before (``mine``):
        #   a row it can lock was handed nothing and is deleted (``gone``);
        #   a row no longer in this snapshot was taken by a producer, whose
        #   job is adopted here (``h``: running with that token) in case its
        #   NOTIFY was lost; a row in the snapshot that it cannot lock is
        #   being taken right now (``busy``: settled by the NOTIFY or by a
        #   later claim).  ``h`` reads the running rows only when some wait
        #   was taken (a one-time filter), which is rare: the NOTIFY usually
        #   comes first and the wait is no longer in ``mine``.
        # * registers this fetch as a waiter (``r``) if it found nothing and
        #   will wait (``wait`` > 0), unless a handoff to it may be in flight.
        # Rows: the claimed and adopted jobs (the adopted with their token),
        # then one row of NULLs with the promoted count, the seconds until the
        # next scheduled job (when nothing came), whether it registered, and
        # the busy tokens (comma-joined).
        waiters = f"{s}.dw_waiters"
        mine = "string_to_array(%(mine)s, ',')::int8[]"

        def waiting(queue_is: str, registered_queues: str) -> str:
            return (
                f", m AS (SELECT token FROM {waiters} WHERE token = ANY({mine}))"
                f", gone AS (DELETE FROM {waiters} WHERE token IN (SELECT token FROM {waiters}"
                f" WHERE token = ANY({mine}) FOR UPDATE SKIP LOCKED) RETURNING token)"
                ", busy AS (SELECT token FROM m EXCEPT SELECT token FROM gone)"
                f", t AS (SELECT x FROM unnest({mine}) AS x EXCEPT SELECT token FROM m)"
                f", h AS (SELECT {_CLAIMED}, j.token FROM {jobs} j WHERE j.state = 'running'"
                " AND j.token IN (SELECT x FROM t) AND EXISTS (SELECT FROM t))"
                f", r AS (INSERT INTO {waiters} (token, queues, worker, lease, channel, expires)"
                f" SELECT %(token)s, {registered_queues}, %(worker)s, %(lease)s, %(channel)s,"
                " statement_timestamp() + make_interval(secs => %(wait)s::float8)"
                " WHERE %(wait)s::float8 > 0 AND NOT EXISTS (SELECT FROM c)"
                " AND NOT EXISTS (SELECT FROM h) AND NOT EXISTS (SELECT FROM p)"
                " AND NOT EXISTS (SELECT FROM busy) ON CONFLICT DO NOTHING RETURNING 1)"
                " SELECT c.*, NULL::int8, NULL::int8, NULL::float8, NULL::int8, NULL::text"
                " FROM c UNION ALL SELECT h.*, NULL, NULL, NULL, NULL FROM h UNION ALL"
                " SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,"
                " (SELECT count(*) FROM p),"
                " CASE WHEN EXISTS (SELECT FROM c) OR EXISTS (SELECT FROM h) THEN NULL ELSE"
                f" (SELECT date_part('epoch', min(run_at) - now()) FROM {jobs}"
                f" WHERE state = 'scheduled' AND queue {queue_is}) END,"
                " (SELECT count(*) FROM r), (SELECT string_agg(token::text, ',') FROM busy)"
            )

        wait_one = take_one + waiting(one_is, "ARRAY[%(queue)s]")
        wait_many = take_many + waiting(many_is, "%(queues)s::text[]")
        self.wait_one = q("WITH " + wait_one)
        self.wait_many = q("WITH " + wait_many)
        self.ack_wait_one = q("WITH " + acked + wait_one)
        self.ack_wait_many = q("WITH " + acked + wait_many)
        self.prune_waiters = q(
            f"DELETE FROM {waiters} WHERE expires < now() - make_interval(secs => %s)"
        )
        self.ack = q(ack(""))
        _record = (
            "errors = CASE WHEN u.err IS NULL THEN j.errors"
            " ELSE coalesce(j.errors, '[]'::jsonb) || jsonb_build_array(u.err) END,"
            " last_error_type = coalesce(u.etype, j.last_error_type)"
        )
        self.retry = q(
            f"WITH r AS (UPDATE {jobs} j SET"
            " state = CASE WHEN u.at > date_part('epoch', now()) THEN 'scheduled' ELSE 'ready' END,"
            f" run_at = greatest(to_timestamp(u.at), now()), {_record}, {_settled}"
            " FROM unnest(string_to_array(%(id)s, ',')::uuid[],"
            " string_to_array(%(token)s, ',')::int8[], %(at)s::float8[], %(err)s::jsonb[],"
            f" %(etype)s::text[]) AS u(id, token, at, err, etype) WHERE {_held}"
            f" RETURNING j.queue, j.state) {_notify_ready('r')}"
        )
        self.dead = q(
            f"UPDATE {jobs} j SET state = 'dead', {_record}, {_settled}, expires_at = NULL"
            " FROM unnest(string_to_array(%(id)s, ',')::uuid[],"
            " string_to_array(%(token)s, ',')::int8[], %(err)s::jsonb[], %(etype)s::text[])"
            f" AS u(id, token, err, etype) WHERE {_held}"
        )
        # given back uncharged: ready at once, or scheduled at u.at (a job held
        # back by a rate or concurrency limit)
        self.requeue = q(
            f"WITH r AS (UPDATE {jobs} j SET"
            " state = CASE WHEN u.at > date_part('epoch', now()) THEN 'scheduled' ELSE 'ready' END,"
            " attempt = greatest(j.attempt - 1, 0),"
            f" run_at = greatest(to_timestamp(u.at), now()), {_settled}"
            " FROM unnest(string_to_array(%(id)s, ',')::uuid[],"
            " string_to_array(%(token)s, ',')::int8[], %(at)s::float8[]) AS u(id, token, at)"
            f" WHERE {_held} RETURNING j.queue, j.state) {_notify_ready('r')}"
        )
        self.extend = q(
            f"UPDATE {jobs} j SET lease_until = now() + make_interval(secs => %(lease)s)"
            f" FROM {_PAIRS} AS u(id, token)"
            f" WHERE {_held} RETURNING j.id::text, date_part('epoch', j.lease_until)"
        )
        self.rescue = q(
            f"WITH x AS (SELECT id FROM {jobs} WHERE state = 'running' AND lease_until < now()"
            " ORDER BY lease_until LIMIT 1000 FOR UPDATE SKIP LOCKED),"
            f" r AS (UPDATE {jobs} j SET"
            " state = CASE WHEN j.attempt >= j.max_attempts THEN 'dead' ELSE 'ready' END,"
            " run_at = now(), updated_at = now(), lease_until = NULL, token = NULL,"
            " errors = coalesce(j.errors, '[]'::jsonb) || jsonb_build_array(jsonb_build_object("
            " 'time', date_part('epoch', now()), 'type', %(type)s::text,"
            " 'message', 'lease expired: worker ' || coalesce(nullif(j.worker, ''), '?')"
            " || ' stopped heartbeating during attempt ' || j.attempt,"
            " 'traceback', '', 'worker', coalesce(j.worker, ''), 'attempt', j.attempt)),"
            " last_error_type = %(type)s::text"
            " FROM x WHERE j.id = x.id AND j.state = 'running'"
            " RETURNING j.id, j.queue, j.name, j.state, j.errors -> -1 AS err, j.attempt,"
            # a buried job's envelope goes with its report (on_dead hooks log
            # its arguments); only those rare rows carry their body
            " CASE WHEN j.state = 'dead' THEN j.body END AS body, j.errors)"
            f" SELECT (SELECT count(*) FROM r), ({_notify_ready('r')}),"
            # the dead-lettered ones, for the worker's on_dead (none: NULL)
            " (SELECT json_agg(json_build_array(id::text, queue, name, err, attempt,"
            " encode(body, 'hex'), errors::text)) FROM r WHERE state = 'dead')"
        )
        self.prune_jobs = q(
            f"DELETE FROM {jobs} WHERE id IN (SELECT id FROM {jobs}"
            " WHERE expires_at < now() LIMIT %s)"
        )
        self.prune_kv = q(f"DELETE FROM {s}.dw_kv WHERE expires < now()")
        # A unique job ("unique" header) frees its key from a holder that no
        # longer blocks it: a finished one ("active"), or also a running one
        # ("queued").  Concurrent enqueuers of one key: the first frees it,
        # the insert's ON CONFLICT lets one of them in.
        self.free_keys = q(
            f"UPDATE {jobs} j SET key = NULL FROM unnest(%s::text[], %s::text[]) AS u(key, mode)"
            " WHERE j.key = u.key AND (j.state IN ('succeeded', 'dead', 'cancelled')"
            " OR (u.mode = 'queued' AND j.state = 'running'))"
        )

        # -- admin ---------------------------------------------------------
        self.queues = q(f"SELECT name, paused FROM {queues}")
        # Counts (migration 0004): the folded counters plus the deltas the
        # triggers wrote since, read in one snapshot, so always exact.  Folding
        # takes deltas with SKIP LOCKED and updates the counters in key order:
        # concurrent folders neither wait for each other nor deadlock.
        counts, deltas = f"{s}.dw_counts", f"{s}.dw_count_deltas"
        self.fold_counts = q(
            f"WITH d AS (DELETE FROM {deltas} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {deltas}"
            " LIMIT 100000 FOR UPDATE SKIP LOCKED)) RETURNING queue, state, n)"
            f" INSERT INTO {counts} AS c (queue, state, n)"
            " SELECT queue, state, sum(n) FROM d GROUP BY 1, 2 ORDER BY 1, 2"
            " ON CONFLICT (queue, state) DO UPDATE SET n = c.n + excluded.n"
        )
        self.prune_counts = q(f"DELETE FROM {counts} WHERE n = 0")
        self.counts = q(
            f"SELECT queue, state, sum(n)::int8 FROM (SELECT queue, state, n FROM {counts}"
            f" UNION ALL SELECT queue, state, n FROM {deltas}) AS x GROUP BY 1, 2"
        )
        # Bounded queues (capacity.py): producers of one queue take a lock of
        # the transaction, then count its waiting jobs exactly as above
        self.capacity_lock = q(
            "SELECT pg_advisory_xact_lock(hashtext(%s || q)) FROM unnest(%s::text[]) AS q"
        )
        self.waiting = q(
            f"SELECT queue, sum(n)::int8 FROM (SELECT queue, state, n FROM {counts}"
            f" UNION ALL SELECT queue, state, n FROM {deltas}) AS x"
            " WHERE queue = ANY(%s) AND state IN ('ready', 'scheduled', 'retrying')"
            " GROUP BY 1"
        )
        # The age of each queue's oldest ready job: the ready index is ordered
        # by priority first, so one probe per priority in use (a loose index
        # scan), never a read of the whole backlog.
        self.lags = q(
            f"SELECT q.name, date_part('epoch', now() - l.oldest) FROM {queues} q"
            " CROSS JOIN LATERAL (WITH RECURSIVE p(priority, run_at) AS ("
            f" (SELECT priority, run_at FROM {jobs} WHERE state = 'ready' AND queue = q.name"
            " ORDER BY priority DESC, run_at LIMIT 1) UNION ALL"
            " SELECT x.priority, x.run_at FROM p CROSS JOIN LATERAL"
            f" (SELECT priority, run_at FROM {jobs} WHERE state = 'ready' AND queue = q.name"
            " AND priority < p.priority ORDER BY priority DESC, run_at LIMIT 1) x)"
            " SELECT min(run_at) AS oldest FROM p) l WHERE l.oldest IS NOT NULL"
        )
        self.get = q(f"SELECT {INFO_COLS} FROM {jobs} WHERE id = %s::uuid")
        self.cancel = q(
            f"UPDATE {jobs} SET state = 'cancelled', updated_at = now(),"
            " expires_at = now() + make_interval(secs => %s)"
            " WHERE id = ANY(%s::uuid[]) AND state IN ('scheduled', 'ready') RETURNING id::text"
        )
        self.set_paused = q(
            f"WITH u AS (INSERT INTO {queues} (name, paused) VALUES (%(queue)s, %(paused)s)"
            " ON CONFLICT (name) DO UPDATE SET paused = excluded.paused RETURNING name)"
            " SELECT pg_notify(%(channel)s, name) FROM u WHERE NOT %(paused)s"
        )
        # list_jobs / replay / purge add a WHERE clause built by sql/filters.py
        self.list_prefix = f"SELECT {INFO_COLS} FROM {jobs} WHERE "
        # The table's uuid, qualified: a bare "id" here names the output column
        # id::text, whose order no index gives (every match would be sorted).
        self.list_suffix = f" ORDER BY {jobs}.id DESC LIMIT %s"
        self.replay_prefix = (
            f"WITH r AS (UPDATE {jobs} SET state = 'ready', attempt = 0, run_at = now(),"
            " updated_at = now(), replays = replays + 1, expires_at = NULL"
            " WHERE state = 'dead' AND "
        )
        self.replay_suffix = (
            f" RETURNING queue, state) SELECT (SELECT count(*) FROM r), ({_notify_ready('r')})"
        )
        self.purge_prefix = f"DELETE FROM {jobs} WHERE state <> 'running' AND "
        self.reschedule = q(
            f"WITH r AS (UPDATE {jobs} SET"
            " state = CASE WHEN %(at)s::float8 > date_part('epoch', now()) THEN 'scheduled'"
            " ELSE 'ready' END, run_at = greatest(to_timestamp(%(at)s::float8), now()),"
            " updated_at = now() WHERE id = ANY(%(ids)s::uuid[])"
            " AND state IN ('scheduled', 'ready') RETURNING id::text, queue, state)"
            f" SELECT id, ({_notify_ready('r')}) FROM r"
        )

        # -- events --------------------------------------------------------
        events, bindings = f"{s}.dw_events", f"{s}.dw_bindings"
        self.bindings_of = q(
            f"SELECT pattern, queue, max_attempts FROM {bindings} WHERE pattern = ANY(%s::text[])"
        )
        # A publish in one statement (enqueue.py's _fan_out_plan): the
        # producer sends the events, the bindings of their types it believes
        # in (``b_*``, its cache) and the jobs those make (one per event and
        # bound queue, ``event`` naming the event of each).  ``ok``: the
        # bindings stored for these types, in this statement's snapshot, are
        # exactly those; only then are the events logged (a stored id is
        # skipped) and the jobs of the logged ones stored, with their NOTIFY.
        # Not ok: nothing is written, the producer reads the bindings again
        # and sends the statement again.  The bindings live in the database,
        # so a process's stale cache costs one more round trip, never a wrong
        # delivery.  Rows: jobs stored, queues notified, waiters handed
        # (publish_hand), ok.
        expected = "unnest(%(b_pattern)s::text[], %(b_queue)s::text[], %(b_attempts)s::int4[])"
        stored = (
            f"SELECT pattern, queue, max_attempts FROM {bindings}"
            " WHERE pattern = ANY(%(types)s::text[])"
        )
        logged = (
            f"ok AS (SELECT NOT EXISTS (({stored} EXCEPT SELECT * FROM {expected})"
            f" UNION ALL (SELECT * FROM {expected} EXCEPT {stored})) AS ok),"
            f" ev AS (INSERT INTO {events} (id, type, body) SELECT * FROM unnest(%(ev_id)s::uuid[],"
            " %(ev_type)s::text[], %(ev_body)s::bytea[]) WHERE (SELECT ok FROM ok)"
            " ON CONFLICT DO NOTHING RETURNING id), "
        )
        # One event of a type bound to one queue (the usual publish): the
        # same statement with scalar parameters, as enqueue_one is to
        # enqueue.  psycopg dumps each list parameter element by element in
        # Python (about twenty arrays for one event), which cost a
        # one-at-a-time publisher more than the round trip's own CPU.
        one_binding = "SELECT %(b_pattern)s::text, %(b_queue)s::text, %(b_attempts)s::int4"
        stored_one = (
            f"SELECT pattern, queue, max_attempts FROM {bindings} WHERE pattern = %(ev_type)s"
        )
        logged_one = (
            f"ok AS (SELECT NOT EXISTS (({stored_one} EXCEPT {one_binding})"
            f" UNION ALL ({one_binding} EXCEPT {stored_one})) AS ok),"
            f" ev AS (INSERT INTO {events} (id, type, body) SELECT %(ev_id)s::uuid, %(ev_type)s,"
            " %(ev_body)s WHERE (SELECT ok FROM ok) ON CONFLICT DO NOTHING RETURNING id), "
        )
        self.publish_one = q(
            f"WITH {logged_one}ins AS (INSERT INTO {jobs} (id, queue, name, kind, state,"
            " priority, run_at, updated_at, max_attempts, key, msg_key, body)"
            " SELECT %(id)s::uuid, %(queue)s, %(name)s, %(kind)s,"
            " CASE WHEN %(eta)s::float8 > date_part('epoch', now()) THEN 'scheduled'"
            " ELSE 'ready' END, %(priority)s,"
            " CASE WHEN %(eta)s::float8 > date_part('epoch', now())"
            " THEN to_timestamp(%(eta)s::float8) ELSE now() END, now(), %(max_attempts)s,"
            " %(key)s, %(msg_key)s, %(body)s FROM ev ON CONFLICT DO NOTHING"
            " RETURNING queue, state)"
            f" SELECT (SELECT count(*) FROM ins), ({_notify_ready('ins')}), 0::int8,"
            " (SELECT ok FROM ok)"
        )
        self.publish = q(
            f"WITH {logged}ins AS (INSERT INTO {jobs}{_NEW_ROWS}, %(event)s::uuid[])"
            " WITH ORDINALITY"
            " AS v(id, queue, name, kind, priority, eta, max_attempts, key, msg_key, body, event,"
            " ord) WHERE v.event IN (SELECT id FROM ev)"
            " ORDER BY v.ord ON CONFLICT DO NOTHING RETURNING queue, state)"
            f" SELECT (SELECT count(*) FROM ins), ({_notify_ready('ins')}), 0::int8,"
            " (SELECT ok FROM ok)"
        )
        # One event, one bound queue: its job may go straight to a waiter
        # (enqueue_hand), if the event was logged.
        self.publish_hand = q(
            f"WITH {logged}" + hand("EXISTS (SELECT FROM ev)") + ", (SELECT ok FROM ok)"
        )
        self.publish_hand_one = q(
            f"WITH {logged_one}" + hand("EXISTS (SELECT FROM ev)") + ", (SELECT ok FROM ok)"
        )
        self.bind = q(
            f"INSERT INTO {bindings} (pattern, queue, max_attempts) SELECT * FROM"
            " unnest(%s::text[], %s::text[], %s::int4[]) ON CONFLICT (pattern, queue)"
            " DO UPDATE SET max_attempts = excluded.max_attempts"
        )
        self.list_events = q(
            f"SELECT id::text, body FROM {events} WHERE type = %(type)s AND id > %(after)s::uuid"
            " AND (%(since)s::float8 IS NULL OR published_at >= to_timestamp(%(since)s::float8))"
            " AND (%(until)s::float8 IS NULL OR published_at <= to_timestamp(%(until)s::float8))"
            f" ORDER BY {events}.id LIMIT %(limit)s"  # the uuid, not the text output column
        )
        self.prune_events = q(
            f"DELETE FROM {events} WHERE id IN (SELECT id FROM {events}"
            " WHERE published_at < now() - make_interval(secs => %s) LIMIT %s)"
        )

        # -- coordination --------------------------------------------------
        locks = f"{s}.dw_locks"
        self.acquire = q(
            f"INSERT INTO {locks} AS l (name, owner, token, expires)"
            f" VALUES (%(name)s, %(owner)s, nextval('{s}.dw_fence'),"
            " now() + make_interval(secs => %(ttl)s))"
            " ON CONFLICT (name) DO UPDATE SET owner = excluded.owner,"
            " token = CASE WHEN l.owner = excluded.owner AND l.expires > now() THEN l.token"
            " ELSE excluded.token END, expires = excluded.expires"
            " WHERE l.owner = excluded.owner OR l.expires <= now() RETURNING token"
        )
        self.renew = q(
            f"UPDATE {locks} SET expires = now() + make_interval(secs => %(ttl)s)"
            " WHERE name = %(name)s AND owner = %(owner)s AND token = %(token)s AND expires > now()"
        )
        self.release = q(
            f"DELETE FROM {locks} WHERE name = %(name)s AND owner = %(owner)s AND token = %(token)s"
        )
        # -- flow control (migration 0003: the functions lock the key's row) ----
        slots = f"{s}.dw_slots"
        self.rate_take = q(f"SELECT {s}.dw_rate_take(%s, %s, %s, %s)")
        self.slot_acquire = q(f"SELECT {s}.dw_slot_acquire(%s, %s, %s, %s)")
        _holds = "unnest(%(keys)s::text[], %(holders)s::text[]) AS u(key, holder)"
        self.slot_extend = q(
            f"UPDATE {slots} s SET expires = now() + make_interval(secs => %(ttl)s::float8)"
            f" FROM {_holds} WHERE s.key = u.key AND s.holder = u.holder"
        )
        self.slot_release = q(
            f"DELETE FROM {slots} s USING {_holds} WHERE s.key = u.key AND s.holder = u.holder"
        )
        # Maintenance.  A key is pruned with its permits once its latest permit
        # is two windows old (plus a minute for workers' clocks); a take of it
        # updates its row first, so a prune never races a new permit.  Holds
        # are kept a minute past their expiry (a late heartbeat revives one).
        self.prune_rate = q(
            f"WITH k AS (DELETE FROM {s}.dw_rate_keys WHERE expires < date_part('epoch', now())"
            f" - 60 RETURNING key) DELETE FROM {s}.dw_rate WHERE key IN (SELECT key FROM k)"
        )
        self.prune_slots = q(
            f"WITH d AS (DELETE FROM {slots} WHERE expires < now() - interval '60 seconds')"
            f" DELETE FROM {s}.dw_slot_keys k"
            f" WHERE NOT EXISTS (SELECT FROM {slots} h WHERE h.key = k.key)"
        )
        kv = f"{s}.dw_kv"
        _live = "(expires IS NULL OR expires > now())"
        _expires = (
            "CASE WHEN %(ttl)s::float8 IS NULL THEN NULL"
            " ELSE now() + make_interval(secs => %(ttl)s::float8) END"
        )
        self.kv_get = q(f"SELECT key, value FROM {kv} WHERE key = ANY(%s::text[]) AND {_live}")
        self.kv_set = q(
            f"INSERT INTO {kv} (key, value, expires) SELECT k, v, {_expires}"
            " FROM unnest(%(keys)s::text[], %(values)s::bytea[]) AS u(k, v)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires = excluded.expires"
        )
        self.kv_add = q(
            f"INSERT INTO {kv} AS t (key, value, expires) VALUES (%(key)s, %(value)s, {_expires})"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires = excluded.expires"
            " WHERE t.expires IS NOT NULL AND t.expires <= now() RETURNING 1"
        )
        self.kv_incr = q(
            f"INSERT INTO {kv} AS t (key, value, expires)"
            f" VALUES (%(key)s, convert_to(%(amount)s::int8::text, 'UTF8'), {_expires})"
            " ON CONFLICT (key) DO UPDATE SET"
            " value = convert_to((CASE WHEN t.expires IS NOT NULL AND t.expires <= now() THEN 0"
            " ELSE convert_from(t.value, 'UTF8')::int8 END + %(amount)s::int8)::text, 'UTF8'),"
            " expires = CASE WHEN t.expires IS NOT NULL AND t.expires <= now()"
            " THEN excluded.expires ELSE t.expires END"
            " RETURNING convert_from(value, 'UTF8')::int8"
        )
        self.kv_delete = q(
            f"WITH d AS (DELETE FROM {kv} WHERE key = ANY(%s::text[]) RETURNING expires)"
            f" SELECT count(*) FILTER (WHERE {_live}) FROM d"
        )
        self.kv_scan = q(f"SELECT key, value FROM {kv} WHERE starts_with(key, %s) AND {_live}")
        # kv_update, in one transaction: an advisory lock per key (in the
        # order given: sorted, so two updates never deadlock; absent keys are
        # locked too), then the rows, locked against plain writers, expired
        # ones included (a live flag says which count)
        self.kv_lock = q("SELECT pg_advisory_xact_lock(%s::int4, x) FROM unnest(%s::int4[]) AS x")
        self.kv_read_locked = q(
            f"SELECT key, value, {_live} FROM {kv} WHERE key = ANY(%s::text[])"
            " ORDER BY key FOR UPDATE"
        )
        # writes, each with its ttl (NULL: no expiry); a key that had no row
        # when read is only inserted (a plain writer that created it since
        # leaves it updated by nobody: the row count tells, and the update
        # runs again)
        self.kv_write_locked = q(
            f"INSERT INTO {kv} AS t (key, value, expires)"
            " SELECT k, v, CASE WHEN x IS NULL THEN NULL ELSE now() + make_interval(secs => x) END"
            " FROM unnest(%(keys)s::text[], %(values)s::bytea[], %(ttls)s::float8[]) AS u(k, v, x)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires = excluded.expires"
            " WHERE NOT (t.key = ANY(%(fresh)s::text[]))"
        )
