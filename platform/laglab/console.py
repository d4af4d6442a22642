"""The terminal: a live progress bar that every other line prints above (never into), what is kept off the
terminal (third-party noise goes to the run's log file), and the footer a run ends with.

- :class:`LiveBar` draws on its own handle of the terminal (a duplicate of stdout's descriptor, made before
  W&B wraps ``sys.stdout``), so the bar never reaches W&B's ``output.log``. While it is drawn, ``sys.stdout``,
  ``sys.stderr`` and the logging handlers that write to them go through :class:`_AboveBar`: each complete
  line erases the bar, is written to the original stream (which W&B still captures), and the bar is redrawn
  under it.
- :func:`third_party_log`: a logger whose records go only to the run's log file, in this process and in actor
  processes (they find the file through ``LAGLAB_LOG_FILE``); :func:`to_log_file` sends named third-party
  loggers there for the duration of a block (Ray's start-up).
- :func:`footer`: the text a run ends with, built from its ``summary.json`` dict alone.

Light at import (actor processes import it through ``envs``): rich is imported when a bar is made.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import shlex
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, TextIO

LOG_FILE_ENV = "LAGLAB_LOG_FILE"
LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # Hydra's, so the run's log reads as one
ERASE_LINE = "\r\x1b[2K"


# ---- the live bar ----------------------------------------------------------------------------------------
class LiveBar:
    """A one-line progress bar (rich columns) at the bottom of the terminal. Made before anything wraps
    stdout; drawn from the first :meth:`update` on; :meth:`close` leaves its last state on screen."""

    def __init__(self, total: int, max_fps: float = 4.0):
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        sys.stdout.flush()
        self.term: TextIO = open(os.dup(sys.stdout.fileno()), "w", encoding="utf-8", errors="replace")
        self.console = Console(file=self.term)
        self.progress = Progress(TextColumn("[bold]laglab"), BarColumn(),
                                 TextColumn("{task.completed:,}/{task.total:,}"), TextColumn("{task.fields[info]}"),
                                 TimeRemainingColumn(), console=self.console, auto_refresh=False)
        self.task = self.progress.add_task("train", total=total, info="")
        self.lock = threading.RLock()
        self.min_interval = 1.0 / max_fps
        self.live = False
        self.gone = False  # the terminal went away (see _to_term)
        self._last_draw = -math.inf
        self._saved: List[tuple] = []

    # drawing (callers hold self.lock)
    def _line(self) -> str:
        with self.console.capture() as cap:
            self.console.print(self.progress.get_renderable())
        return cap.get().rstrip("\n")

    def _draw(self) -> None:
        self._to_term(lambda: ERASE_LINE + self._line())  # (rendering writes to the terminal too)
        self._last_draw = time.perf_counter()

    def _erase(self) -> None:
        self._to_term(lambda: ERASE_LINE)

    def _to_term(self, text: Callable[[], str]) -> None:
        """Write to the terminal; once it has gone (closed: EIO after a hang-up) the bar draws no more and the
        run goes on -- its summary, books and checkpoint must not depend on a screen nobody looks at."""
        if self.gone:
            return
        try:
            self.term.write(text())
            self.term.flush()
        except OSError:
            self.gone = True

    def write_above(self, stream: TextIO, text: str) -> None:
        """Write complete lines to ``stream`` with the bar erased first and redrawn after."""
        with self.lock:
            if self.live:
                self._erase()
            try:
                stream.write(text)
                stream.flush()
            except OSError as e:  # the terminal closed: the line is lost to it (the log file has log lines)
                if e.errno != errno.EIO:
                    raise
                self.gone = True
            if self.live:
                self._draw()

    def update(self, completed: int, info: str) -> None:
        with self.lock:
            self.progress.update(self.task, completed=completed, info=info)
            if not self.live:
                self._start()
            if time.perf_counter() - self._last_draw >= self.min_interval:
                self._draw()

    def _start(self) -> None:
        """Route stdout, stderr and the logging handlers that write to them above the bar."""
        out, err = sys.stdout, sys.stderr
        proxies = {id(out): _AboveBar(out, self), id(err): _AboveBar(err, self)}
        self._saved = [(sys, "stdout", out), (sys, "stderr", err)]
        sys.stdout, sys.stderr = proxies[id(out)], proxies[id(err)]
        for h in _stream_handlers():
            s = vars(h).get("stream")  # (handlers that look sys.stderr up at emit time see the proxy anyway)
            if id(s) in proxies:
                h.setStream(proxies[id(s)])
                self._saved.append((h, None, s))
        self.live = True

    def close(self) -> None:
        with self.lock:
            if self.live:  # the bar goes: the footer says where the run ended (a last frame would show a stale
                self._erase()  # count and time left above it)
                self.live = False
                for owner, attr, original in reversed(self._saved):
                    current = getattr(owner, attr) if attr else owner.stream
                    if isinstance(current, _AboveBar):
                        current.drain()
                    if attr:
                        setattr(owner, attr, original)
                    else:
                        owner.setStream(original)
                self._saved = []
            try:
                self.term.close()
            except OSError:  # (what a gone terminal still had buffered)
                pass


def _stream_handlers() -> List[logging.StreamHandler]:
    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    return [h for lg in loggers for h in lg.handlers
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]


class _AboveBar:
    """A text stream that writes whole lines above the bar (a partial line waits for its newline)."""

    def __init__(self, stream: TextIO, bar: LiveBar):
        self.stream, self.bar = stream, bar
        self._pending = ""
        self._lock = threading.Lock()

    def write(self, s: str) -> int:
        with self._lock:
            self._pending += s
            head, nl, tail = self._pending.rpartition("\n")
            if not nl:
                return len(s)
            self._pending = tail
        self.bar.write_above(self.stream, head + nl)
        return len(s)

    def drain(self) -> None:
        with self._lock:
            rest, self._pending = self._pending, ""
        if rest:
            self.bar.write_above(self.stream, rest)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, ...
        return getattr(self.stream, name)


# ---- what stays off the terminal -------------------------------------------------------------------------
def third_party_log() -> logging.Logger:
    """``laglab.third_party``: third-party noise (MuJoCo's compiler warnings, Ray's start-up chatter), written
    only to the run's log file (``$LAGLAB_LOG_FILE``); dropped when no run has named one."""
    lg = logging.getLogger("laglab.third_party")
    path = os.environ.get(LOG_FILE_ENV)
    if getattr(lg, "_laglab_path", False) != path:
        for h in list(lg.handlers):
            lg.removeHandler(h)
            h.close()
        lg.addHandler(_log_file_handler())
        lg.setLevel(logging.DEBUG)
        lg.propagate = False
        lg._laglab_path = path  # type: ignore[attr-defined]
    return lg


