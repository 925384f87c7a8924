"""A plain device's replies heard lately, byte for byte: a repeat of one is never an answer.

Protocol v1 has no sequence number, so a datagram that repeats one already
heard (a network or device duplicate, or a copy of a late reply that arrives
after it) names nothing new. While the device's stamps move, a repeat is
certainly a copy (`duplicates`). A device whose clock is coarse (16 ms steps)
or constant stamps two real answers alike whenever they come closer than its
step, and a fresh answer with the same counts then repeats the last one byte
for byte too; which one it is cannot be told, and a wrong guess hands the
policy another stimulation's answer. So a repeat is refused either way, never
taken and never booked as a reply still owed (which would let the real one be
taken for a later stimulation); the bridge counts it `indistinct` when the
stamps repeat. The cost is a timeout on the rare stimulation whose answer
really repeats the last bytes exactly (a silent culture on a constant clock).
"""

from __future__ import annotations

import collections

HEARD_REPLIES = 64
"""Replies remembered; a copy arriving later than this many replies after its original is not recognised."""


class ReplyCopies:
    """The last `size` distinct spike datagrams heard from a plain device, to recognise their repeats."""

    def __init__(self, size: int = HEARD_REPLIES) -> None:
        self._order: collections.deque[bytes] = collections.deque()
        self._heard: set[bytes] = set()
        self._size = size

    def repeat(self, data: bytes) -> bool:
        """True if `data` repeats a datagram heard lately; else remember it and return False."""
        if data in self._heard:
            return True
        self._order.append(data)
        self._heard.add(data)
        if len(self._order) > self._size:
            self._heard.discard(self._order.popleft())
        return False
