#!/usr/bin/env bash
# Paired, alternated A/B runs of two commits in the peers harness, in one
# hold of the benchmark lock (take it around this script):
#
#   flock /tmp/dw-bench.lock benchmarks/ab_pairs.sh BASE_COMMIT NEW_COMMIT [OUT]
#   PAIRS=4 LIBS="dumbwaiter-redis" WORKLOADS="W4" flock /tmp/dw-bench.lock benchmarks/ab_pairs.sh af01834 HEAD
#
# Each commit is a `git archive` snapshot in /tmp/dw-ab-<sha>; the harness'
# runner (`python -m peers.run`, one library x workload per call, as
# run_all.sh calls it, without the limits) is pointed at a snapshot by
# PYTHONPATH (which the harness passes on to the worker and which shadows
# the editable install in the venv) and PEERS_EXTRA_ADAPTERS.  Pair k runs A
# then B when k is odd, B then A when even.  Each side's records go to
# OUT/<side>/scratch/raw.jsonl and its completion logs to
# OUT/<side>/scratch/done__<lib>__<workload>__rep<k>.log (see
# benchmarks/w4_waves.py); the script ends with one line per record.
set -eu
REPO=$(cd "$(dirname "$0")/.." && pwd)
HARNESS=${PEERS_HARNESS:-/work/shared/bench}
PY=${PEERS_VENV:-/tmp/peers-venv}/bin/python
PAIRS=${PAIRS:-3}
LIBS=${LIBS:-"dumbwaiter-sqlite dumbwaiter-redis dumbwaiter-postgres"}
WORKLOADS=${WORKLOADS:-"W4 W1"}
A=$(git -C "$REPO" rev-parse --short "$1")
B=$(git -C "$REPO" rev-parse --short "$2")
OUT=$(realpath -m "${3:-/tmp/dw-ab-$A-$B}")
export DUMBWAITER_BENCH_DIR=${DUMBWAITER_BENCH_DIR:-/tmp/dumbwaiter-bench}
mkdir -p "$DUMBWAITER_BENCH_DIR"

for c in "$A" "$B"; do
  d=/tmp/dw-ab-$c
  if [ ! -d "$d" ]; then
    mkdir -p "$d" && git -C "$REPO" archive "$c" | tar -x -C "$d"
  fi
  mkdir -p "$OUT/$c/scratch/logs"
done

run() {  # side pair lib workload
  local d=/tmp/dw-ab-$1
  (cd "$HARNESS" && PYTHONPATH="$d/src" PEERS_EXTRA_ADAPTERS="$d/benchmarks/peers" \
     PEERS_RESULTS_DIR="$OUT/$1" timeout -k 15 240 "$PY" -m peers.run --lib "$3" --workload "$4" \
     --rep "$2" --out "$OUT/$1/scratch/raw.jsonl" 2>>"$OUT/$1/scratch/logs/runner_stderr.log" >/dev/null) \
    || echo "$1 $3 $4 pair $2 failed (rc=$?)"
}

for k in $(seq 1 "$PAIRS"); do
  if [ $((k % 2)) -eq 1 ]; then order="$A $B"; else order="$B $A"; fi
  for lib in $LIBS; do
    for w in $WORKLOADS; do
      for side in $order; do
        run "$side" "$k" "$lib" "$w"
      done
    done
  done
done

"$PY" - "$OUT" "$A" "$B" <<'EOF'
import json, sys
out, a, b = sys.argv[1:4]
rows = {}
for side in (a, b):
    for line in open(f"{out}/{side}/scratch/raw.jsonl"):
        r = json.loads(line)
        rows[(r["lib"], r["workload"], r["rep"], side)] = r.get("drain_rate") or r.get("status")
keys = sorted({k[:3] for k in rows})
print(f"| lib | workload | pair | {a} | {b} | {b} / {a} |")
print("|---|---|--:|--:|--:|--:|")
for lib, w, k in keys:
    x, y = rows.get((lib, w, k, a)), rows.get((lib, w, k, b))
    ratio = f"{y / x:.3f}" if isinstance(x, float) and isinstance(y, float) else "-"
    print(f"| {lib} | {w} | {k} | {x} | {y} | {ratio} |")
EOF
