#!/usr/bin/env bash
# dumbwaiter next to its peers, in one run of the shared harness
# (../shared/bench/peers, read-only): W1-W4 + the machine's limits.
#
#   benchmarks/run.sh                                  # defaults below
#   REPS=3 LIBS="dumbwaiter-sqlite huey" benchmarks/run.sh
#   WORKLOADS="W1 W3" STEP_TIMEOUT=240 benchmarks/run.sh   # passed through to run_all.sh
#
# -> benchmarks/results/peers/results.md and results.json (raw records and
#    worker logs in benchmarks/results/peers/scratch/, git-ignored); with a
#    RabbitMQ library, rabbitmq-floor.json too (the bare client's W3 floor)
set -eu

REPO=$(cd "$(dirname "$0")/.." && pwd)
HARNESS=${PEERS_HARNESS:-$(realpath -m "$REPO/../shared/bench")}
export PEERS_VENV=${PEERS_VENV:-/tmp/peers-venv}
export PEERS_RESULTS_DIR=${PEERS_RESULTS_DIR:-$REPO/benchmarks/results/peers}
export PEERS_EXTRA_ADAPTERS=${PEERS_EXTRA_ADAPTERS:-$REPO/benchmarks/peers}
# the SQLite database of dumbwaiter-sqlite (benchmarks/peers/dumbwaiter_adapter.py)
export DUMBWAITER_BENCH_DIR=${DUMBWAITER_BENCH_DIR:-/tmp/dumbwaiter-bench}
export LIBS=${LIBS:-"dumbwaiter-sqlite taskiq-stream huey saq dramatiq pgqueuer"}
export REPS=${REPS:-1}

[ -d "$HARNESS/peers" ] || { echo "peers harness not found at $HARNESS (set PEERS_HARNESS)" >&2; exit 1; }

# the peers' venv (and Redis, Postgres, RabbitMQ, NATS on 127.0.0.1); setup.sh is
# idempotent but slow, so only when the venv is missing
if [ ! -x "$PEERS_VENV/bin/python" ]; then
  "$HARNESS/peers/setup.sh"
fi
# this checkout, editable, so the worker command (`dumbwaiter worker`) runs the working tree
"$PEERS_VENV/bin/pip" install -q -e "$REPO"

mkdir -p "$PEERS_RESULTS_DIR" "$DUMBWAITER_BENCH_DIR"
"$HARNESS/peers/run_all.sh"
# W3 on RabbitMQ has a floor no library goes under (a quorum queue delivers
# only what its log committed): the bare client's pickup, measured here in the
# same run, for benchmarks/ratios.py
case " $LIBS " in
  *rabbitmq*)
    echo "=== the bare client's pickup on RabbitMQ (benchmarks/rabbitmq_floor.py)"
    "$PEERS_VENV/bin/python" "$REPO/benchmarks/rabbitmq_floor.py" -n "${FLOOR_N:-1000}" \
      --json "$PEERS_RESULTS_DIR/rabbitmq-floor.json"
    ;;
esac
