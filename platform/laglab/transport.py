"""What moves between actors and the learner: a bounded fragment queue (items and bytes, explicit overflow
policy, counted) and the policy store (atomic snapshot publication, waiting for a newer version)."""
from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Deque, Dict, Mapping, Optional, Tuple

from .config import Overflow
from .fragment import Fragment
from .policy import Snapshot


class Closed(Exception):
    """The queue was closed while a caller waited on it."""


@dataclass
class QueueStats:
    put_fragments: int = 0
    put_steps: int = 0
    got_fragments: int = 0
    got_steps: int = 0
    dropped_steps: Dict[str, int] = field(default_factory=lambda: collections.Counter())
    rejected_steps: Dict[str, int] = field(default_factory=lambda: collections.Counter())
    blocked_s: float = 0.0
    max_depth: int = 0
    max_bytes: int = 0


class FragmentQueue:
    """Bounded FIFO of fragments, bounded in items *and* bytes.

    On overflow: ``block`` makes the producer wait for room (:meth:`try_put` says no, :meth:`wait_room`
    waits), ``reject`` refuses the new fragment, ``drop_oldest`` evicts from the head until the new one
    fits. Each item carries whether it is the first copy of its fragment to arrive; every refused or
    evicted item is reported to ``on_discard(fragment, first, "dropped" | "rejected", reason)``. ``clock``
    stamps each item on entry (its age on leaving); the queue lab's fixture passes a virtual one.
    """

    def __init__(self, capacity: int, max_bytes: int, policy: Overflow = Overflow.block,
                 on_discard: Optional[Callable[[Fragment, Optional[bool], str, str], None]] = None,
                 clock: Callable[[], float] = time.monotonic):
        self.on_discard = on_discard
        self.clock = clock
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.policy = Overflow(policy)
        self._items: Deque[Tuple[Fragment, Optional[bool], int, float]] = collections.deque()
        self._bytes = 0
        self._first_steps = 0  # steps of first copies held
        self._closed = False
        self._cv = threading.Condition()
        self.stats = QueueStats()

    def _fits(self, nbytes: int) -> bool:
        return len(self._items) < self.capacity and self._bytes + nbytes <= self.max_bytes

    def try_put(self, frag: Fragment, first: Optional[bool] = True) -> bool:
        """Enqueue, or refuse or evict by policy, without waiting. False only under ``block`` when there is no
        room (nothing changed: wait with :meth:`wait_room`, then try again). Raises :class:`Closed` after
        :meth:`close`."""
        nbytes = frag.nbytes
        with self._cv:
            if self._closed:
                raise Closed()
            if nbytes > self.max_bytes:
                self._discard(frag, first, "rejected", "too_large")
                return True
            if not self._fits(nbytes):
                if self.policy == Overflow.block:
                    return False
                if self.policy == Overflow.reject:
                    self._discard(frag, first, "rejected", "overflow")
                    return True
                while not self._fits(nbytes):
                    old, old_first, old_bytes, _ = self._items.popleft()
                    self._bytes -= old_bytes
                    self._first_steps -= old.length if old_first is True else 0
                    self._discard(old, old_first, "dropped", "overflow")
            self._items.append((frag, first, nbytes, self.clock()))
            self._bytes += nbytes
            self._first_steps += frag.length if first is True else 0
            self.stats.put_fragments += 1
            self.stats.put_steps += frag.length
            self.stats.max_depth = max(self.stats.max_depth, len(self._items))
            self.stats.max_bytes = max(self.stats.max_bytes, self._bytes)
            self._cv.notify_all()
            return True

    def wait_room(self, nbytes: int, timeout: float) -> None:
        """Wait (at most ``timeout``) until a fragment of ``nbytes`` would fit, or the queue closes."""
        t0 = time.perf_counter()
        with self._cv:
            self._cv.wait_for(lambda: self._closed or self._fits(nbytes), timeout)
            self.stats.blocked_s += time.perf_counter() - t0

    def put(self, frag: Fragment, first: Optional[bool] = True, poll_s: float = 0.05) -> None:
        """Enqueue, waiting for room under ``block`` (for callers that keep no books of their own)."""
        while not self.try_put(frag, first):
            self.wait_room(frag.nbytes, poll_s)

    def _discard(self, frag: Fragment, first: Optional[bool], bucket: str, reason: str) -> None:
        (self.stats.dropped_steps if bucket == "dropped" else self.stats.rejected_steps)[reason] += frag.length
        if self.on_discard is not None:
            self.on_discard(frag, first, bucket, reason)

    def get(self, timeout: float) -> Optional[Tuple[Fragment, Optional[bool], float]]:
        """Dequeue the oldest item: (fragment, first copy?, age in seconds), or None after ``timeout``."""
        with self._cv:
            if not self._items:
                self._cv.wait_for(lambda: self._items or self._closed, timeout)
            if not self._items:
                return None
            frag, first, nbytes, t_put = self._items.popleft()
            self._bytes -= nbytes
            self._first_steps -= frag.length if first is True else 0
            self.stats.got_fragments += 1
            self.stats.got_steps += frag.length
            self._cv.notify_all()
            return frag, first, self.clock() - t_put

    def close(self) -> int:
        """Refuse further puts, wake every waiter; the items still queued are dropped (``shutdown``); returns
        their steps."""
        with self._cv:
            self._closed = True
            left = sum(f.length for f, _, _, _ in self._items)
            for f, first, _, _ in self._items:
                self._discard(f, first, "dropped", "shutdown")
            self._items.clear()
            self._bytes = 0
            self._first_steps = 0
            self._cv.notify_all()
            return left

    @property
    def closed(self) -> bool:
        return self._closed

    def first_steps(self) -> int:
        """Steps of first copies held (the queue's part of the transitions in flight)."""
        with self._cv:
            return self._first_steps

    @property
    def depth(self) -> int:
        return len(self._items)

    @property
    def bytes(self) -> int:
        return self._bytes


