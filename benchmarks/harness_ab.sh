#!/usr/bin/env bash
# Alternated A/B of the peers harness' own steps for two commits, under one
# hold of the lock (take it around this script):
#
#   flock /tmp/dw-bench.lock benchmarks/harness_ab.sh OUT ROUNDS "W2 W1" REV_A REV_B [PEER] [LIB]
#
# Each commit is exported (git archive) to /tmp/dw-ab-REV and run from there
# (PYTHONPATH, so nothing is installed); for each round and workload the two
# run one after the other, the order flipped every round, then PEER (a
# harness library, e.g. rq-simple for W2, huey for W1) once.  LIB defaults
# to dumbwaiter-redis.  Records: OUT/raw-REV.jsonl and OUT/raw-peer.jsonl.
set -u
OUT=$1; ROUNDS=$2; WLS=$3; A=$4; B=$5; PEER=${6:-}; LIB=${7:-dumbwaiter-redis}
REPO=$(cd "$(dirname "$0")/.." && pwd)
HARNESS=${PEERS_HARNESS:-$(realpath -m "$REPO/../shared/bench")}
VENV=${PEERS_VENV:-/tmp/peers-venv}
mkdir -p "$OUT"
for REV in $A $B; do
  D=/tmp/dw-ab-$REV
  [ -d "$D" ] || { mkdir -p "$D" && git -C "$REPO" archive "$REV" | tar -x -C "$D"; }
done
cd "$HARNESS"
for i in $(seq 1 "$ROUNDS"); do
  if [ $((i % 2)) -eq 1 ]; then ORDER="$A $B"; else ORDER="$B $A"; fi
  for W in $WLS; do
    for REV in $ORDER; do
      D=/tmp/dw-ab-$REV
      PYTHONPATH=$D/src PEERS_VENV=$VENV PEERS_EXTRA_ADAPTERS=$D/benchmarks/peers \
        PEERS_RESULTS_DIR=$OUT/res-$REV timeout 300 "$VENV/bin/python" -m peers.run \
        --lib "$LIB" --workload "$W" --rep "$i" --out "$OUT/raw-$REV.jsonl" > "$OUT/log-$REV-$W-$i.txt" 2>&1
    done
    if [ -n "$PEER" ]; then
      PEERS_VENV=$VENV PEERS_RESULTS_DIR=$OUT/res-peer timeout 300 "$VENV/bin/python" -m peers.run \
        --lib "$PEER" --workload "$W" --rep "$i" --out "$OUT/raw-peer.jsonl" > "$OUT/log-peer-$W-$i.txt" 2>&1
    fi
  done
done
