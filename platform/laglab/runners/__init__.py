"""Runners start and supervise actors and move their fragments to the learner. Imported on demand, so an
actor process loads only what it runs (no torch)."""
from __future__ import annotations

import time

# this process's CPU and monotonic time as it first imports laglab's runners. Read only in a Ray worker, which
# imports them as it takes up its actor (after registering with its raylet and being handed the actor): the end of
# Ray's own part of its start (ActorStats.boot_cpu_s, summary startup_actors.booted); every other process sets them
# unread
BOOT_CPU_S, BOOT_T = time.process_time(), time.monotonic()

import importlib  # noqa: E402
from typing import Any, Callable, Dict  # noqa: E402

from ..config import RunnerKind  # noqa: E402


def get(kind: RunnerKind) -> Callable[..., Dict[str, Any]]:
    return importlib.import_module(f"{__name__}.{RunnerKind(kind).value}").run


# the environment an actor process starts with: one BLAS thread (spawned children get it at their start, the
# fork server at its own, so everything it forks has it)
ACTOR_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}

# what the process runner's fork server imports once, so that each actor start is a fork (see process.run)
FORKSERVER_PRELOAD = ["laglab.runners.forkserver_life", "laglab.runners.process_actor"]


def warm_up(runner: Any) -> None:
    """Start what the runner's actors start from before the learner imports torch, so the two overlap on two
    cores: under ``runner=process start_method=forkserver`` the fork server, importing the actor side (numpy,
    gymnasium, no torch) while this process imports torch. Harmless to call twice; a no-op for other runners.

    The server imports laglab from where this process did: Python 3.11's fork server ignores the parent's
    ``sys.path``, so without ``PYTHONPATH`` it would take whichever laglab the environment has installed (another
    checkout's, under an editable install) and its actors would run other code than the learner. It starts with
    :data:`ACTOR_ENV`: what it forks keeps the server's environment, not the learner's at that moment."""
    if RunnerKind(runner.name) != RunnerKind.process or runner.start_method != "forkserver":
        return
    import multiprocessing as mp
    import os
    import signal
    from multiprocessing import forkserver

    from ..lifetime import STOP_SIGNALS, own_mp_tempdir, start_resource_tracker

    import laglab

    mp.get_context("forkserver").set_forkserver_preload(FORKSERVER_PRELOAD)
    pid = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)
    if pid is not None:  # running: nothing to do, and nothing to change in this process's environment (which a
        try:  # W&B thread may be copying right now)
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    return
        except OSError:
            pass
    root = os.path.dirname(os.path.abspath(list(laglab.__path__)[0]))
    path = os.environ.get("PYTHONPATH")
    saved = {v: os.environ.get(v) for v in ("PYTHONPATH", *ACTOR_ENV)}
    os.environ.update(ACTOR_ENV, PYTHONPATH=root + (os.pathsep + path if path else ""))
    # Ctrl-C or SIGTERM at the whole group while the server starts must not print its traceback: it starts with
    # both blocked (the mask survives exec) and keeps them blocked (forkserver_life), as do the actors it forks.
    # The resource tracker starts first (the server connects to it): its start would unblock them in this window
    start_resource_tracker()
    own_mp_tempdir()  # (the server's socket goes in a directory a later start removes if this process is SIGKILLed)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # (and SIGHUP: a closed terminal)
    try:
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for v, old in saved.items():
            if old is None:
                os.environ.pop(v, None)
            else:
                os.environ[v] = old
