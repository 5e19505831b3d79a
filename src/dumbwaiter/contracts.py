"""Event contracts: the JSON Schema of every event type, a lock file, and a check.

``dumbwaiter events lock`` writes ``events.lock.json``: each event type and
version with its JSON Schema.  Teams commit it.  ``dumbwaiter events check``
(in CI) compares the app's event classes with the lock and fails on an
incompatible change made without a version bump:

* a removed or renamed field (consumers still read it),
* a field whose type changed,
* a new required field (old producers do not send it).

A new optional field is compatible.  A new version of a type is always
allowed (that is what versions are for); the check then reminds you to
register an upcaster from the previous version.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .event import REGISTRY, Event

LOCK_FORMAT = 1
#: schema keywords that describe a field without changing what it accepts
_COSMETIC = frozenset({"title", "description", "examples", "default", "deprecated"})


def schemas(events: dict[tuple[str, int], type[Event]] | None = None) -> dict[str, Any]:
    """``{type: {version: JSON Schema}}`` of every event class (default: all
    classes imported in this process), versions as strings (JSON keys)."""
    out: dict[str, dict[str, Any]] = {}
    for (etype, version), cls in sorted((events or REGISTRY).items()):
        out.setdefault(etype, {})[str(version)] = cls.model_json_schema()
    return out


def lock_document(events: dict[tuple[str, int], type[Event]] | None = None) -> dict[str, Any]:
    return {"format": LOCK_FORMAT, "events": schemas(events)}


@dataclass
class Report:
    """What ``check`` found: problems fail the check, notes do not."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "problems": self.problems, "notes": self.notes}


def check(
    lock: dict[str, Any],
    events: dict[tuple[str, int], type[Event]] | None = None,
    upcasters: set[tuple[str, int]] | None = None,
) -> Report:
    """Compare the current event classes with a lock document."""
    report = Report()
    locked: dict[str, dict[str, Any]] = lock.get("events", {})
    current = schemas(events)
    for etype, versions in sorted(locked.items()):
        now = current.get(etype)
        if now is None:
            report.notes.append(
                f"{etype}: no class of this type is imported any more (was versions "
                f"{', '.join(sorted(versions, key=int))}); consumers elsewhere may still get it"
            )
            continue
        for version, old_schema in sorted(versions.items(), key=lambda kv: int(kv[0])):
            new_schema = now.get(version)
            if new_schema is None:
                newest = max(int(v) for v in now)
                if newest < int(version):
                    report.problems.append(
                        f"{etype} version {version} is gone and the newest class is version "
                        f"{newest}: versions only go up"
                    )
                continue
            for change in compare(old_schema, new_schema):
                report.problems.append(
                    f"{etype} version {version}: {change} without a version bump "
                    f"(make it version {max(int(v) for v in now) + 1} and add an upcaster)"
                )
        for version in sorted(set(now) - set(versions), key=int):
            report.notes.append(f"{etype} version {version} is new")
            previous = int(version) - 1
            if (
                upcasters is not None
                and str(previous) in versions | now
                and ((etype, previous) not in upcasters)
            ):
                report.notes.append(
                    f'{etype}: no @app.upcast("{etype}", from_version={previous}); consumers '
                    f"of version {version} will dead-letter version {previous} payloads"
                )
    for etype in sorted(set(current) - set(locked)):
        report.notes.append(f"{etype} is new (versions {', '.join(sorted(current[etype]))})")
    return report


def compare(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The incompatible differences between two JSON Schemas of one model."""
    changes: list[str] = []
    old_props = _props(old)
    new_props = _props(new)
    for name in sorted(set(old_props) - set(new_props)):
        changes.append(f"field {name!r} was removed or renamed")
    for name in sorted(set(old_props) & set(new_props)):
        before, after = _norm(old_props[name], old), _norm(new_props[name], new)
        if before != after:
            changes.append(f"field {name!r} changed type ({_kind(before)} -> {_kind(after)})")
    old_req, new_req = set(old.get("required", [])), set(new.get("required", []))
    for name in sorted(new_req - old_req):
        what = "new required field" if name not in old_props else "field became required"
        changes.append(f"{what} {name!r}")
    return changes


def _props(schema: dict[str, Any]) -> dict[str, Any]:
    props = schema.get("properties", {})
    return props if isinstance(props, dict) else {}


def _norm(node: Any, root: dict[str, Any], depth: int = 0) -> Any:
    """A field's schema with references inlined and cosmetic keywords dropped,
    so two schemas compare equal exactly when they accept the same values."""
    if depth > 20:
        return node
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            target = root.get("$defs", {}).get(ref.rsplit("/", 1)[-1], {})
            return _norm(target, root, depth + 1)
        return {
            k: _norm(v, root, depth + 1)
            for k, v in sorted(node.items())
            if k not in _COSMETIC and k != "$defs"
        }
    if isinstance(node, list):
        return [_norm(v, root, depth + 1) for v in node]
    return node


def _kind(schema: Any) -> str:
    if isinstance(schema, dict):
        if "type" in schema:
            return str(schema["type"])
        if "anyOf" in schema:
            return " | ".join(_kind(s) for s in schema["anyOf"])
        if "properties" in schema:
            return "object"
    return "other"
