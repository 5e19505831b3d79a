"""Django: a backend for Django's Tasks framework, run by dumbwaiter workers.

    INSTALLED_APPS = [..., "dumbwaiter.contrib.django"]    # manage.py dumbwaiter_worker
    TASKS = {"default": {
        "BACKEND": "dumbwaiter.contrib.django.DumbwaiterBackend",
        "OPTIONS": {"url": "redis://127.0.0.1:6379/0"},
    }}

Django 6's ``django.tasks``, or the ``django-tasks`` backport on Django 5.2
(``pip install 'dumbwaiter[django]'``).  See docs/frameworks.md.
"""

from . import _compat  # noqa: F401  # first: a missing Django says which extra to install
from .backend import OPTIONS, DumbwaiterBackend

__all__ = ["OPTIONS", "DumbwaiterBackend"]
