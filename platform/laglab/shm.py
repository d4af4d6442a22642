"""Shared memory for the process runner: fragment slots (actor -> learner), seqlocked blocks (snapshots and
credits, learner -> actors) and per-actor status blocks. Only plain arrays live here; the small headers that
say which slot holds what cross a pipe as fixed-layout bytes (:mod:`laglab.wire`), never as pickles.

Segments are created by the learner process, named ``laglab-<pid>-<token>-<what>``, and unlinked by it on
every exit path. Children are started by multiprocessing and share the learner's resource tracker, so their
attachments are no-ops there; if the learner is killed outright, its children follow it (:mod:`laglab.lifetime`)
and the tracker then unlinks what the learner created. If the whole process group is SIGKILLed, the tracker
dies too: :func:`sweep_stale` (run at every start) removes the segments of runs whose learner no longer holds
the lock on their life file (:class:`RunLife`). Nothing else is named: the runner uses no POSIX semaphores.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import secrets
import time
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory
from typing import Dict, List, Optional, Tuple

import numpy as np

from .actor import ActorStats
from .chaos import COUNTED
from .envs import EnvSpec
from .fragment import Fragment, FragmentId
from .lifetime import claim_if_dead, start_resource_tracker

PREFIX = "laglab-"


def segment_name(token: str, what: str) -> str:
    return f"{PREFIX}{os.getpid()}-{token}-{what}"


def new_token() -> str:
    return secrets.token_hex(4)


def create(name: str, nbytes: int) -> shared_memory.SharedMemory:
    return shared_memory.SharedMemory(name=name, create=True, size=max(1, int(nbytes)))


def attach(name: str) -> shared_memory.SharedMemory:
    """Open an existing segment (in a child started by multiprocessing: its tracker is the learner's)."""
    return shared_memory.SharedMemory(name=name, create=False)


def release(shm: Optional[shared_memory.SharedMemory], unlink: bool) -> None:
    if shm is None:
        return
    try:
        shm.close()
    except BufferError:  # a view still exported: the mapping goes when the process does
        pass
    if unlink:
        try:
            shm.unlink()
        except FileNotFoundError:  # removed already (a sweep, an operator): this process's tracker still lists it
            resource_tracker.unregister(shm._name, "shared_memory")  # (unlink unregisters only on success)


SHM_DIR = "/dev/shm"  # where POSIX shared memory lives on Linux (the only platform the process runner supports)


def leftover_segments(pid: Optional[int] = None) -> List[str]:
    """laglab segments still in /dev/shm (of one creating process, if ``pid`` is given)."""
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    want = f"{PREFIX}{pid}-" if pid is not None else PREFIX
    return sorted(n for n in names if n.startswith(want))


class RunLife:
    """Proof that a run is alive, good across PID namespaces: a file ``laglab-<pid>-<token>-life`` on which the
    run's learner holds a shared ``flock`` for its whole life. The kernel drops the lock when the learner dies,
    however it dies, so a run whose life file can be locked exclusively is over (:func:`sweep_stale`). The file
    appears under its name already locked (made under a temporary name, locked, then renamed), so no start
    can ever find a live run's file unlocked. Create it before the run's other segments."""

    def __init__(self, name: str):
        start_resource_tracker()  # (before the first segment: the tracker starts with SIGHUP blocked)
        self.name = name
        self.path = os.path.join(SHM_DIR, name)
        tmp = os.path.join(SHM_DIR, f".{name}.tmp")
        self.fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_SH)
        os.rename(tmp, self.path)
        # like the run's segments, the resource tracker unlinks it if the learner is killed outright
        resource_tracker.register("/" + name, "shared_memory")

    def close(self, unlink: bool) -> None:
        if unlink:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            resource_tracker.unregister("/" + self.name, "shared_memory")
        os.close(self.fd)


def sweep_stale() -> List[str]:
    """Unlink the segments of runs that are over but left them behind (their whole process group was SIGKILLed,
    resource tracker included): those whose life file (:class:`RunLife`) nobody holds any more. A live run —
    in this PID namespace or another sharing /dev/shm — holds its lock and is left alone. Returns the names
    removed."""
    runs: Dict[str, List[str]] = {}
    for n in leftover_segments():
        parts = n[len(PREFIX):].split("-")
        if len(parts) >= 3:
            runs.setdefault(f"{parts[0]}-{parts[1]}", []).append(n)
    removed: List[str] = []
    for key, names in runs.items():
        life = f"{PREFIX}{key}-life"
        if life not in names:
            continue  # no proof either way (a run from before life files): not ours to judge
        fd = claim_if_dead(os.path.join(SHM_DIR, life))
        if fd is None:
            continue  # its learner holds it: alive (or another start has just taken it)
        try:
            for n in sorted(names, key=lambda n: n == life):  # the life file last
                try:
                    os.unlink(os.path.join(SHM_DIR, n))
                    removed.append(n)
                except (FileNotFoundError, PermissionError):
                    pass
        finally:
            os.close(fd)
    return removed


