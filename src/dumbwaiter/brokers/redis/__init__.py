"""The Redis broker (``redis://``, ``rediss://``); needs ``pip install 'dumbwaiter[redis]'``."""

from .broker import RedisBroker

__all__ = ["RedisBroker"]
