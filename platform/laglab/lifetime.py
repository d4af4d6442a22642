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
  start removes once its learner is gone (:func:`sweep_dirs`), however it died.
- **A local Ray instance's session.** Ray keeps each instance's session directory (logs, sockets) under
  ``/tmp/ray`` for good, one more every ``runner=ray`` run. A local instance a run starts has a root of ours
  (``laglab-ray-<pid>-<token>``, :func:`own_dir` likewise), removed when the run ends (a failed run's Ray logs are
  copied to its run dir first) or by the next start.
"""
from __future__ import annotations

import ctypes
import fcntl
import os
import logging
import secrets
import shutil
import signal
import stat
import tempfile
import time
from multiprocessing.connection import wait as wait_conns
from typing import Dict, List, Optional

PR_SET_PDEATHSIG = 1
log = logging.getLogger("laglab")
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
RAY_PREFIX = "laglab-ray-"  # the root of a laglab learner's local Ray instance (its session directory), likewise
LIFE = "life"  # the file in such a directory whose shared lock its learner holds for its whole life
# the longest directory the fork server's socket fits in: a socket's path is at most 107 bytes (sun_path), and
# multiprocessing names it "listener-" and 8 random characters
MP_DIR_MAX = 107 - len("/listener-") - 8
STALE_S = 60.0  # a directory of ours left half made or half removed is swept once this old (nobody is at it then)
_lives: Dict[str, int] = {}  # this process's directories of ours -> the fd of its lock on their life file


def ray_dir_max(pid: int) -> int:
    """The longest root a local Ray instance of learner ``pid`` can keep its session in: a socket's path is at
    most 107 bytes, and Ray's longest is ``<root>/session_<date>_<time>_<microseconds>_<pid>/sockets/plasma_store``
    (Ray 2.60; its own default root, ``$TMPDIR/ray``, fits a ``TMPDIR`` of 40-odd bytes)."""
    return 107 - len("/session_2026-12-07_16-11-37_397366_") - len(str(pid)) - len("/sockets/plasma_store")


def claim_if_dead(life: str, dir_fd: Optional[int] = None) -> Optional[int]:
    """An exclusive lock on a life file that nobody holds any more (its owner is gone, however it died, in this
    PID namespace or another sharing the file system): the open fd, to close once what the file vouched for is
    removed. None while its owner lives, where the file cannot be opened (gone, another user's, a symlink), or
    where it was replaced meanwhile (another sweep claimed and removed it: the lock taken is not on the file of
    that name). ``dir_fd``: ``life`` is a name in that directory."""
    try:
        fd = os.open(life, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.fstat(fd).st_ino != os.stat(life, dir_fd=dir_fd, follow_symlinks=False).st_ino:
            raise FileNotFoundError(life)
    except OSError:
        os.close(fd)
        return None
    return fd


def _open_own_dir(path: str) -> Optional[int]:
    """An fd of ``path`` if it is a directory (not a symlink to one) of this user's; else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    if os.fstat(fd).st_uid != os.getuid():
        os.close(fd)
        return None
    return fd


def _empty_at(dfd: int, last: str = "") -> None:
    """Remove what directory ``dfd`` holds (``last`` last), never following a symlink; whatever fails stays."""
    try:
        names = os.listdir(dfd)
    except OSError:
        return
    for n in sorted(names, key=lambda n: n == last):
        try:
            if stat.S_ISDIR(os.lstat(n, dir_fd=dfd).st_mode):
                sub = os.open(n, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
                try:
                    _empty_at(sub)
                finally:
                    os.close(sub)
                os.rmdir(n, dir_fd=dfd)
            else:
                os.unlink(n, dir_fd=dfd)
        except OSError:
            pass


def _remove_dir(path: str) -> None:
    """Remove one of our directories, its life file last (a removal cut short leaves a directory the sweep still
    recognises as ours and judges by its lock), then the directory; whatever fails is left to a later sweep. A
    symlink, or a directory of another user's, is left alone (and nothing is followed inside)."""
    dfd = _open_own_dir(path)
    if dfd is None:
        return
    try:
        _empty_at(dfd, last=LIFE)
    finally:
        os.close(dfd)
    try:
        os.rmdir(path)
    except OSError:
        pass


def own_dir(prefix: str, max_len: int, base: Optional[str] = None) -> Optional[str]:
    """A directory ``<prefix><pid>-<token>`` in the temporary directory that this process owns for its life: it
    holds a file ``life`` this process keeps a shared ``flock`` on (the kernel drops it however the process dies;
    the fd is close-on-exec, so no child holds it), so :func:`sweep_dirs` removes it once the process is gone,
    SIGKILLed or not. It appears under its name already locked (made under a hidden name, locked, then renamed).
    :func:`release_dir` removes it. None where its path would be longer than ``max_len`` bytes (a long ``TMPDIR``)
    or it cannot be made or locked (a file system without ``flock``). ``base``: in that directory instead."""
    base = base or tempfile.gettempdir()
    path = os.path.join(base, f"{prefix}{os.getpid()}-{secrets.token_hex(4)}")
    if len(os.fsencode(path)) > max_len:
        return None
    hidden, fd = None, None
    try:
        hidden = tempfile.mkdtemp(prefix="." + prefix, dir=base)
        fd = os.open(os.path.join(hidden, LIFE), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        os.rename(hidden, path)
    except OSError:
        if fd is not None:
            os.close(fd)
        if hidden is not None:
            _remove_dir(hidden)
        return None
    _lives[path] = fd
    return path


def release_dir(path: Optional[str]) -> None:
    """Remove a directory of :func:`own_dir`'s and let go of its lock (a no-op for None or one released)."""
    fd = _lives.pop(path, None) if path is not None else None
    if fd is None:
        return
    _remove_dir(path)
    os.close(fd)


def _release_mp_dir(path: str) -> None:
    """At an orderly exit (multiprocessing's finalizers, after every other one): as multiprocessing does with its
    own, remove the directory and forget it, so nothing later asks for a directory that is gone."""
    from multiprocessing import process

    release_dir(path)
    config = process.current_process()._config
    if config.get("tempdir") == path:
        config["tempdir"] = None


def own_mp_tempdir() -> Optional[str]:
    """Make multiprocessing's temporary directory for this process (the fork server's socket goes there) one of
    :func:`own_dir`'s, ``laglab-mp-<pid>-<token>``, which :func:`sweep_dirs` can remove after this process is
    SIGKILLed; an orderly exit removes it as multiprocessing removes its own. Call it before anything asks
    multiprocessing for its temporary directory (starting the fork server does). Returns the directory, or None
    where multiprocessing keeps its own way: it had made its directory already (something may be using it), the
    socket's path would not fit under this temporary directory (a long ``TMPDIR``), or the directory cannot be
    made or locked (a file system without ``flock``)."""
    from multiprocessing import process, util

    config = process.current_process()._config
    if config.get("tempdir") is not None:
        here = config["tempdir"]
        return here if os.path.basename(here).startswith(MP_PREFIX) and here in _lives else None
    path = own_dir(MP_PREFIX, MP_DIR_MAX)
    if path is None:
        return None
    config["tempdir"] = path
    # removed at exit after every other finalizer, as multiprocessing removes its own (exitpriority -100)
    util.Finalize(None, _release_mp_dir, args=(path,), exitpriority=-100)
    return path


def _old(path: str) -> bool:
    try:
        return time.time() - os.stat(path).st_mtime > STALE_S
    except OSError:
        return False


def _is_ray_of(pid: int, inside: bytes, real: bytes) -> bool:
    """Whether process ``pid`` is part of the local Ray instance kept in ``real`` (``inside``: it with a slash):
    started with it on its command line (GCS, raylet, log monitor: ``--session-dir=<root>/session_...``), or named
    ``ray::...`` by Ray (its agents and workers) with a file open in it."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        args = f.read().split(b"\0")
    if any(a.startswith(b"--") and (inside in a or a.endswith(b"=" + real)) for a in args):
        return True
    if not args[0].startswith(b"ray::"):
        return False
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.fsencode(os.readlink(f"/proc/{pid}/fd/{fd}")).startswith(inside):
                return True
        except OSError:
            pass
    return False


def stop_ray_processes(root: str) -> int:
    """SIGKILL what still runs of the local Ray instance kept in ``root`` (a learner's, :data:`RAY_PREFIX`; Linux
    ``/proc``): after a SIGKILLed raylet its two agents outlive it by a minute, waiting on a GCS that is gone, and
    ``ray.shutdown()`` waits for neither. Only this user's processes that are that instance's (see
    :func:`_is_ray_of`): a shell, a ``tail`` of its logs or another laglab start there is left alone. Each is held
    by a pidfd from the look to the kill, so a reused pid is never hit. Returns how many it stopped."""
    real = os.fsencode(os.path.realpath(root))
    inside = os.path.join(real, b"")
    uid, me, stopped = os.getuid(), os.getpid(), 0
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me]
    except OSError:
        return 0
    for pid in pids:
        try:
            pfd = os.pidfd_open(pid)
        except (OSError, AttributeError):
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid and _is_ray_of(pid, inside, real):
                signal.pidfd_send_signal(pfd, signal.SIGKILL)
                stopped += 1
        except OSError:
            pass
        finally:
            os.close(pfd)
    return stopped


def ray_bases() -> List[str]:
    """Where a learner's Ray directory can be: the temporary directory, else /tmp (where the temporary directory is
    too long for Ray's sockets)."""
    return list(dict.fromkeys((tempfile.gettempdir(), "/tmp")))


RAY_LOG_TAIL_BYTES = 10 << 20  # of each Ray log file a failed or killed run keeps (its end: what went wrong)
RUN_DIR = "run_dir"  # the file in a learner's Ray directory naming its run dir


def keep_ray_logs(session: str, run_dir) -> Optional[str]:
    """Copy a run's Ray logs from its session directory (Ray's processes' and each worker's output: ``*.out``,
    ``*.err``, ``*.log`` but the core workers' own; the last :data:`RAY_LOG_TAIL_BYTES` of each) to
    ``<run dir>/ray_logs/<session>``: that directory, or None where the session has no logs (Ray had not started
    one). Raises OSError where they cannot be copied."""
    logs = os.path.join(session, "logs")
    if not os.path.isdir(logs):
        return None
    dest = os.path.join(str(run_dir), "ray_logs", os.path.basename(os.path.realpath(session)))
    os.makedirs(dest, exist_ok=True)
    for n in sorted(os.listdir(logs)):
        src = os.path.join(logs, n)
        if n.startswith("python-core-") or not n.endswith((".out", ".err", ".log")) or os.path.islink(src) \
                or not os.path.isfile(src):
            continue
        with open(src, "rb") as f, open(os.path.join(dest, n), "wb") as g:
            f.seek(max(0, os.fstat(f.fileno()).st_size - RAY_LOG_TAIL_BYTES))
            shutil.copyfileobj(f, g)
    return dest


def note_run_dir(root: str, run_dir) -> None:
    """Name the run dir in a learner's Ray directory, for :func:`sweep_dirs` to keep the logs of a killed run."""
    try:
        with open(os.path.join(root, RUN_DIR), "w") as f:
            f.write(os.path.abspath(str(run_dir)))
    except OSError:
        pass


def _keep_killed_logs(path: str) -> Optional[str]:
    """A dead learner's Ray directory: its session's logs to the run dir it names, where both still exist and the
    session lies inside the directory; where they went (or None)."""
    try:
        fd = os.open(os.path.join(path, RUN_DIR), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd) as f:
            run_dir = f.read().strip()
        session = os.path.realpath(os.path.join(path, "session_latest"))
        if not (os.path.isdir(run_dir) and session.startswith(os.path.join(os.path.realpath(path), ""))):
            return None
        return keep_ray_logs(session, run_dir)
    except (OSError, ValueError):
        return None


def _leave_dead_ray(path: str, name: str) -> None:
    """Before a dead learner's Ray directory is removed: stop what still runs of its instance, keep its logs in its
    run dir."""
    stop_ray_processes(path)
    kept = _keep_killed_logs(path)
    if kept is not None:
        log.info("laglab: the Ray logs of the killed run (pid %s) are in %s", name[len(RAY_PREFIX):].split("-")[0],
                 kept)


BEFORE_REMOVAL = {RAY_PREFIX: lambda path, name: _leave_dead_ray(path, name)}  # what a sweep does first with a
# dead owner's directory, by its kind (looked up when called: a test may replace the function)


def sweep_dirs(prefix: str, base: Optional[str] = None) -> List[str]:
    """Remove the directories of :func:`own_dir`'s with this prefix whose owners are gone — SIGKILLed, alone or
    with their whole process group, or ended by a third Ctrl-C, which skips the exit's clean-up — and so no longer
    hold the lock on their life file. A live owner's, in this PID namespace or another sharing the temporary
    directory, is left alone; what still runs of a dead learner's local Ray instance is stopped first
    (:func:`stop_ray_processes`). Only real directories of this user's count (a symlink is never followed). Also
    removes what a cut-short start or removal left (a hidden directory, or one without its life file) once it is
    :data:`STALE_S` old. Returns the names of the owners' directories this sweep removed (one that another start
    removed meanwhile is not counted twice). ``base``: in that directory instead of the temporary directory."""
    base = base or tempfile.gettempdir()
    before = BEFORE_REMOVAL.get(prefix, lambda path, name: None)
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    removed: List[str] = []
    for n in names:
        path = os.path.join(base, n)
        if not n.startswith((prefix, "." + prefix)):
            continue
        dfd = _open_own_dir(path)  # (a symlink, or another user's: not ours)
        if dfd is None:
            continue
        try:
            if n.startswith("."):  # (made, not yet named: a start that died in between, or failed)
                if _old(path):
                    _remove_dir(path)
                continue
            try:
                os.lstat(LIFE, dir_fd=dfd)
            except FileNotFoundError:
                if _old(path):  # (a removal cut short after its life file)
                    before(path, n)
                    _remove_dir(path)
                continue
            fd = claim_if_dead(LIFE, dir_fd=dfd)
            if fd is None:
                continue  # its owner holds it: alive (or another sweep has taken it)
            try:
                before(path, n)
                _remove_dir(path)
                removed.append(n)
            finally:
                os.close(fd)
        except OSError:
            continue
        finally:
            os.close(dfd)
    return removed


LEFT_DIRS = {MP_PREFIX: "fork-server", RAY_PREFIX: "local Ray instance"}  # laglab's directories a start sweeps


def sweep_left_dirs(prefixes=tuple(LEFT_DIRS)) -> None:
    """At a start (a run's, or a tool's local Ray instance): :func:`sweep_dirs` of each kind of directory in
    ``prefixes`` where it can be (the fork server's in the temporary directory; a Ray instance's also in /tmp:
    :func:`ray_bases`), each removal logged with the dead learners' pids."""
    for prefix in prefixes:
        for base in ray_bases() if prefix == RAY_PREFIX else [tempfile.gettempdir()]:
            gone = sweep_dirs(prefix, base)
            if gone:
                log.info("laglab: removed %d %s directory(ies) left in %s by runs that did not end in order (pid %s)",
                         len(gone), LEFT_DIRS[prefix], base,
                         ", ".join(sorted({n[len(prefix):].split("-")[0] for n in gone})))


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