def _log_file_handler() -> logging.Handler:
    path = os.environ.get(LOG_FILE_ENV)
    if not path:
        return logging.NullHandler()
    h = logging.FileHandler(path, delay=True)
    h.setFormatter(logging.Formatter(LOG_FORMAT))
    return h


def log_third_party_to(path: Path) -> None:
    """Name the file third-party noise goes to, here and in every process started from now on."""
    os.environ[LOG_FILE_ENV] = str(path)
    third_party_log()


def run_log_file(run_dir: Path) -> Path:
    """The run's log file: the file Hydra's job logging writes (``<run dir>/train.log``), else ``run.log``."""
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.FileHandler):
            return Path(h.baseFilename)
    return Path(run_dir) / "run.log"


@contextlib.contextmanager
def to_log_file(*names: str) -> Iterator[None]:
    """While the block runs, records of the named loggers go to the run's log file instead of their own
    handlers (Ray prints its start-up warnings to the terminal)."""
    target = _log_file_handler()  # a handler of its own: the library may restyle its loggers' handlers
    saved = []
    for name in names:
        lg = logging.getLogger(name)
        saved.append((lg, list(lg.handlers), lg.propagate))
        for h in list(lg.handlers):
            lg.removeHandler(h)
        lg.addHandler(target)
        lg.propagate = False
    try:
        yield
    finally:
        for lg, handlers, propagate in saved:
            for h in list(lg.handlers):
                lg.removeHandler(h)
            for h in handlers:
                lg.addHandler(h)
            lg.propagate = propagate
        target.close()


# ---- starved actors ---------------------------------------------------------------------------------------
STARVED_WAIT = 0.9  # the actors waited for a CPU at least this share of the time they were ready to run ...
STARVED_IDLE = 0.5  # ... while the learner waited for data at least this share of its time ...
STARVED_OWN = 0.5  # ... and the run itself (learner and actors) used under this share of the CPUs: others had them


def cpu_starved(actors_cpu_s: float, actors_wait_s: float, learner_wait_frac: Optional[float],
                own_share: Optional[float]) -> Optional[float]:
    """The share of their ready time the actors spent waiting for a CPU, when it says that other processes took
    the CPUs: the actors waited >= ``STARVED_WAIT`` of it while the learner waited for data >= ``STARVED_IDLE`` of
    its time and the run's own processes (the learner and the actors) used under ``STARVED_OWN`` of the CPUs this
    process may use (``own_share``: their CPU seconds over wall seconds x CPUs). None otherwise, or without the
    figures (the run delay is measured for process and Ray actors on Linux). Measured on 2 CPUs
    (benchmarks/actor_nice.py): a quiet run's two nice-19 actors wait 0.3-0.5 of it (the learner preempts them, as
    it should); beside two busy processes of the same session 0.99 at nice 19 (20x slower than sync; the run used
    ~3% of the CPUs) and 0.91 at nice 10, 0.6 at nice 0; beside two busy processes of other sessions ~0.83 at any
    niceness (Linux shares the CPUs between sessions first: the run has its share, and no setting of its own buys
    more), which is not flagged; 64 latency-env actors on 2 CPUs wait 0.93-0.95 with the learner idle 0.7 of its
    time, but for each other (the run used all the CPUs): not flagged either."""
    ready = actors_cpu_s + actors_wait_s
    if learner_wait_frac is None or own_share is None or ready <= 0 or actors_wait_s <= 0:
        return None
    frac = actors_wait_s / ready
    starved = frac >= STARVED_WAIT and learner_wait_frac >= STARVED_IDLE and own_share < STARVED_OWN
    return frac if starved else None


