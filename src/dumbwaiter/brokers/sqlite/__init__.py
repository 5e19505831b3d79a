"""The embedded SQLite broker (``sqlite:///PATH``), the default."""

from .broker import SQLiteBroker

__all__ = ["SQLiteBroker"]
