"""How the process runner's children stay tied to the learner's life, and how they are woken, with nothing named
that a dead run could leave behind.

- **Lifeline.** One pipe per run: the learner holds its only write end and never writes; every child holds the
  read end. The kernel closes the write end the moment the learner exits, however it exits and whether or not
  anybody reaps it (a zombie holds no files; ``kill(pid, 0)`` would still call it alive). From then on the read
  end is readable (EOF) and :meth:`Lifeline.gone` is True. Children check it wherever they wait.
- **Parent-death signal** (Linux ``PR_SET_PDEATHSIG``): a child asks the kernel for SIGKILL when its parent goes,
  so a child busy where it does not look at the lifeline (inside a long ``env.step``) goes too. A parent that died
  before the request is caught by looking at the lifeline right after it. Under ``forkserver`` the parent is the
  fork server: it asks for the same signal when it starts (:mod:`laglab.runners.forkserver_life`, preloaded), and
  each child closes the server's "alive" pipe end that multiprocessing hands it (:func:`forget_fork_server`), which
  would otherwise keep the server, and so the child, alive after the learner.
- **Bell.** A doorbell per child is a pipe, not a POSIX semaphore (multiprocessing names those ``sem.mp-*`` in
  /dev/shm, and a SIGKILLed process group leaves them there for good). The learner writes a byte without
  blocking (a full pipe has rung already); the child waits on its bell and the lifeline together, then empties
  the bell, so each wait re-reads the shared state once.
- **The fork server's socket.** multiprocessing puts it in a temporary directory (``pymp-*`` in /tmp) that only an
  orderly exit removes; a SIGKILLed learner left one behind per run. The learner's is a directory of ours instead
  (:func:`own_mp_tempdir`: ``laglab-mp-<pid>-<token>``, with a life file the learner holds a lock on), which every
  start removes once its learner is gone (:func:`sweep_mp_tempdirs`), however it died.
"""
from __future__ import annotations

import ctypes
import fcntl
import os
import secrets
import shutil
import signal
import tempfile
from multiprocessing.connection import wait as wait_conns
from typing import List, Optional

PR_SET_PDEATHSIG = 1
# the signals that stop a run at its next safe point (summary "interrupted"): Ctrl-C, SIGTERM, and SIGHUP -- the
# terminal or ssh session closed (its default action would end the learner with no summary)
STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