class PolicyStore:
    """Holds the newest snapshot. Publication is one reference swap under a lock: readers see either
    the old or the new snapshot, never a mix."""

    def __init__(self, first: Snapshot):
        self._snap = first
        self._credits: Mapping[int, int] = first.consumed
        self._generation = 0  # bumped by every publication and credit grant
        self._cv = threading.Condition()

    def publish(self, snap: Snapshot) -> None:
        """Publish a newer snapshot (or the current version again, with new credits: ``actor.fixed_lag``);
        an older version is refused."""
        with self._cv:
            if snap.version < self._snap.version:
                raise ValueError(f"snapshot version {snap.version} is older than {self._snap.version}")
            self._snap = snap
            self._credits = snap.consumed
            self._generation += 1
            self._cv.notify_all()

    def grant(self, consumed: Mapping[int, int]) -> None:
        """Credit the actors' throttle with what the learner has received, without a new snapshot. The
        learner does this when it is starved (waiting for data with a partial batch): otherwise actors
        paused on credit that only the next update would give, and the update waits for their data."""
        with self._cv:
            self._credits = MappingProxyType(dict(consumed))
            self._generation += 1
            self._cv.notify_all()

    def credits(self) -> Mapping[int, int]:
        return self._credits

    @property
    def generation(self) -> int:
        return self._generation

    def wait_change(self, generation: int, timeout: float, stop: Optional[Callable[[], bool]] = None) -> None:
        """Block until a publication or grant after ``generation`` (or ``timeout`` or ``stop()``)."""
        with self._cv:
            self._cv.wait_for(lambda: self._generation > generation or (stop is not None and stop()), timeout)

    def latest(self) -> Snapshot:
        return self._snap

    def wait_newer(self, version: int, timeout: float, stop: Optional[Callable[[], bool]] = None) -> Snapshot:
        """Block until a snapshot newer than ``version`` is published (or ``timeout`` or ``stop()``)."""
        with self._cv:
            self._cv.wait_for(lambda: self._snap.version > version or (stop is not None and stop()), timeout)
            return self._snap

    def wake(self) -> None:
        with self._cv:
            self._cv.notify_all()
