"""The Tasks framework this Django has: the ``django-tasks`` backport where it
is installed (Django 5.2, or a Django 6 project that kept it), else Django
6's own ``django.tasks``.  Both have the same API; the type checker reads
the backport's (it is typed; Django is not)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import MissingDependency

_PIP = "pip install 'dumbwaiter[django]'"

try:
    import django  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise MissingDependency(
        f"dumbwaiter.contrib.django needs Django, which is not installed: {_PIP}"
    ) from exc

if TYPE_CHECKING:
    from django_tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskError
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started
else:
    try:
        from django_tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import Task, TaskError
        from django_tasks.exceptions import TaskResultDoesNotExist
        from django_tasks.signals import task_enqueued, task_finished, task_started
    except ImportError:
        try:  # Django 6
            from django.tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
            from django.tasks.backends.base import BaseTaskBackend
            from django.tasks.base import Task, TaskError
            from django.tasks.exceptions import TaskResultDoesNotExist
            from django.tasks.signals import task_enqueued, task_finished, task_started
        except ImportError as exc:
            raise MissingDependency(
                "dumbwaiter.contrib.django needs Django's Tasks framework: Django 6, or the "
                f"django-tasks backport on Django 5.2: {_PIP}"
            ) from exc

__all__ = [
    "BaseTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