def starved_text(frac: float, learner_wait_frac: float, runner: str, nice: int,
                 raised: Optional[Mapping[str, Any]] = None) -> str:
    """What the console, the footer and the doctor say about starved actors, and what to do about it. ``raised``:
    what the run did about it (the driver's ``raised``: the actors raised from ``from_nice`` to ``to_nice``, or
    ``refused`` with the OS's reason)."""
    what = (f"the actors waited for a CPU {frac:.0%} of the time they were ready to run, and the learner for data "
            f"{learner_wait_frac:.0%} of its time: other processes have the CPUs; ")
    if raised and not raised.get("refused"):
        return (what + f"the actors ran at nice {raised.get('from_nice')} (runner.actor_nice), so the run raised them "
                f"to nice {raised.get('to_nice')} (the learner's) {_f(raised.get('at_s'))} s after its first update: "
                "they compete with the other processes on equal terms from then on (runner.actor_nice=0 does it from "
                "the start)")
    if runner == "process" and nice > 0:
        why = (f"the actors run at nice {nice} (runner.actor_nice) and get only what other processes of this session "
               "leave them (where Linux groups processes by session, its default on most distributions, a busy "
               "process in another terminal takes less); runner.actor_nice=0 makes them compete fairly (2 busy "
               "processes on 2 CPUs, measured: 26k instead of 1.1k SPS), or free the CPUs")
        if raised and raised.get("refused"):
            why += f" (the run could not raise them itself: {raised['refused']})"
    else:
        why = "free the CPUs, or run fewer actors"
    return what + why


# ---- the footer ------------------------------------------------------------------------------------------
def _n(x: Any) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:,.0f}" if isinstance(x, float) and math.isfinite(x) else str(x)


def _f(x: Any, digits: int = 1) -> str:
    return f"{x:,.{digits}f}" if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"


def _by_reason(d: Mapping[str, Any]) -> str:
    if not isinstance(d, Mapping):
        return ""
    parts = [f"{k} {_n(v)}" for k, v in sorted(d.items()) if v]
    return f" ({', '.join(parts)})" if parts else ""


def _total(x: Any) -> int:
    return int(sum(x.values())) if isinstance(x, Mapping) else int(x or 0)


