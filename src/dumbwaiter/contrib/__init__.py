"""Integrations with web frameworks, one module each.

``dumbwaiter.contrib.fastapi`` (and ``.starlette``), ``dumbwaiter.contrib.django``
and ``dumbwaiter.contrib.flask``.  Nothing here is imported by ``import
dumbwaiter``: each module imports its framework when it is imported itself,
and raises ``MissingDependency`` with the pip line when the framework is not
installed.  See docs/frameworks.md.
"""