# ---- fragment slots -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Field:
    name: str
    shape: Tuple[int, ...]
    dtype: np.dtype
    offset: int

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def _align(n: int, a: int = 64) -> int:
    return (n + a - 1) // a * a


class FragmentLayout:
    """Where each array of one fragment sits inside a slot (fixed by the env's spaces and ``rollout_len``)."""

    def __init__(self, spec: EnvSpec, rollout_len: int, state_shape: Optional[tuple] = None):
        """``state_shape``: a recurrent policy's state (the fragment's first and final states travel in the slot)."""
        T, obs, act = rollout_len, tuple(spec.obs_shape), spec.action_shape
        fields = [("obs", (T,) + obs, np.float32), ("actions", (T,) + act, np.int64 if spec.discrete else np.float32),
                  ("rewards", (T,), np.float32), ("disc_return", (T,), np.float32), ("terminated", (T,), np.bool_),
                  ("truncated", (T,), np.bool_), ("logp", (T,), np.float32), ("values", (T,), np.float32),
                  ("trunc_obs", (T,) + obs, np.float32), ("last_obs", obs, np.float32)]
        if not spec.discrete:
            fields += [("mean", (T, spec.n_actions), np.float32), ("log_std", (T, spec.n_actions), np.float32)]
        if spec.masked:
            fields += [("masks", (T, spec.n_actions), np.bool_)]
        if state_shape is not None:
            fields += [("state", tuple(state_shape), np.float32), ("final_state", tuple(state_shape), np.float32)]
        off = 0
        self.fields: List[Field] = []
        for name, shape, dt in fields:
            f = Field(name, shape, np.dtype(dt), off)
            self.fields.append(f)
            off = _align(off + f.nbytes, 16)
        self.slot_bytes = _align(off)
        self.T = T
        self.spec = spec


class SlotPool:
    """``n`` fragment slots, partitioned among the actors (``per_actor`` each), plus one state byte per slot:
    0 free, 1 written (its header is on the way or being read). An actor writes only into free slots of its
    own partition and marks them written before it sends the header; the learner copies a slot out and marks
    it free. So a slot is never rewritten while the learner may read it, and after an actor dies its whole
    partition can be reclaimed once its pipe is drained."""

    def __init__(self, layout: FragmentLayout, actors: int, per_actor: int, name: str, create_new: bool):
        self.layout = layout
        self.actors, self.per_actor = actors, per_actor
        self.n = actors * per_actor
        self.shm = create(name, _align(self.n) + self.n * layout.slot_bytes) if create_new else attach(name)
        self.name = name
        self.state = np.ndarray((self.n,), np.uint8, self.shm.buf, 0)
        self._base = _align(self.n)
        if create_new:
            self.state[:] = 0
        self._views: Dict[int, Dict[str, np.ndarray]] = {}

    def views(self, slot: int) -> Dict[str, np.ndarray]:
        v = self._views.get(slot)
        if v is None:
            base = self._base + slot * self.layout.slot_bytes
            v = {f.name: np.ndarray(f.shape, f.dtype, self.shm.buf, base + f.offset) for f in self.layout.fields}
            self._views[slot] = v
        return v

    def partition(self, actor: int) -> range:
        return range(actor * self.per_actor, (actor + 1) * self.per_actor)

    def free_slot(self, actor: int) -> Optional[int]:
        part = self.state[actor * self.per_actor:(actor + 1) * self.per_actor]
        idx = np.flatnonzero(part == 0)
        return None if len(idx) == 0 else actor * self.per_actor + int(idx[0])

    def write(self, slot: int, frag: Fragment) -> int:
        """Copy ``frag`` into ``slot`` (actor side); returns K, the number of final observations."""
        v = self.views(slot)
        for name in ("obs", "actions", "rewards", "disc_return", "terminated", "truncated", "logp", "values",
                     "last_obs"):
            v[name][...] = getattr(frag, name)
        k = len(frag.trunc_obs)
        if k:
            v["trunc_obs"][:k] = frag.trunc_obs
        if frag.mean is not None and "mean" in v:
            v["mean"][...] = frag.mean
            v["log_std"][...] = frag.log_std
        if frag.masks is not None and "masks" in v:
            v["masks"][...] = frag.masks
        if frag.state is not None and "state" in v:
            v["state"][...] = frag.state
            v["final_state"][...] = frag.final_state
        self.state[slot] = 1
        return k

    def read(self, slot: int, fid: FragmentId, k: int) -> Fragment:
        """A private copy of what ``slot`` holds (learner side), as a sealed fragment; then the slot is free."""
        v = self.views(slot)
        k = max(0, min(int(k), self.layout.T))
        arrays = {name: np.array(v[name]) for name in ("obs", "actions", "rewards", "disc_return", "terminated",
                                                        "truncated", "logp", "values", "last_obs")}
        arrays["trunc_obs"] = np.array(v["trunc_obs"][:k])
        if "mean" in v:
            arrays["mean"], arrays["log_std"] = np.array(v["mean"]), np.array(v["log_std"])
        if "masks" in v:
            arrays["masks"] = np.array(v["masks"])
        if "state" in v:
            arrays["state"], arrays["final_state"] = np.array(v["state"]), np.array(v["final_state"])
        self.state[slot] = 0
        return Fragment.sealed(id=fid, **arrays)

    def reclaim(self, actor: int) -> int:
        """Free every slot of a dead actor's partition; returns how many were still marked written."""
        part = self.state[actor * self.per_actor:(actor + 1) * self.per_actor]
        n = int(np.count_nonzero(part))
        part[:] = 0
        return n

    def close(self, unlink: bool) -> None:
        self._views.clear()
        self.state = None
        release(self.shm, unlink)


