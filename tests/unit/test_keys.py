"""``dumbwaiter.keys`` names every namespace of the brokers' key-value store:
a scan of one (``kv_scan(keys.WORKER)``) must never find another's records."""

from __future__ import annotations

from itertools import permutations

from dumbwaiter import keys

#: names in the coordination part (locks) or of tasks, not kv prefixes
NOT_KV = {"SCHEDULER_LOCK", "MAINTENANCE_LOCK", "RELAY_LOCK", "RUN_TASK", "STORE_ID"}


def _kv_prefixes() -> dict[str, str]:
    return {
        name: value
        for name, value in vars(keys).items()
        if name.isupper() and isinstance(value, str) and name not in NOT_KV
    }


def test_no_key_namespace_contains_another() -> None:
    found = _kv_prefixes()
    assert len(found) >= 20  # the module's constants were read
    clashes = [(a, b) for a, b in permutations(found, 2) if found[b].startswith(found[a])]
    assert not clashes


def test_every_namespace_ends_with_its_separator() -> None:
    assert all(v.endswith(":") for v in _kv_prefixes().values())


def test_the_helpers_build_keys_inside_their_namespace() -> None:
    assert keys.checkpoint("j1") == "ckpt:j1"
    assert keys.inbox("group:email", "e1") == "inbox:group:email:e1"
