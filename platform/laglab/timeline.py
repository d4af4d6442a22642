"""Start-up milestones of a run: when the process started, when its config was composed, when the learner was
built, when the actors were started, took their first env step, delivered their first fragment, and when the
first update ended. Times are on the host's monotonic clock, which every process on the host shares, so an
actor process's first env step lands on the learner's timeline. ``summary.json`` keeps them as seconds since the
process started (``startup``); ``benchmarks/startup.py`` prints the breakdown.

A mark is kept once: the first time a milestone is reached (``mark``), or the earliest of several actors'
(``mark_min``). ``all_actors_stepping`` is when the last actor slot took its first env step (:class:`FirstSteps`): Ray starts its
workers a few at a time, so on Ray it comes seconds after ``first_env_step``."""
from __future__ import annotations

import os
import threading
import time
from typing import Callable, Dict, Optional

ORDER = ("interpreter", "config", "imports", "learner", "tracker", "actors_started", "first_env_step",
         "first_fragment", "first_update", "all_actors_stepping")
_marks: Dict[str, float] = {}
# an actor slot's start (Ray: its worker's process created, Ray's part of its start done as it imports laglab, its
# actor constructed), each -> actor slot -> monotonic time, with its first env step (FirstSteps)
ACTOR_START = ("born", "booted", "built")
_actors: Dict[str, Dict[int, float]] = {}
_reached = threading.Condition()


def process_start() -> Optional[float]:
    """When this process was created, on the monotonic clock (from ``/proc/self/stat``, 10 ms resolution);
    None where /proc or CLOCK_BOOTTIME is missing."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: start time in clock ticks since boot
        boot_now, mono_now = time.clock_gettime(time.CLOCK_BOOTTIME), time.monotonic()
        return mono_now - (boot_now - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def mark(name: str, t: Optional[float] = None) -> None:
    """Record milestone ``name`` now (or at monotonic time ``t``) unless it was recorded before (then it costs a
    dict lookup: the driver calls it for every fragment)."""
    if name not in _marks:
        with _reached:
            if name not in _marks:  # (another thread may have marked it meanwhile: the first mark stays)
                _marks[name] = time.monotonic() if t is None else t
                _reached.notify_all()


def mark_min(name: str, t: float) -> None:
    """Record milestone ``name`` at ``t`` if that is earlier than what is recorded (the first of several actors)."""
    if t > 0 and t < _marks.get(name, float("inf")):
        _marks[name] = t


class FirstSteps:
    """Each actor slot's first env step as the learner first hears of it (a life that dies before it reports a step
    leaves its slot to the next life's first step; a later life of a slot that stepped is not a start-up), marked
    as ``first_env_step`` (the earliest) and, once every slot has stepped, ``all_actors_stepping`` (the latest; never,
    where a slot never steps). One thread at a time: the Ray runner's receiver, the process runner's learner loop."""

    def __init__(self, actors: int):
        self.actors, self.at = actors, {}

    def saw(self, actor_id: int, t: float, start: Optional[Dict[str, float]] = None) -> None:
        """Slot ``actor_id`` took its first env step at ``t``; ``start``, where its runner knows them, holds that
        life's earlier moments (:data:`ACTOR_START`)."""
        if t <= 0 or actor_id in self.at:
            return
        self.at[actor_id] = t
        for what, when in {**{k: v for k, v in (start or {}).items() if k in ACTOR_START}, "first_env_step": t}.items():
            if when > 0:
                _actors.setdefault(what, {})[actor_id] = when
        mark_min("first_env_step", t)
        if len(self.at) == self.actors:
            mark("all_actors_stepping", max(self.at.values()))


def get(name: str) -> Optional[float]:
    return _marks.get(name)


def wait(name: str, timeout: float, unless: Callable[[], bool] = lambda: False) -> bool:
    """Until milestone ``name`` is marked (by :func:`mark`) or ``unless()`` holds (checked again on :func:`wake`),
    at most ``timeout`` seconds; whether the milestone was marked."""
    with _reached:
        _reached.wait_for(lambda: name in _marks or unless(), timeout)
        return name in _marks


def wake() -> None:
    """Let every :func:`wait` check its ``unless`` again."""
    with _reached:
        _reached.notify_all()


def reset(keep: tuple = ()) -> None:
    """Forget every mark but those in ``keep`` (each job of a sweep in one process has its own start-up)."""
    for name in [n for n in _marks if n not in keep]:
        del _marks[name]
    _actors.clear()


def startup() -> Dict[str, object]:
    """The milestones as seconds since the process started (or, without /proc, since the first mark), in the
    order a run reaches them, plus ``origin_monotonic``: the monotonic time they count from."""
    start = _marks.get("process_start") or process_start()
    if start is None:
        start = min(_marks.values(), default=time.monotonic())
    out: Dict[str, object] = {"origin_monotonic": round(start, 4)}
    for name in ORDER:
        if name in _marks:
            out[name] = round(_marks[name] - start, 4)
    return out


def actor_starts() -> Dict[str, Dict[str, float]]:
    """Each actor slot's start, in seconds since the process started as :func:`startup` counts them (its
    ``origin_monotonic``): ``first_env_step`` per slot and, where the runner reports them (Ray), ``born`` (its
    worker process created, 10 ms resolution), ``booted`` (Ray's part of the start done: the worker imports
    laglab to take up its actor) and ``built`` (its actor constructed: imports and envs done). Keys are the slots
    as strings (JSON's)."""
    origin = float(startup()["origin_monotonic"])
    return {what: {str(i): round(t - origin, 4) for i, t in sorted(_actors[what].items())}
            for what in (*ACTOR_START, "first_env_step") if what in _actors}
