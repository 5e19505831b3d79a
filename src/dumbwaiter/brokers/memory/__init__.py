"""``memory://``: the reference broker, kept in one process's memory.

It is the executable statement of the seam's rules (tests/conformance runs
it like every other broker) and the fast broker for unit tests of the layers
above the seam.  Nothing survives the process, so it is never a production
choice.  It is thread-safe: sync producers in other threads may enqueue while
a worker's event loop fetches.

Cut like the other engines (``transport``, ``admin``, ``coordination``,
``broker``), but with no ``connection`` module: there is nothing to connect
to and no client library whose objects belong to one event loop, so there
is no per-loop client to keep (``PerLoop``).  What a URL names is a
``store.Store`` in this process, found by name.
"""

from .broker import MemoryBroker

__all__ = ["MemoryBroker"]
