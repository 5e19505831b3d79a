#!/usr/bin/env bash
# The RabbitMQ and NATS suites against the oldest and the newest releases of
# their clients that pyproject.toml's extras allow (aiormq, pamqp, nats-py):
# the brokers' private hooks on their own connections (docs/benchmarks.md,
# "Private hooks") are tested with every end of those ranges, so a range is
# only widened after this passes with the new end.
#
#   .ci/clients.sh                  # both ends (called by .ci/run after `make test`)
#   ENDS=oldest .ci/clients.sh      # one end
#   KEEP=1 .ci/clients.sh           # keep the venvs (their folder is printed)
#
# Each end gets a throw-away venv (Python 3.11+, `PYTHON`, default python3)
# with this checkout (editable), the extras' clients pinned to that end (pip
# from PyPI), and what the suites import; then tests/conformance for the two
# brokers and tests/integration/rabbitmq and tests/integration/nats run in it,
# with CI=true (a server out of reach fails instead of skipping), on
# PYTEST_WORKERS processes as `make test` runs them (Makefile; 0: one).
set -euo pipefail
cd "$(dirname "$0")/.."
export CI=true
PYTHON=${PYTHON:-python3}
ENDS=${ENDS:-"oldest newest"}
PYTEST_WORKERS=${PYTEST_WORKERS:-3}
WORK=$(mktemp -d /tmp/dw-clients.XXXXXX)
if [ -z "${KEEP:-}" ]; then trap 'rm -rf "$WORK"' EXIT; else echo "venvs in $WORK"; fi

# pins <end>: one requirement a line for the extras' clients at that end
pins() {
  "$PYTHON" - "$1" <<'EOF'
import re, sys, tomllib

extras = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]
for req in extras["rabbitmq"] + extras["nats"]:
    name, spec = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(.*)", req).groups()
    low = re.search(r">=\s*([0-9][^,;\s]*)", spec)
    if low is None or "<" not in spec:
        sys.exit(f"pyproject.toml: {req!r} needs a tested range (>=oldest,<next)")
    print(f"{name}=={low.group(1)}" if sys.argv[1] == "oldest" else req)
EOF
}

status=0
for end in $ENDS; do
  venv=$WORK/$end
  mapfile -t clients < <(pins "$end")
  echo "== clients, $end: ${clients[*]}"
  "$PYTHON" -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  # aio-pika: the isolation tests open a user's own connection beside the broker's
  "$venv/bin/pip" install -q -e ".[redis,postgres]" "${clients[@]}" aio-pika \
    "pytest>=8.2" "pytest-asyncio>=0.24" "pytest-timeout>=2.3" "pytest-xdist>=3.6"
  "$venv/bin/python" -m pip list 2>/dev/null | grep -iE '^(aiormq|pamqp|nats-py|aio-pika) '
  if ! "$venv/bin/python" -m pytest -q -p no:cacheprovider \
      -n "$PYTEST_WORKERS" --dist loadgroup \
      tests/conformance -k "rabbitmq or nats" \
      tests/integration/rabbitmq tests/integration/nats; then
    echo "== the suites failed with the $end clients" >&2
    status=1
  fi
done
exit $status
