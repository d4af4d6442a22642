"""Supervision: restart intensity, as supervision trees define it. A slot may be restarted at most
``runner.actors_max_restarts`` times within any ``runner.restart_window_s`` seconds; one more failure inside
the window fails the run with the actor's error. Restarts spread out in time (chaos kills every N steps on
a long run) never exhaust it; a crash loop does, quickly."""
from __future__ import annotations

import collections
import threading
import time
from typing import Callable, Deque, Dict


class ActorFailed(RuntimeError):
    """An actor slot failed more often than the restart intensity allows (or produced no data for too long)."""


class RestartIntensity:
    def __init__(self, max_restarts: int, window_s: float, clock: Callable[[], float] = time.monotonic):
        self.max_restarts = max_restarts
        self.window_s = window_s
        self.clock = clock
        self.total = 0
        self._recent: Dict[int, Deque[float]] = collections.defaultdict(collections.deque)

    def record(self, slot: int, why: str) -> None:
        """Count a restart of ``slot``; raises :class:`ActorFailed` when the intensity is exceeded."""
        now = self.clock()
        q = self._recent[slot]
        while q and now - q[0] > self.window_s:
            q.popleft()
        if len(q) >= self.max_restarts:
            raise ActorFailed(f"actor {slot} failed {len(q) + 1} times within {self.window_s:g}s "
                              f"(runner.actors_max_restarts={self.max_restarts} within runner.restart_window_s="
                              f"{self.window_s:g}); last: {why}")
        q.append(now)
        self.total += 1


# ---- stop requests ---------------------------------------------------------------------------------------
STOP = threading.Event()


def request_stop(signum=None, frame=None) -> None:
    """Signal handler for SIGTERM and SIGINT (installed by train.py): the run stops at its next safe point
    (between two deliveries, never inside an update, a publication or the books), with status "interrupted".
    A second signal stops it at once."""
    if STOP.is_set():
        raise KeyboardInterrupt(f"signal {signum} (again)")
    STOP.set()


def check_stop() -> None:
    """A safe point: raise KeyboardInterrupt if a stop was requested."""
    if STOP.is_set():
        STOP.clear()
        raise KeyboardInterrupt("stop requested")
