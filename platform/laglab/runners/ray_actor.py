"""The actor side of the Ray runner: one Ray actor per slot, anywhere in the cluster (numpy only: no torch).

The learner drives it: each ``rollout`` call first asks the learner's snapshot board for the newest version
(and fetches that snapshot from the object store only when the version changed), then returns one rollout's
report — what the
worker's books say, the fragments that left its link (each a plain int64 header plus plain numpy arrays,
which Ray moves without copying them through pickle), the (env, t_end) marks of what it sent into the link,
its finished episodes, its stats and chaos counts. The learner keeps at most ``runner.max_inflight`` calls
outstanding per actor, so the object store holds a bounded number of rollouts.

Scripted faults: a kill returns what was sent before the crash point with ``killed`` set, and the learner
then kills the Ray actor (``ray.kill``: its process dies with what it held); a hang reports itself with one
rollout, and the next call never answers.
"""
from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import BOOT_CPU_S, BOOT_T
from ..actor import Actor, run_delay_s
from ..chaos import ChaosChannel, kinds_for
from ..config import Config
from ..fragment import Fragment, FragmentId
from ..inference import SnapshotCodec
from ..timeline import process_start

ARRAYS = ("obs", "actions", "rewards", "terminated", "truncated", "logp", "values", "trunc_obs", "disc_return",
          "last_obs", "mean", "log_std", "masks", "state", "final_state")
HEADER = ("actor_id", "incarnation", "env_index", "episode_id", "episode_t0", "t_start", "t_end",
          "behavior_version", "schema_version")


def to_wire(f: Fragment) -> Tuple[np.ndarray, Tuple[Optional[np.ndarray], ...]]:
    """A fragment as (int64 header, arrays): nothing but numpy arrays and None."""
    header = np.array([getattr(f.id, k) for k in HEADER], np.int64)
    return header, tuple(getattr(f, k) for k in ARRAYS)


def from_wire(item: Any) -> Fragment:
    """The fragment a worker sent; ValueError for anything that is not (int64[9], 15 arrays or None). The
    contents are admission's to judge, as with every runner."""
    try:
        header, arrays = item
    except (TypeError, ValueError) as e:
        raise ValueError(f"not a (header, arrays) pair: {type(item).__name__}") from e
    if not isinstance(header, np.ndarray) or header.dtype != np.int64 or header.shape != (len(HEADER),):
        raise ValueError("bad fragment header")
    if not isinstance(arrays, tuple) or len(arrays) != len(ARRAYS):
        raise ValueError("bad fragment arrays")
    if any(a is not None and not isinstance(a, np.ndarray) for a in arrays):
        raise ValueError("a fragment field is not an array")
    fid = FragmentId(**{k: int(v) for k, v in zip(HEADER, header)})
    return Fragment(id=fid, **dict(zip(ARRAYS, arrays)))


def held_ids(frags: Sequence[Fragment]) -> np.ndarray:
    """Identities of fragments (what a link holds), as int64 rows of the header."""
    return np.array([[getattr(f.id, k) for k in HEADER] for f in frags], np.int64).reshape(-1, len(HEADER))


STALE_CHECK = 8  # actor.refresh_lag on Ray: at most this many steps between two looks at the board's answer
STALE_LOOKS = 4  # ... and at least this many looks per rollout


