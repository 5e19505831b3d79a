"""The PostgreSQL broker: ``postgresql://`` or ``postgres://`` URLs.

Needs the ``postgres`` extra: ``pip install 'dumbwaiter[postgres]'``.
"""

from .broker import PostgresBroker

__all__ = ["PostgresBroker"]