# ---- seqlocked blocks -----------------------------------------------------------------------------------------
class SeqBlock:
    """A versioned array published by one writer and copied by many readers, double-buffered under a seqlock:
    the writer fills the inactive buffer between two increments of the sequence number and then flips; a
    reader copies the active buffer and keeps the copy only if the sequence number was even and unchanged
    around the copy. So no reader ever keeps a mix of two publications. (Relies on x86-64's store and load
    ordering, as numpy offers no fences: the platform this runs on.)"""

    HEADER = 4  # int64: seq, active buffer, version, spare

    def __init__(self, n: int, dtype, name: str, create_new: bool):
        self.n, self.dtype = int(n), np.dtype(dtype)
        data = _align(self.n * self.dtype.itemsize)
        self.shm = create(name, 64 + 2 * data) if create_new else attach(name)
        self.name = name
        self.head = np.ndarray((self.HEADER,), np.int64, self.shm.buf, 0)
        self.bufs = [np.ndarray((self.n,), self.dtype, self.shm.buf, 64 + i * data) for i in range(2)]
        if create_new:
            self.head[:] = 0
            self.head[2] = -1

    def publish(self, data: np.ndarray, version: int) -> None:
        h = self.head
        nxt = 1 - int(h[1])
        h[0] += 1  # odd: a write is in progress
        try:
            self.bufs[nxt][...] = data
            h[1] = nxt
            h[2] = version
        finally:
            h[0] += 1  # even again (also if interrupted: the flip happened or not, never half)

    def version(self) -> int:
        return int(self.head[2])

    def read(self, out: Optional[np.ndarray] = None, spin_s: float = 0.0005, copy=np.copyto,
             alive=None) -> Tuple[int, np.ndarray]:
        """(version, a private copy of the newest publication). ``copy(dst, src)`` does the copying (a test
        slows it down to stand for a reader that is descheduled mid-copy). ``alive()``, checked while a write
        is in progress: False ends the wait (SystemExit), so a writer that died mid-publication cannot hang a
        reader."""
        h = self.head
        out = np.empty(self.n, self.dtype) if out is None else out
        while True:
            s1 = int(h[0])
            if s1 & 1:
                if alive is not None and not alive():
                    raise SystemExit(0)
                time.sleep(spin_s)
                continue
            idx, version = int(h[1]), int(h[2])
            copy(out, self.bufs[idx])
            if int(h[0]) == s1:
                return version, out

    def close(self, unlink: bool) -> None:
        self.head = None
        self.bufs = []
        release(self.shm, unlink)


