"""The SQLite ack's SQL alone (20,000 running jobs, acked 32 a transaction),
four ways of keeping ``dw_counts``: the update trigger per row (``trigger``,
run with the sources of a commit whose trigger counts acks), or the broker
per batch: ``executemany`` per queue summing ``rowcount`` (``grouped``), one
``execute`` per job (``perrow``), one ``UPDATE ... FROM (VALUES ...)
RETURNING queue`` (``values``).  CPU a job of the calling thread.

    python benchmarks/sqlite_ack_counts.py SRC WAYS ROUNDS
    python benchmarks/sqlite_ack_counts.py /tmp/old/src trigger 5
    python benchmarks/sqlite_ack_counts.py src grouped,perrow,values 5
"""

# ruff: noqa
import os
import sqlite3
import statistics
import sys
import time
from collections import Counter

sys.path.insert(0, sys.argv[1])
from dumbwaiter.brokers.sqlite.schema import apply_schema

_ACK = (
    "UPDATE dw_jobs SET state='succeeded', updated_at=?1, result=?2, expires_at=?3,"
    " lease_until=NULL, token=NULL,"
    ' body=CASE WHEN ?4 THEN CAST(\'{"c":1,"name":\' || json_quote(name)'
    " || ',\"key\":' || json_quote(msg_key) || '}' AS BLOB)"
    " ELSE body END,"
    " errors=CASE WHEN ?4 THEN NULL ELSE errors END,"
    " last_error_type=CASE WHEN ?4 THEN NULL ELSE last_error_type END"
    " WHERE id=?5 AND token=?6 AND state='running'"
)

N, B = 20000, 32


def setup(path):
    for s in ("", "-wal", "-shm"):
        try:
            os.unlink(path + s)
        except FileNotFoundError:
            pass
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("PRAGMA synchronous=NORMAL")
    c.execute("BEGIN")
    apply_schema(c, path)
    now = time.time()
    c.executemany(
        "INSERT INTO dw_jobs (id,queue,name,kind,state,priority,run_at,updated_at,max_attempts,body,token,attempt)"
        " VALUES (?, 'default', 'noop', 'task', 'running', 0, ?, ?, 3, ?, 7, 1)",
        [(f"{i:012d}", now, now, b'{"x":1}') for i in range(N)],
    )
    c.execute("INSERT INTO dw_counts VALUES ('default','running',?)", (N,))
    c.execute("COMMIT")
    return c


COUNT = (
    "INSERT INTO dw_counts (queue, state, n) VALUES (?1, 'running', -?2), (?1, 'succeeded', ?2)"
    " ON CONFLICT (queue, state) DO UPDATE SET n = n + excluded.n"
)


def trig(c, rows):  # old: executemany, the trigger counts
    c.executemany(_ACK, [r[:6] for r in rows])


def grouped(c, rows):  # executemany per queue, rowcount summed
    by = {}
    for r in rows:
        by.setdefault(r[6], []).append(r[:6])
    for q, rs in by.items():
        n = c.executemany(_ACK, rs).rowcount
        if n:
            c.execute(COUNT, (q, n))


def perrow(c, rows):
    k = Counter()
    for r in rows:
        k[r[6]] += c.execute(_ACK, r[:6]).rowcount
    for q, n in k.items():
        if n:
            c.execute(COUNT, (q, n))


def values(c, rows):
    vals = ",".join(["(?,?,?,?,?,?)"] * len(rows))
    sql = (
        "UPDATE dw_jobs SET state='succeeded', updated_at=v.column1, result=v.column2, expires_at=v.column3,"
        " lease_until=NULL, token=NULL,"
        ' body=CASE WHEN v.column4 THEN CAST(\'{"c":1,"name":\' || json_quote(name)'
        " || ',\"key\":' || json_quote(msg_key) || '}' AS BLOB) ELSE body END,"
        " errors=CASE WHEN v.column4 THEN NULL ELSE errors END,"
        " last_error_type=CASE WHEN v.column4 THEN NULL ELSE last_error_type END"
        f" FROM (VALUES {vals}) AS v WHERE dw_jobs.id=v.column5 AND dw_jobs.token=v.column6"
        " AND dw_jobs.state='running' RETURNING queue"
    )
    k = Counter(q for (q,) in c.execute(sql, [x for r in rows for x in r[:6]]).fetchall())
    for q, n in k.items():
        c.execute(COUNT, (q, n))


def run(fn, path):
    c = setup(path)
    now = time.time()
    t = time.thread_time()
    for s in range(0, N, B):
        rows = [(now, None, now + 3600, 1, f"{i:012d}", 7, "default") for i in range(s, s + B)]
        c.execute("BEGIN IMMEDIATE")
        fn(c, rows)
        c.execute("COMMIT")
    dt = (time.thread_time() - t) / N * 1e6
    got = dict(c.execute("SELECT state, n FROM dw_counts WHERE n != 0").fetchall())
    real = dict(c.execute("SELECT state, count(*) FROM dw_jobs GROUP BY state").fetchall())
    c.close()
    return dt, got, real


fns = {"trigger": trig, "grouped": grouped, "perrow": perrow, "values": values}
which = sys.argv[2].split(",")
res = {k: [] for k in which}
for rnd in range(int(sys.argv[3])):
    for k in which:
        dt, got, real = run(fns[k], "/tmp/sqlc/ack.db")
        res[k].append(dt)
for k, v in res.items():
    print(
        f"{k:8s} us/job CPU median {statistics.median(v):.2f}  range {min(v):.2f}-{max(v):.2f}  counts {got if k != 'trigger' else ''}"
    )
print("real", real)