def stale_check_every(rollout_len: int) -> int:
    """Steps between two looks at the snapshot board's answer (``actor.refresh_lag`` on Ray). A look takes the
    answer to the question asked at the previous look, so a rollout of ``rollout_len`` steps sees publications
    up to about ``rollout_len - 2 * every`` steps in: with a fixed 8 a 16-step rollout asked at step 0, looked at
    step 8 and never again, and saw only publications in the round trip after its start."""
    return max(1, min(STALE_CHECK, rollout_len // STALE_LOOKS))


def _wall(t: float) -> float:
    """A moment on this host's monotonic clock as wall time (the learner's host has its own monotonic clock)."""
    return time.time() - (time.monotonic() - t)


CALL_MOMENTS = ("asked", "answered", "stepping", "ended")  # a rollout call's moments (calls.parquet)


class _Poll:
    """The newest version for ``actor.refresh_lag``, without waiting: one question to the board is outstanding at
    a time; each call looks whether it has been answered (then takes the answer and asks again) and returns the
    newest version known. A board that cannot answer (restarting) counts as no news."""

    def __init__(self, board, known: int):
        self.board, self.known, self.ref = board, known, None

    def __call__(self) -> int:
        import ray

        if self.ref is not None:
            ready, _ = ray.wait([self.ref], timeout=0)
            if not ready:
                return self.known
            try:
                self.known = max(self.known, int(ray.get(self.ref)))
            except Exception:  # noqa: BLE001 - the board is being restarted: no news
                pass
        self.ref = self.board.newest_version.remote()
        return self.known


class SnapshotBoard:
    """The newest snapshot's version and object-store reference (a Ray actor next to the learner). From the first
    snapshot on (its own start before that is not the calls') it counts the calls it answers (``newest``: one per
    rollout; ``newest_version``: the polls of actor.refresh_lag) and reads its process's CPU, the wall time and its
    thread's waits for a core (``work``: what laglab.sim's ``board_cpu_s`` is calibrated from)."""

    def __init__(self):
        self.version, self.box = -1, None
        self.answers = self.polls = self.sets = 0
        self.t0: Optional[Tuple[float, float, float]] = None  # (CPU, wall, run delay) at the first snapshot

    def set(self, version: int, box: List[Any]) -> None:
        if self.t0 is None:
            self.t0 = (time.process_time(), time.monotonic(), run_delay_s())
        else:  # (the learner's posts after the first: its CPU is in cpu_s beside the answers')
            self.sets += 1
        self.version, self.box = version, box

    def newest_version(self) -> int:
        self.polls += self.t0 is not None
        return self.version

    def newest(self, known: int) -> Tuple[int, Optional[List[Any]]]:
        """(version, [reference]) or (version, None) when the caller has that version already."""
        self.answers += self.t0 is not None
        return self.version, (None if known == self.version else self.box)

    def work(self) -> Dict[str, float]:
        """Since the first snapshot of this life (a restarted board counts from its own, and answers fewer calls
        than were made): the calls answered and polled, the process's CPU, the wall time, and the run delay of the
        thread that answers them."""
        if self.t0 is None:
            return {"answers": 0, "polls": 0, "sets": 0, "cpu_s": 0.0, "wall_s": 0.0, "delay_s": 0.0}
        return {"answers": self.answers, "polls": self.polls, "sets": self.sets,
                "cpu_s": time.process_time() - self.t0[0],
                "wall_s": time.monotonic() - self.t0[1], "delay_s": run_delay_s() - self.t0[2]}


class RolloutWorker:
    """One life (incarnation) of an actor slot, as a Ray actor (``ray.remote(RolloutWorker)``)."""

    def __init__(self, cfg: Config, actor_id: int, inc: int, shapes: Dict[str, tuple], spec):
        self.cfg, self.actor_id, self.inc = cfg, actor_id, inc
        self.actor = Actor(cfg, actor_id, inc, expect=spec)
        self.codec = SnapshotCodec(shapes, spec.obs_shape)
        kinds = kinds_for(self.actor.spec.masked, recurrent=self.actor.h is not None)
        self.ch = ChaosChannel(cfg.chaos, cfg.seed, actor_id, inc, kinds)
        self.produced = 0
        self.in_hand = 0
        self.version = -1
        self.hang_next = False
        self.killed = False
        self.cpu0 = time.process_time()  # (the worker's CPU before: Ray's start, imports, envs)
        born = process_start()  # (the process's birth, Ray's part of the start done, the actor built: monotonic)
        self.start_t = {"born": born, "booted": BOOT_T, "built": time.monotonic()}
        self.wait0 = run_delay_s()  # (the thread that runs the calls)

    def ready(self) -> Tuple[str, int]:
        """Answers once the worker is constructed (its env made): the learner's start-up check. Returns the
        id of the Ray node it runs on and the worker's niceness (Ray runs its workers at 15 once its part of their
        start is done: the learner, at 0, preempts them where they share its cores)."""
        import os

        import ray

        return ray.get_runtime_context().get_node_id(), os.getpriority(os.PRIO_PROCESS, 0)

    def rollout(self, board) -> Dict[str, Any]:
        """Collect one rollout with the newest snapshot on ``board`` and report it (see the module doc)."""
        import ray

        if self.killed:  # (calls queued behind a scripted kill, before the learner's ray.kill lands)
            raise RuntimeError(f"actor {self.actor_id} (incarnation {self.inc}) was killed")
        t0, cpu0, wait0 = time.perf_counter(), time.process_time(), run_delay_s()
        version, snapshot = ray.get(board.newest.remote(self.version))
        t_answered = time.perf_counter()
        self.actor.stats.ask_s += t_answered - t0  # (the board's turn and its answer's way back)
        if snapshot is not None and self.actor.wants(version):  # (actor.sync_min_lag: maybe keep ours)
            flat = ray.get(snapshot[0])  # the object store's copy on this node, read in place
            self.actor.load(self.codec.decode(version, flat), fetch_s=time.perf_counter() - t0)
            self.version = version
        else:
            self.actor.stats.snapshot_s += time.perf_counter() - t0  # asking is waiting on parameters too
            if self.version < 0:  # a board that restarted and has no snapshot yet: the learner posts it again
                raise RuntimeError("the snapshot board has no snapshot (it restarted); the learner reposts it")
        self.actor.stats.snapshot_cpu_s += time.process_time() - cpu0  # (the call's own CPU on its way: it needs a
        self.actor.stats.snapshot_wait_s += run_delay_s() - wait0  # core, so in a crowd the way waits for one)
        t_stepping = time.perf_counter()
        ro = self.actor.collect(newest=_Poll(board, version), check_every=stale_check_every(self.cfg.actor.rollout_len))
        # the call's version (the snapshot it acted with) and its moments, as perf_counter readings with the one
        # offset that puts them on this host's wall clock (the learner's host has its own clocks): asked the board,
        # held its answer, took the first env step, ended the rollout (calls.parquet)
        call = {"version": self.version, "board_version": version, "offset": time.time() - time.perf_counter(),
                **dict(zip(CALL_MOMENTS, (t0, t_answered, t_stepping, time.perf_counter())))}
        self.produced += ro.steps
        if not ro.fragments:  # stale mid-rollout: produced and thrown away (the learner books it as "refresh")
            return self._report(ro.steps, self.ch.contents(), episodes=ro.episodes, discarded=ro.discarded,
                                call=call,
                                padding=ro.padding, skipped=np.array(ro.skipped, np.int64).reshape(-1, 2))
        self.in_hand += ro.steps
        ch = self.ch
        self._hang_if_scripted()
        if ch.hang_at is not None and self.produced >= ch.hang_at:
            ch.counts.hangs += 1  # reported with this rollout; the next call never answers
            ch.hang_at = None
            self.hang_next = True
        frags = ro.fragments
        kill_after = len(frags)
        if ch.kill_at is not None and self.produced >= ch.kill_at:
            kill_after = int(ch.rng.integers(len(frags)))
        sent = []
        for f in frags[:kill_after]:
            self.in_hand -= f.length
            ch.send(f)
            sent.append((f.id.env_index, f.id.t_end))
        killed = kill_after < len(frags)
        if killed:
            self.killed = True
            ch.counts.kills += 1
            # what the link holds back dies with the process (the learner finds it lost from the watermarks)
            ch.counts.lost_held_steps = sum({(f.id.env_index, f.id.t_start): f.length for f, _ in ch.held}.values())
        out, ch.outbox = ch.outbox, []
        return self._report(ro.steps, ch.contents(), sent, out, ro.episodes, killed, call=call)

    def _report(self, steps: int, held: Sequence[Fragment], sent: Sequence[Tuple[int, int]] = (),
                fragments: Sequence[Fragment] = (), episodes: Sequence[Any] = (), killed: bool = False,
                **rest: Any) -> Dict[str, Any]:
        """An answer to the learner (see the module doc): the worker's books, what it sent into its link and what
        left it, what the link holds, its finished episodes, stats, chaos counts and start-up moments; ``rest``
        adds a stale rollout's discarded steps."""
        return {"inc": self.inc, "produced": self.produced, "in_hand": self.in_hand, "steps": steps,
                "sent": np.array(sent, np.int64).reshape(-1, 2), "fragments": [to_wire(f) for f in fragments],
                "held": held_ids(held), "episodes": [(e.env_index, e.ret, e.length) for e in episodes],
                "stats": self._stats(), "chaos": self.chaos_counts(), "killed": killed,
                "first_step_wall": self._first_step_wall(),
                "start_wall": {k: _wall(t) for k, t in self.start_t.items() if t is not None}, **rest}

    def _stats(self) -> Dict[str, Any]:
        self.actor.stats.cpu_s = time.process_time() - self.cpu0  # the whole worker process, as the process runner
        self.actor.stats.start_cpu_s = self.cpu0
        self.actor.stats.boot_cpu_s = BOOT_CPU_S
        self.actor.stats.cpu_wait_s = run_delay_s() - self.wait0
        return asdict(self.actor.stats)

    def _first_step_wall(self) -> Optional[float]:
        """This worker's first env step on the wall clock (the learner's start-up timeline: a worker's monotonic
        clock is its host's, and on a cluster that is not the learner's)."""
        t = self.actor.first_step_t
        return None if t is None else _wall(t)

    def _hang_if_scripted(self) -> None:
        """After the rollout that reported its scripted hang, this actor answers no call: the learner's supervisor
        kills it after runner.heartbeat_timeout_s."""
        while self.hang_next:
            time.sleep(3600)

    def flush(self) -> Dict[str, Any]:
        """Release what the link holds back (the run is ending): the fragments, as ``rollout`` reports them."""
        if self.killed:
            raise RuntimeError(f"actor {self.actor_id} (incarnation {self.inc}) was killed")
        self._hang_if_scripted()  # (also when the budget ran out as it reported its scripted hang)
        self.ch.flush()
        out, self.ch.outbox = self.ch.outbox, []
        return self._report(0, [], fragments=out)

    def chaos_counts(self) -> Dict[str, Any]:
        c = self.ch.counts
        return {"duplicated": c.duplicated, "reordered": c.reordered, "delayed": c.delayed,
                "dropped_steps": c.dropped_steps, "kills": c.kills, "hangs": c.hangs,
                "corrupted": dict(c.corrupted), "corrupted_steps": dict(c.corrupted_steps),
                "lost_held_steps": c.lost_held_steps}