class StatusBlock:
    """One float64 row per actor slot, written by that actor's process only: heartbeat, stats, chaos counts.
    Read by the learner for per-actor stats and liveness; chaos counts are read once the process is gone."""

    # the learner rebuilds an ActorStats from a row (runners/process.py), so its fields are taken from the class;
    # then what only the process runner keeps: liveness, start-up, and the chaos counts read when a process ends
    FIELDS = ("beat", *(f.name for f in dataclasses.fields(ActorStats)), "incarnation", "torch_loaded", "first_step",
              "duplicated", "reordered", "delayed", "dropped_steps", "kills", "hangs", "lost_held_steps",
              *(f"corrupted_{k}" for k in COUNTED), *(f"corrupted_steps_{k}" for k in COUNTED))
    INDEX = {f: i for i, f in enumerate(FIELDS)}

    def __init__(self, actors: int, name: str, create_new: bool):
        self.shm = create(name, actors * len(self.FIELDS) * 8) if create_new else attach(name)
        self.name = name
        self.rows = np.ndarray((actors, len(self.FIELDS)), np.float64, self.shm.buf, 0)
        if create_new:
            self.rows[:] = 0.0

    def set(self, actor: int, **values: float) -> None:
        for k, v in values.items():
            self.rows[actor, self.INDEX[k]] = v

    def get(self, actor: int, key: str) -> float:
        return float(self.rows[actor, self.INDEX[key]])

    def row(self, actor: int) -> Dict[str, float]:
        r = self.rows[actor].copy()
        return {f: float(r[i]) for i, f in enumerate(self.FIELDS)}

    def close(self, unlink: bool) -> None:
        self.rows = None
        release(self.shm, unlink)


class SharedCounter:
    """The run's env-step budget shared by processes, plus the stop flag the learner raises at shutdown.

    int64 words: [total, base, stop, reserved_0 .. reserved_{A-1}]. ``used`` is ``base`` plus every actor slot's
    reservations, so a reservation is one aligned word written last (``reserved_a += n``), under an advisory
    ``flock`` of the segment that the kernel releases when its holder dies: a SIGKILL at any instant either
    reserved a whole rollout or nothing, and never leaves the lock held. The learner reads a slot's word when an
    incarnation starts and again when it is gone, and gives back what the incarnation reserved and never
    reported (:meth:`release`); a child that gives back a rollout itself lowers the same word, so nothing is
    released twice."""

    HEAD = 3

    def __init__(self, name: str, create_new: bool, actors: int, total: int = 0, used: int = 0):
        self.shm = create(name, (self.HEAD + actors) * 8) if create_new else attach(name)
        self.name = name
        self.v = np.ndarray((self.HEAD + actors,), np.int64, self.shm.buf, 0)
        self.r = self.v[self.HEAD:]
        self._lock_fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_CLOEXEC)
        if create_new:
            self.v[:] = 0
            self.v[0], self.v[1] = total, used

    LOCK_WAIT_S = 10.0

    @contextlib.contextmanager
    def _locked(self):
        # this process's own open of the segment (flock is per open file description), close-on-exec so a
        # subprocess cannot keep a dead actor's lock; waits at most LOCK_WAIT_S (a holder that is gone but whose
        # open file lives on in a process it forked would otherwise hang every reservation)
        deadline = time.monotonic() + self.LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the run's budget lock ({self.name}) has been held for "
                                       f"{self.LOCK_WAIT_S:g} s: a process that forked without exec holds it")
                time.sleep(0.0005)
        try:
            yield
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def stop(self) -> None:
        self.v[2] = 1

    @property
    def stopped(self) -> bool:
        return int(self.v[2]) != 0

    @property
    def total(self) -> int:
        return int(self.v[0])

    @property
    def used(self) -> int:
        return int(self.v[1]) + int(self.r.sum())

    def reserved(self, actor: int) -> int:
        """Steps actor slot ``actor`` has reserved over all its incarnations (less what was given back)."""
        return int(self.r[actor])

    def reserve(self, actor: int, n: int) -> bool:
        with self._locked():
            if self.used + n > self.total:
                return False
            self.r[actor] += n  # the one word that makes the reservation
            return True

    def has_room(self, n: int) -> bool:
        return self.used + n <= self.total

    def release(self, actor: int, n: int) -> None:
        with self._locked():
            self.r[actor] -= n

    def close(self, unlink: bool) -> None:
        self.v = self.r = None
        os.close(self._lock_fd)
        release(self.shm, unlink)
