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

    On overflow: ``block`` waits for room (the wait is timed), ``reject`` refuses the new fragment,
    ``drop_oldest`` evicts from the head until the new one fits. Every refused or evicted transition
    is counted by reason.
    """

    def __init__(self, capacity: int, max_bytes: int, policy: Overflow = Overflow.block,
                 on_discard: Optional[Callable[[Fragment, str, str], None]] = None):
        """``on_discard(fragment, "dropped" | "rejected", reason)`` is told of every fragment the queue
        refuses or evicts (the learner side uses it to tell a discarded re-delivery from lost data)."""
        self.on_discard = on_discard
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.policy = Overflow(policy)
        self._items: Deque[Tuple[Fragment, int, float]] = collections.deque()
        self._bytes = 0
        self._closed = False
        self._cv = threading.Condition()
        self.stats = QueueStats()

    def _fits(self, nbytes: int) -> bool:
        return len(self._items) < self.capacity and self._bytes + nbytes <= self.max_bytes

    def put(self, frag: Fragment, poll_s: float = 0.05, on_wait: Optional[Callable[[], None]] = None) -> bool:
        """Enqueue; returns False if the fragment was refused. Raises :class:`Closed` after close()."""
        if self._closed:
            raise Closed()
        nbytes = frag.nbytes
        steps = frag.length
        with self._cv:
            if nbytes > self.max_bytes:
                self._discard(frag, "rejected", "too_large")
                return False
            if not self._fits(nbytes):
                if self.policy == Overflow.reject:
                    self._discard(frag, "rejected", "overflow")
                    return False
                if self.policy == Overflow.drop_oldest:
                    while not self._fits(nbytes):
                        old, old_bytes, _ = self._items.popleft()
                        self._bytes -= old_bytes
                        self._discard(old, "dropped", "overflow")
                else:
                    t0 = time.perf_counter()
                    while not self._fits(nbytes) and not self._closed:
                        self._cv.wait(poll_s)
                        if on_wait is not None:
                            on_wait()  # e.g. a heartbeat: blocked on a full queue is not hung
                    self.stats.blocked_s += time.perf_counter() - t0
            if self._closed:
                raise Closed()
            self._items.append((frag, nbytes, time.monotonic()))
            self._bytes += nbytes
            self.stats.put_fragments += 1
            self.stats.put_steps += steps
            self.stats.max_depth = max(self.stats.max_depth, len(self._items))
            self.stats.max_bytes = max(self.stats.max_bytes, self._bytes)
            self._cv.notify_all()
            return True

    def _discard(self, frag: Fragment, bucket: str, reason: str) -> None:
        (self.stats.dropped_steps if bucket == "dropped" else self.stats.rejected_steps)[reason] += frag.length
        if self.on_discard is not None:
            self.on_discard(frag, bucket, reason)

    def get(self, timeout: float) -> Optional[Tuple[Fragment, float]]:
        """Dequeue the oldest fragment and its age in seconds, or None after ``timeout``."""
        with self._cv:
            if not self._items:
                self._cv.wait_for(lambda: self._items or self._closed, timeout)
            if not self._items:
                return None
            frag, nbytes, t_put = self._items.popleft()
            self._bytes -= nbytes
            self.stats.got_fragments += 1
            self.stats.got_steps += frag.length
            self._cv.notify_all()
            return frag, time.monotonic() - t_put

    def close(self) -> int:
        """Refuse further puts, wake every waiter; returns the transitions still queued (now dropped)."""
        with self._cv:
            self._closed = True
            left = sum(f.length for f, _, _ in self._items)
            for f, _, _ in self._items:
                self._discard(f, "dropped", "shutdown")
            self._items.clear()
            self._bytes = 0
            self._cv.notify_all()
            return left

    def counts(self):
        """(dropped, rejected) steps by reason, copied under the queue's lock (producers add to them)."""
        with self._cv:
            return dict(self.stats.dropped_steps), dict(self.stats.rejected_steps)

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
        with self._cv:
            if snap.version <= self._snap.version:
                raise ValueError(f"snapshot version {snap.version} is not newer than {self._snap.version}")
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
