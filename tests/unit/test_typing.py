"""Typed tasks, as a user's type checker sees them.

mypy (this environment's, ``python -m mypy``) checks the samples in
tests/typing/ strictly, against the dumbwaiter being tested:
``typed_tasks_ok.py`` must pass, and in ``typed_tasks_errors.py`` exactly
the lines marked ``# E: code, ...`` must fail, with exactly those codes.  So
a change that loses a task's types (``enqueue`` back to ``*args: Any``,
``result()`` back to ``Any``, options that swallow typos) fails here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import dumbwaiter

SAMPLES = Path(__file__).resolve().parent.parent / "typing"
OK, ERRORS = SAMPLES / "typed_tasks_ok.py", SAMPLES / "typed_tasks_errors.py"
_MARK = re.compile(r"#\s*E:\s*(?P<codes>[\w\-, ]+)$")
_REPORTED = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): error: .*\[(?P<code>[\w\-]+)\]$")


def _marked(path: Path) -> dict[int, set[str]]:
    """Line number -> the error codes its ``# E:`` marker names."""
    out: dict[int, set[str]] = {}
    for n, text in enumerate(path.read_text().splitlines(), start=1):
        m = _MARK.search(text)
        if m:
            out[n] = {c.strip() for c in m.group("codes").split(",") if c.strip()}
    return out


@pytest.fixture(scope="module")
def mypy_errors(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> str:
    """mypy's report on both samples, checked as a user's strict project would."""
    cache = getattr(pytestconfig, "cache", None)
    cache_dir = cache.mkdir("mypy-typing") if cache is not None else tmp_path_factory.mktemp("m")
    src = Path(dumbwaiter.__file__).resolve().parent.parent  # the tree under test
    env = {**os.environ, "MYPYPATH": str(src)}
    out = subprocess.run(
        [
            sys.executable, "-m", "mypy",
            "--config-file=",  # not the project's: a user's plain strict settings
            "--strict", "--python-version=3.11", "--no-pretty", "--no-error-summary",
            f"--cache-dir={cache_dir}",
            str(OK), str(ERRORS),
        ],
        capture_output=True, text=True, env=env, cwd=SAMPLES, timeout=110, check=False,
    )  # fmt: skip
    assert out.returncode in (0, 1), f"mypy itself failed:\n{out.stdout}\n{out.stderr}"
    return out.stdout


def _reported(report: str, path: Path) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for line in report.splitlines():
        m = _REPORTED.match(line)
        if m and Path(m.group("path")).name == path.name:
            out.setdefault(int(m.group("line")), set()).add(m.group("code"))
    return out


def test_typed_tasks_pass_a_strict_check(mypy_errors: str) -> None:
    assert _reported(mypy_errors, OK) == {}, mypy_errors


def test_each_typing_mistake_is_reported_on_its_line(mypy_errors: str) -> None:
    expected = _marked(ERRORS)
    assert len(expected) >= 15, "the error sample lost its markers"
    assert _reported(mypy_errors, ERRORS) == expected, mypy_errors
