"""The framework integrations stay optional: ``import dumbwaiter`` loads no
framework, and an integration whose framework is missing says which extra
to install (checked in a fresh interpreter where the framework cannot be
imported)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

FRAMEWORKS = ("fastapi", "starlette", "django", "django_tasks", "flask")


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=False
    )


def test_import_dumbwaiter_loads_no_framework() -> None:
    out = _run(
        f"""
        import sys
        import dumbwaiter as dw
        import dumbwaiter.contrib
        app = dw.App("memory://contrib-imports")

        @app.task
        def f(x: int) -> int:
            return x

        f.enqueue(1)
        loaded = [m for m in {FRAMEWORKS!r} if m in sys.modules]
        assert not loaded, loaded
        """
    )
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(
    ("module", "missing", "extra"),
    [
        ("dumbwaiter.contrib.fastapi", "starlette", "fastapi"),
        ("dumbwaiter.contrib.starlette", "starlette", "fastapi"),
        ("dumbwaiter.contrib.flask", "flask", "flask"),
        ("dumbwaiter.contrib.django", "django", "django"),
        ("dumbwaiter.contrib.django", "django_tasks", "django"),
    ],
)
def test_a_missing_framework_names_the_pip_line(module: str, missing: str, extra: str) -> None:
    # None in sys.modules makes `import missing` raise ImportError; for
    # django_tasks, Django 5.2 has no django.tasks either, so both are missing
    out = _run(
        f"""
        import sys
        sys.modules[{missing!r}] = None
        from dumbwaiter.errors import MissingDependency
        try:
            import {module}
        except MissingDependency as exc:
            print(exc)
        else:
            raise SystemExit("no MissingDependency")
        """
    )
    assert out.returncode == 0, out.stderr + out.stdout
    assert f"pip install 'dumbwaiter[{extra}]'" in out.stdout
