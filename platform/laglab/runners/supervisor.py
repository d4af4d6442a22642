"""Supervision: restart intensity, as supervision trees define it. A slot may be restarted at most
``runner.actors_max_restarts`` times within any ``runner.restart_window_s`` seconds; one more failure inside
the window fails the run with the actor's error. Restarts spread out in time (chaos kills every N steps on
a long run) never exhaust it; a crash loop does, quickly."""
from __future__ import annotations

import collections
import os
import signal
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
# The handler only counts. Raising from a signal handler lands wherever the main thread happens to be --
# between taking a fragment from the queue and staging it, or between the two bookings of a batch -- and
# breaks the books; so the run acts on the count at its own points (check_stop), where the books are whole.
_signals = 0
_hung_up = False  # a SIGHUP has been counted


def request_stop(signum=None, frame=None) -> None:
    """Signal handler for SIGTERM, SIGINT and SIGHUP (installed by train.py; SIGHUP unless nohup ignores it);
    never raises. A stop request ends the run at its nearest safe point -- between two deliveries, before an
    update starts (never inside an update, a publication or the books), a learner stall cut short -- with status
    "interrupted". A second signal is as safe as the first (it used to raise wherever the main thread was). A
    third exits the process at once (exit code 130), writing nothing more. SIGHUP counts once: one closed
    terminal can deliver it twice (the shell forwards it, the kernel sends another as the shell exits), and that
    must not make the next signal a third."""
    global _signals, _hung_up
    if signum == signal.SIGHUP:
        if _hung_up:
            return
        _hung_up = True
    _signals += 1
    if _signals >= 3:
        try:
            os.write(2, b"\nlaglab: third stop signal: exiting now, without writing anything more "
                        b"(the run dir keeps what was already written)\n")
        except OSError:  # (stderr on a terminal that has closed)
            pass
        os._exit(130)


def stop_requested() -> int:
    """How many stop signals arrived (0: none)."""
    return _signals


def check_stop() -> None:
    """A safe point: raise KeyboardInterrupt if a stop was requested."""
    if _signals:
        raise KeyboardInterrupt("stop requested")


def wait_unless_stopped(seconds: float, poll_s: float = 0.05) -> None:
    """Sleep ``seconds``, or less once a stop is requested (a learner stall must not outlast Ctrl-C)."""
    end = time.monotonic() + seconds
    while not _signals:
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(poll_s, left))


def reset_stop() -> None:
    """Forget past stop requests (for a caller that runs again in the same process after an interruption)."""
    global _signals, _hung_up
    _signals = 0
    _hung_up = False
