"""The consumer channel's delivery tags handed to the broker and not yet
settled, and which acks may cover several at once.

An ack with ``multiple`` settles *every* tag up to its own that the server
delivered on the channel and has not seen settled, whether or not the
broker has been handed that delivery yet.  A channel numbers its deliveries
and ``basic.get`` answers 1, 2, 3, ..., but they do not always reach the
broker in that order: a delivery ``wire.Wire`` takes off the socket is
handed over at once, while one that went aiormq's way (the first ones of a
consumer started a moment ago, before it was registered with the wire; a
``GetOk``) is handed over by a task or coroutine that runs a little later.
A ``multiple`` ack of a later tag would then settle the earlier delivery on
the server before the broker judged or ran it; its own ack afterwards names
a tag the server no longer knows, which closes the channel, and a copy
still waiting in the link's buffer at that moment was lost with it (the
server had counted it acked).  So ``Unacked`` keeps its tags ascending
whatever order they came in, remembers the tags below the highest one that
have not come yet, and lets a ``multiple`` ack cover only a run of the
oldest tags with none of those in it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator


class Unacked:
    """Delivery tags handed over and not settled (the module's doc)."""

    __slots__ = ("_tags", "_top", "_unseen")

    def __init__(self) -> None:
        #: ascending (a dict keeps insertion order; re-sorted on the rare
        #: tag that comes after a higher one)
        self._tags: dict[int, None] = {}
        #: the highest tag handed over, and the tags below it not handed over yet
        self._top = 0
        self._unseen: set[int] = set()

    def add(self, tag: int) -> None:
        """A delivery (or ``GetOk``) with ``tag`` was handed to the broker."""
        if tag > self._top:
            if tag > self._top + 1:
                self._unseen.update(range(self._top + 1, tag))
            self._top = tag
            self._tags[tag] = None
            return
        self._unseen.discard(tag)
        self._tags[tag] = None
        self._tags = dict.fromkeys(sorted(self._tags))

    def __contains__(self, tag: object) -> bool:
        return tag in self._tags

    def __len__(self) -> int:
        return len(self._tags)

    def __iter__(self) -> Iterator[int]:
        return iter(self._tags)

    def clear(self) -> None:
        """The channel is gone: its tags mean nothing any more."""
        self._tags.clear()
        self._unseen.clear()
        self._top = 0

    def discard(self, tag: int) -> bool:
        """Settle one tag alone (a nack): whether it was unacked."""
        if tag in self._tags:
            del self._tags[tag]
            return True
        return False

    def settle(self, tags: Iterable[int]) -> tuple[int, list[int], int]:
        """Settle ``tags`` (those still unacked): the tag one ``multiple`` ack
        covers (0: none), the tags to ack one by one, and how many tags
        were settled.

        The ``multiple`` ack covers the longest run of the oldest unacked
        tags that are all being settled (jobs mostly end in order), and
        stops below any tag not handed over yet."""
        unacked = self._tags
        mine = {t for t in tags if t in unacked}
        if not mine:
            return 0, [], 0
        below = min(self._unseen) if self._unseen else None
        upto = 0
        for t in unacked:  # ascending
            if t not in mine or (below is not None and t > below):
                break
            upto = t
        for t in mine:
            del unacked[t]
        return upto, sorted(t for t in mine if t > upto), len(mine)
