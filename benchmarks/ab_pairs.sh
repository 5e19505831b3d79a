#!/usr/bin/env bash
# Paired, alternated A/B runs of two commits in the peers harness, in one
# hold of the benchmark lock (take it around this script):
#
#   flock /tmp/dw-bench.lock benchmarks/ab_pairs.sh BASE_COMMIT NEW_COMMIT [OUT]
#   PAIRS=4 LIBS="dumbwaiter-redis" WORKLOADS="W4" flock /tmp/dw-bench.lock benchmarks/ab_pairs.sh af01834 HEAD
#   PAIRS=6 LIBS=dumbwaiter-redis WORKLOADS=W2 PEERS=rq-simple flock /tmp/dw-bench.lock benchmarks/ab_pairs.sh af01834 HEAD
#
# Why pairs: the machine is shared and its load moves the figures by ±30 %
# within minutes, so two commits are only compared when they ran one right
# after the other, and a peer's step (PEERS, run once after each pair of a
# workload) turns each pair into ratios measured in the same minute.
#
# Each commit is a `git archive` snapshot in /tmp/dw-ab-<sha>; the harness'
# runner (`python -m peers.run`, one library x workload per call, as
# run_all.sh calls it, without the limits) is pointed at a snapshot by
# PYTHONPATH (which the harness passes on to the worker and which shadows
# the editable install in the venv) and PEERS_EXTRA_ADAPTERS.  Pair k runs A
# then B when k is odd, B then A when even.  Each side's records go to
# OUT/<side>/scratch/raw.jsonl and its completion logs to
# OUT/<side>/scratch/done__<lib>__<workload>__rep<k>.log (see
# benchmarks/w4_waves.py), the peers' to OUT/peers/scratch/raw.jsonl; the
# script ends with a table of each record's figures (W1: drain/s and
# enqueue/s, W2: bulk/s, W3: p50/p99 ms, W4: drain/s).
set -eu
REPO=$(cd "$(dirname "$0")/.." && pwd)
HARNESS=${PEERS_HARNESS:-$(realpath -m "$REPO/../shared/bench")}
VENV=${PEERS_VENV:-/tmp/peers-venv}
PY=$VENV/bin/python
PAIRS=${PAIRS:-3}
LIBS=${LIBS:-"dumbwaiter-sqlite dumbwaiter-redis dumbwaiter-postgres"}
WORKLOADS=${WORKLOADS:-"W4 W1"}
PEERS=${PEERS:-}
A=$(git -C "$REPO" rev-parse --short "$1")
B=$(git -C "$REPO" rev-parse --short "$2")
OUT=$(realpath -m "${3:-/tmp/dw-ab-$A-$B}")
export DUMBWAITER_BENCH_DIR=${DUMBWAITER_BENCH_DIR:-/tmp/dumbwaiter-bench}
mkdir -p "$DUMBWAITER_BENCH_DIR"

# the snapshots bring their own source, not their dependencies: those come
# from one editable install of this checkout in the peers' venv
[ -x "$PY" ] || "$HARNESS/peers/setup.sh"
"$PY" -c "import orjson, dumbwaiter" 2>/dev/null || "$VENV/bin/pip" install -q -e "$REPO"

for c in "$A" "$B"; do
  d=/tmp/dw-ab-$c
  if [ ! -d "$d" ]; then
    mkdir -p "$d" && git -C "$REPO" archive "$c" | tar -x -C "$d"
  fi
  mkdir -p "$OUT/$c/scratch/logs"
done
mkdir -p "$OUT/peers/scratch/logs"

run() {  # side pair lib workload  (side "peers": the harness' own adapters)
  local env=()
  if [ "$1" != peers ]; then
    env=(PYTHONPATH="/tmp/dw-ab-$1/src" PEERS_EXTRA_ADAPTERS="/tmp/dw-ab-$1/benchmarks/peers")
  fi
  (cd "$HARNESS" && env "${env[@]}" PEERS_VENV="$VENV" PEERS_RESULTS_DIR="$OUT/$1" \
     timeout -k 15 240 "$PY" -m peers.run --lib "$3" --workload "$4" \
     --rep "$2" --out "$OUT/$1/scratch/raw.jsonl" 2>>"$OUT/$1/scratch/logs/runner_stderr.log" >/dev/null) \
    || echo "$1 $3 $4 pair $2 failed (rc=$?)"
}

for k in $(seq 1 "$PAIRS"); do
  if [ $((k % 2)) -eq 1 ]; then order="$A $B"; else order="$B $A"; fi
  for w in $WORKLOADS; do
    for lib in $LIBS; do
      for side in $order; do
        run "$side" "$k" "$lib" "$w"
      done
    done
    for peer in $PEERS; do
      run peers "$k" "$peer" "$w"
    done
  done
done

"$PY" - "$OUT" "$A" "$B" <<'EOF'
import json, sys
from pathlib import Path

out, a, b = sys.argv[1:4]
METRICS = {"W1": ("drain_rate", "enqueue_rate"), "W2": ("enqueue_rate",),
           "W3": ("p50_ms", "p99_ms"), "W4": ("drain_rate",)}
rows = {}
for side in (a, b, "peers"):
    raw = Path(out, side, "scratch", "raw.jsonl")
    for line in raw.read_text().splitlines() if raw.exists() else []:
        r = json.loads(line)
        for m in METRICS.get(r["workload"], ()):
            rows[(r["lib"], r["workload"], m, r["rep"], side)] = r.get(m) or r.get("status")

def fmt(v):
    if not isinstance(v, (int, float)):
        return str(v or "-")
    return f"{v:,.0f}" if v >= 100 else f"{v:.2f}"

print(f"| lib | workload | figure | pair | {a} | {b} | {b} / {a} |")
print("|---|---|---|--:|--:|--:|--:|")
for lib, w, m, k in sorted({key[:4] for key in rows}):
    x, y, p = (rows.get((lib, w, m, k, s)) for s in (a, b, "peers"))
    if p is not None:
        print(f"| {lib} | {w} | {m} | {k} | {fmt(p)} (peer) | | |")
        continue
    ok = all(isinstance(v, (int, float)) and v for v in (x, y))
    print(f"| {lib} | {w} | {m} | {k} | {fmt(x)} | {fmt(y)} | {f'{y / x:.3f}' if ok else '-'} |")
EOF