def footer(summary: Mapping[str, Any], run_dir: Any) -> str:
    """What a run ends with on the console, from its summary dict: status, run dir, return (final and best,
    one definition), speed, lag, the books, faults injected vs detected (when chaos was on), W&B and the
    next commands."""
    s = summary
    d = str(run_dir)
    q = lambda p: shlex.quote(str(p))  # noqa: E731 - commands a user can paste, whatever the dir's name
    status = s.get("status", "?")
    head = f"laglab: {status}"
    what = ", ".join(str(x) for x in (s.get("env_id"), s.get("algo"), s.get("runner") and f"runner={s['runner']}",
                                      s.get("actors") is not None and f"{s['actors']} actor(s)"
                                      + (" (actors=auto)" if s.get("actors_auto") else ""),
                                      s.get("seed") is not None and f"seed {s['seed']}") if x)
    lines = [f"{head} - {what}" if what else head]
    row = lambda k, v: lines.append(f"  {k:<9} {v}")  # noqa: E731
    row("run dir", d)
    if s.get("error"):
        row("error", s["error"])
    if status == "interrupted":
        row("stopped", "interrupted (Ctrl-C, SIGTERM or SIGHUP); everything up to the stop is written")
    total = s.get("total_env_steps")
    row("progress", f"{_n(s.get('env_steps', 0))}{f' of {_n(total)}' if total else ''} env steps, "
                    f"{_n(s.get('updates', 0))} update{'' if s.get('updates') == 1 else 's'} in {_f(s.get('wall_time_s'))} s ({_n(s.get('sps', 0.0))} sps)")
    w = s.get("return_window", "N")
    row("return", f"final {_f(s.get('final_return_mean'))}, best {_f(s.get('best_return_mean'))} (mean return of "
                  f"the last {w} episodes: at the end, and its maximum over the run; {_n(s.get('episodes', 0))} "
                  "episodes)")
    if s.get("diverged_at_update") is not None:
        row("diverged", f"the loss was not finite from update {s['diverged_at_update']} on: the policy diverged "
                        "(a smaller learner.lr; returns after it are a diverged policy's)")
    lag = s.get("lag") or {}
    if lag:
        row("lag", f"version lag mean {_f(lag.get('mean'), 2)}, p95 {_f(lag.get('p95'), 0)}, max "
                   f"{_f(lag.get('max'), 0)}; KL(behavior||current) {_f(lag.get('kl_behavior'), 4)}")
    cpu = s.get("cpu") or {}
    raised = cpu.get("raised") or {}
    if raised and not raised.get("refused"):  # starved, then raised: the window that was starved
        row("cpu", starved_text(float(raised.get("wait_frac") or 0),
                                float(raised.get("learner_wait_frac", cpu["learner_wait_frac"])), str(s.get("runner")),
                                int(cpu.get("actor_nice") or 0), raised)
            + f"; over the whole run they waited {cpu['actors_wait_frac']:.0%}")
    elif cpu.get("starved"):
        row("cpu", starved_text(cpu["actors_wait_frac"], cpu["learner_wait_frac"], str(s.get("runner")),
                                int(cpu.get("actor_nice") or 0), raised))
    t = s.get("transport")
    if t:
        dropped, rejected = t.get("dropped", {}), t.get("rejected", {})
        row("books", f"unaccounted {_n(t.get('unaccounted', 0))}"
                     f"{'  <- the books did not close' if t.get('unaccounted') else ''} (env steps: produced = "
                     "admitted + dropped + rejected + in flight)")
        row("", f"produced {_n(t.get('produced', 0))}, admitted {_n(t.get('admitted', 0))}, in flight "
                f"{_n(t.get('in_flight', 0))}")
        if _total(dropped) or _total(rejected):
            row("", f"dropped {_n(_total(dropped))}{_by_reason(dropped)}")
            row("", f"rejected {_n(_total(rejected))}{_by_reason(rejected)}")
        else:
            row("", "dropped 0, rejected 0")
    else:
        row("books", "not available (the run stopped before its runner reported them)")
    ch = s.get("chaos")
    if ch and any(_total(v) for v in ch.values()):  # chaos was on and injected something
        lines.extend(_faults(ch, t or {}, s.get("actor_restarts", 0)))
    wb = s.get("wandb")
    if wb:
        if wb.get("error"):
            row("W&B", f"{wb.get('mode')}, did not start ({wb['error']}); the run dir has every metric")
        elif wb.get("mode") == "offline":
            row("W&B", f"offline; upload: wandb sync {q(wb.get('run_path') or Path(wb.get('dir', d)).parent)}")
        else:
            url = wb.get("url")
            row("W&B", f"{wb.get('mode')}{f' ({url})' if url else ''}")
    else:
        row("W&B", "disabled")
    nxt = []
    if s.get("checkpoint"):
        nxt.append(f"python evaluate.py {q(d)}")
    nxt.append(f"python -m analysis.report {q(d)} --out {q(d + '/report')}")
    row("next", nxt[0])
    lines.extend(f"  {'':<9} {c}" for c in nxt[1:])
    return "\n".join(lines)


def _faults(ch: Mapping[str, Any], t: Mapping[str, Any], restarts: Any) -> List[str]:
    """Faults injected (summary.chaos) next to what the run detected (transport books, restarts)."""
    dropped, rejected = t.get("dropped", {}) or {}, t.get("rejected", {}) or {}
    held = ch.get("lost_held_steps", 0)
    corrupted = ch.get("corrupted_steps", {}) or {}
    out = ["  faults    injected -> detected",
           f"    lost in transit  {_n(ch.get('dropped_steps', 0))} env steps"
           f"{f' (+{_n(held)} held by killed actors)' if held else ''} -> lost_in_transit "
           f"{_n(dropped.get('lost_in_transit', 0) if isinstance(dropped, Mapping) else 0)}",
           f"    duplicated       {_n(ch.get('duplicated', 0))} fragments -> {_n(t.get('duplicates_detected', 0))} "
           f"duplicates detected",
           f"    corrupted        {_n(_total(corrupted))} env steps{_by_reason(corrupted)} -> rejected "
           f"{_n(_total(rejected))}{_by_reason(rejected)}",
           f"    actors           {_n(ch.get('kills', 0))} killed, {_n(ch.get('hangs', 0))} hung -> "
           f"{_n(restarts or 0)} restarts",
           f"    also             {_n(ch.get('stalls', 0))} learner stalls, {_n(ch.get('delayed', 0))} delayed and "
           f"{_n(ch.get('reordered', 0))} reordered fragments (tolerated by design)"]
    return out
