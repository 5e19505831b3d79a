"""DUMBWAITER_HOOKS_OFF (brokers/hooks.py): the diagnostic switch that puts a
broker on the client library's public path, hook by hook or all at once."""

from __future__ import annotations

import pytest

from dumbwaiter.brokers import hooks
from dumbwaiter.errors import ConfigurationError


def test_every_hook_is_on_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(hooks.ENV, raising=False)
    assert all(hooks.on(name) for name in hooks.NAMES)


@pytest.mark.parametrize("value", ["1", "all", "ALL", " true "])
def test_one_word_turns_every_hook_off(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(hooks.ENV, value)
    assert not any(hooks.on(name) for name in hooks.NAMES)


def test_named_hooks_go_off_and_the_others_stay_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(hooks.ENV, "publish, parser")
    assert {name for name in hooks.NAMES if hooks.on(name)} == hooks.NAMES - {"publish", "parser"}


def test_an_unknown_hook_name_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(hooks.ENV, "publish,frames")
    with pytest.raises(ConfigurationError, match="names no hook frames"):
        hooks.on("publish")
    with pytest.raises(ValueError, match="unknown hook 'frames'"):
        hooks.on("frames")