def start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (it unlinks a killed run's segments) with SIGHUP blocked for good:
    it runs in the run's process group and ignores SIGINT and SIGTERM itself, but a closed terminal's SIGHUP would
    end it (a warning and KeyError tracebacks on stderr, and nothing left to clean up after a killed learner).
    Python's own start unblocks SIGINT and SIGTERM in the caller afterwards: the caller's mask is restored. A no-op
    once it runs."""
    from multiprocessing import resource_tracker

    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    try:
        resource_tracker.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent exits (Linux); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def forget_fork_server() -> None:
    """In a child forked by multiprocessing's fork server: close the copy of the server's "alive" pipe end that
    the server handed us. The server exits when every copy is closed, and that must happen when the learner
    dies, not when its last actor does (actors start no processes of their own)."""
    try:
        from multiprocessing import forkserver
        fd = forkserver._forkserver._forkserver_alive_fd
    except (ImportError, AttributeError):
        return
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass
        forkserver._forkserver._forkserver_alive_fd = None


MP_PREFIX = "laglab-mp-"  # multiprocessing's temporary directory of a laglab learner, in tempfile.gettempdir()
MP_LIFE = "life"  # the file in it whose shared lock the learner holds for its whole life
_mp_life: Optional[int] = None  # that lock's fd (this process's, once it owns its directory)


def own_mp_tempdir() -> Optional[str]:
    """Make multiprocessing's temporary directory for this process (the fork server's socket goes there) one that
    :func:`sweep_mp_tempdirs` can remove after this process is SIGKILLed: ``laglab-mp-<pid>-<token>``, holding a
    file ``life`` this process keeps a shared ``flock`` on (the kernel drops it however the process dies). The
    directory appears under its name already locked (made under a hidden name, locked, then renamed), and an
    orderly exit removes it as multiprocessing removes its own. Call it before anything asks multiprocessing for
    its temporary directory (starting the fork server does); returns the directory, or None if multiprocessing
    had made its own already (then it is left as it is: something may be using it)."""
    global _mp_life
    from multiprocessing import process, util

    config = process.current_process()._config
    if config.get("tempdir") is not None:
        here = os.path.basename(config["tempdir"])
        return config["tempdir"] if here.startswith(MP_PREFIX) and _mp_life is not None else None
    base = tempfile.gettempdir()
    hidden = tempfile.mkdtemp(prefix="." + MP_PREFIX, dir=base)
    fd = os.open(os.path.join(hidden, MP_LIFE), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    path = os.path.join(base, f"{MP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}")
    os.rename(hidden, path)
    _mp_life = fd
    config["tempdir"] = path
    # removed at exit after every other finalizer, as multiprocessing removes its own (exitpriority -100)
    util.Finalize(None, shutil.rmtree, args=(path, True), exitpriority=-100)
    return path


def sweep_mp_tempdirs() -> List[str]:
    """Remove the temporary directories (:func:`own_mp_tempdir`) of laglab learners that are gone — SIGKILLed,
    alone or with their whole process group — and so no longer hold the lock on their life file. A live
    learner's, in this PID namespace or another sharing the temporary directory, is left alone. Returns the names
    removed."""
    base = tempfile.gettempdir()
    try:
        names = sorted(n for n in os.listdir(base) if n.startswith(MP_PREFIX))
    except OSError:
        return []
    removed: List[str] = []
    for n in names:
        path = os.path.join(base, n)
        try:
            fd = os.open(os.path.join(path, MP_LIFE), os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue  # not one of ours as we make them (or another start just removed it)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # its learner holds it: alive
        else:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(n)
        finally:
            os.close(fd)
    return removed


class Lifeline:
    """Learner side: ``Lifeline(ctx)``; pass ``.child_end`` to each child; ``close()`` at the very end of the run
    (children see it as the learner's death, which by then is what it is to them). Child side: ``gone()``."""

    def __init__(self, ctx=None, child_end=None):
        self.child_end = child_end
        self._learner_end = None
        if ctx is not None:
            self.child_end, self._learner_end = ctx.Pipe(duplex=False)

    def gone(self) -> bool:
        """True once the learner has exited (or closed the lifeline)."""
        try:
            return self.child_end.poll(0)
        except (OSError, EOFError, ValueError):
            return True

    def close(self) -> None:
        for c in (self._learner_end, self.child_end):
            if c is not None:
                try:
                    c.close()
                except OSError:
                    pass


class Bell:
    """A doorbell: ``ring()`` on the learner side, ``wait(timeout, lifeline)`` on the child side. Made by the
    learner; the child's end travels to the child as a :class:`multiprocessing.connection.Connection`."""

    def __init__(self, ctx=None, wait_end=None):
        self.wait_end, self.ring_end = wait_end, None
        if ctx is not None:
            self.wait_end, self.ring_end = ctx.Pipe(duplex=False)
            os.set_blocking(self.ring_end.fileno(), False)

    def ring(self) -> None:
        try:
            os.write(self.ring_end.fileno(), b"\1")
        except (BlockingIOError, BrokenPipeError, OSError, ValueError):
            pass  # full: it rang already; broken or closed: nobody is listening any more

    def wait(self, timeout: float, lifeline: Optional[Lifeline] = None) -> bool:
        """Block until a ring, the learner's death or ``timeout``; then empty the bell. True if it rang."""
        conns = [self.wait_end] if lifeline is None else [self.wait_end, lifeline.child_end]
        ready = wait_conns(conns, timeout)
        return self.clear() if self.wait_end in ready else False

    def clear(self) -> bool:
        """Empty the bell without waiting; True if it had rung."""
        fd = self.wait_end.fileno()
        blocking = os.get_blocking(fd)
        os.set_blocking(fd, False)
        rang = False
        try:
            while True:
                b = os.read(fd, 4096)
                if not b:
                    return rang  # the learner closed its end
                rang = True
        except BlockingIOError:
            return rang
        finally:
            os.set_blocking(fd, blocking)

    def close_ring_end(self) -> None:
        if self.ring_end is not None:
            self.ring_end.close()

    def close_wait_end(self) -> None:
        if self.wait_end is not None:
            self.wait_end.close()
