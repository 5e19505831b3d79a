#!/usr/bin/env bash
# What each private hook buys (brokers/hooks.py): alternated rounds of
# DUMBWAITER_HOOKS_OFF settings, on the checkout this script is in, under the
# benchmarks' lock; one line per run (docs/benchmarks.md, "Private hooks").
#
#   benchmarks/hooks_ab.sh rabbitmq none publish inline direct 1
#   ROUNDS=3 benchmarks/hooks_ab.sh nats none parser send 1 > /tmp/hooks-nats.log
#
# "none" is every hook on.  Round k runs the settings in order when k is odd,
# reversed when even, so each setting's ratio to "none" is taken in the same
# round.  RabbitMQ: benchmarks/rabbitmq_enqueue.py (-n $ENQ) and
# rabbitmq_drain.py (-n $DRAIN); NATS: nats_enqueue.py and nats_drain.py.
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
PY=${PY:-$REPO/.venv/bin/python}
ENQ=${ENQ:-1000}
DRAIN=${DRAIN:-10000}
engine=$1; shift
settings=("$@")
LOCK=/tmp/dw-bench.lock
for r in $(seq "${ROUNDS:-3}"); do
  order=("${settings[@]}")
  if (( r % 2 == 0 )); then mapfile -t order < <(printf '%s\n' "${settings[@]}" | tac); fi
  for s in "${order[@]}"; do
    off=$s; [ "$s" = none ] && off=""
    export DUMBWAITER_HOOKS_OFF=$off PYTHONPATH=$REPO/src
    if [ "$engine" = rabbitmq ]; then
      e=$(flock $LOCK "$PY" benchmarks/rabbitmq_enqueue.py -n "$ENQ" --reps 1 2>&1 | grep '^rep 1')
      d=$(flock $LOCK "$PY" benchmarks/rabbitmq_drain.py -n "$DRAIN" --reps 1 2>&1 | grep '^rep 1')
    else
      out=$(mktemp)
      flock $LOCK "$PY" benchmarks/nats_enqueue.py --n "$ENQ" --reps 1 --json "$out" >/dev/null 2>&1
      e=$("$PY" -c "
import json, sys
run = json.load(open(sys.argv[1]))['runs'][0]
print(' '.join(f'{k.replace(\" \", \"_\")}={v:.0f}' for k, v in run.items()))" "$out")
      rm -f "$out"
      d=$(flock $LOCK "$PY" benchmarks/nats_drain.py -n "$DRAIN" 2>&1 | grep '^rep 1')
    fi
    echo "round=$r engine=$engine off=$s | $e | $d"
  done
done
