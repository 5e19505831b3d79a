"""The alert rules (``alerts.py``) as a Prometheus alerting-rules file, for
teams that alert from Prometheus rather than from the workers' own alert
service: ``dumbwaiter alerts rules`` writes it.  Apart from the rules and
their evaluation because it is an export, used by the CLI only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from .alerts import AlertConfig, Rule, SchedulerLeader


def _camel(name: str) -> str:
    return "Dumbwaiter" + "".join(p.capitalize() for p in name.split("_"))


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s and s % 3600 == 0:
        return f"{s // 3600}h"
    if s and s % 60 == 0:
        return f"{s // 60}m"
    return f"{s}s"


def prometheus_rules(config: AlertConfig | None = None) -> dict[str, Any]:
    """The rules as a Prometheus alerting rules document (``groups:``).

    Each rule becomes one alert over every queue not named in its
    ``per_queue``, plus one per overridden queue with its own values (a
    disabled queue gets none)."""
    cfg = config or AlertConfig()
    rules: list[dict[str, Any]] = []
    for rule in cfg.rules:
        if not rule.enabled:
            continue
        named = sorted(rule.per_queue)
        base = f'{{queue!~"{_alternation(named)}"}}' if named else ""
        variants: list[tuple[Rule, str, str | None]] = [(rule, base, None)]
        for q in named:
            r = rule.for_queue(q)
            if r.enabled:
                variants.append((r, f'{{queue="{_escape(q)}"}}', q))
        for r, selector, queue in variants:
            entry: dict[str, Any] = {"alert": _camel(rule.name), "expr": r.promql(selector)}
            if r.for_:
                entry["for"] = _duration(r.for_)
            labels = {"severity": r.severity, "rule": rule.name}
            if queue is not None:
                labels["override"] = queue
            entry["labels"] = labels
            entry["annotations"] = {"summary": r.prom_summary(), "description": r.describe()}
            rules.append(entry)
            if isinstance(r, SchedulerLeader):
                break
    return {"groups": [{"name": "dumbwaiter", "rules": rules}]}


def _escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


def _alternation(names: Sequence[str]) -> str:
    import re

    return _escape("|".join(re.escape(n) for n in names))


def to_yaml(value: Any, indent: int = 0) -> str:
    """A small YAML writer for the rules document: block style for maps and
    lists, every string double-quoted (JSON strings are valid YAML), so no
    PromQL character can change the meaning."""
    pad = "  " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, dict | list) and v:
                lines.append(f"{pad}{k}:")
                lines.append(to_yaml(v, indent + 1))
            else:
                lines.append(f"{pad}{k}: {_scalar(v)}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict) and item:
                body = to_yaml(item, indent + 1).splitlines()
                lines.append(f"{pad}- {body[0].lstrip()}")
                lines.extend(body[1:])
            else:
                lines.append(f"{pad}- {_scalar(item)}")
    else:
        lines.append(pad + _scalar(value))
    return "\n".join(lines)


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if v is None:
        return "null"
    if isinstance(v, dict):
        return "{}"
    if isinstance(v, list):
        return "[]"
    return orjson.dumps(str(v)).decode()
