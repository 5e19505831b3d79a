"""The Django app that brings ``manage.py dumbwaiter_worker``."""

from __future__ import annotations

from django.apps import AppConfig


class DumbwaiterConfig(AppConfig):  # type: ignore[misc]  # Django is untyped
    name = "dumbwaiter.contrib.django"
    label = "dumbwaiter"
    verbose_name = "dumbwaiter"
