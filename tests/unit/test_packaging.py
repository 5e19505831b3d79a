"""The package metadata says what the README promises: `all` extras, a licence file."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def project() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        table: dict[str, Any] = tomllib.load(f)["project"]
    return table


def test_the_all_extra_installs_every_optional_extra_but_dev() -> None:
    """`pip install 'dumbwaiter[all]'` (README, "Brokers") leaves out no extra a user can pick."""
    extras: dict[str, list[str]] = project()["optional-dependencies"]
    named: set[str] = set()
    for requirement in extras["all"]:
        own = re.fullmatch(r"dumbwaiter\[([\w,\s-]+)\]", requirement)
        assert own is not None, f"`all` should name dumbwaiter's extras, not {requirement!r}"
        named.update(part.strip() for part in own.group(1).split(","))
    assert named == set(extras) - {"all", "dev"}


def test_the_licence_file_is_shipped() -> None:
    meta = project()
    assert meta["license"] == "MIT"
    for name in meta["license-files"]:
        text = (ROOT / name).read_text(encoding="utf-8")
        assert text.startswith("MIT License")
        assert "dumbwaiter maintainers" in text
