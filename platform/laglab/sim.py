"""A discrete-event model of N actors and one learner (simpy): predict throughput, learner utilisation, version
lag, queue depth, data age and the kept fraction of a configuration before running it.

    python -m laglab.sim env=latency actors=16 --json                    # the same overrides as train.py
    python -m laglab.sim env=latency actors=64 --costs costs.json        # costs calibrated from real runs
    python -m laglab.sim --calibrate outputs/<run dir> --out costs.json  # measure the costs of a real run

What it models, each as the runners do it (see runners/driver.py, runners/process_actor.py):

* **Actors**: actor i steps its ``envs_per_actor`` envs one after another for ``rollout_len`` steps: per env step
  a wait (``env.latency_ms`` cycled over the actors, as env=latency sleeps; or a lognormal draw; plus
  ``Costs.step_wait_s``) and CPU work (``Costs.step_cpu_s``), and per rollout step one batched inference (``Costs.infer_s``). Before each rollout an
  actor loads the newest published snapshot if it is more than ``actor.sync_min_lag`` versions ahead
  (``Costs.fetch_s``), pauses while it is ``actor.max_lead_steps`` ahead of the credit the learner last gave it,
  and reserves the rollout from the step budget. It then hands its fragments (one per env) to the queue
  (``Costs.send_s`` each).
* **Slots** (``runner=process``): an actor writes each fragment into a free shared-memory slot of its own
  partition (``runner.slots_per_actor``; auto: two rollouts' worth) and waits while none is free; the learner's
  receiver reads the slots in arrival order, each freed as it is read, and puts the fragment in the queue — under
  ``block``, waiting for room with it in hand while the fragments behind it wait in their slots. So a full queue
  stops an actor only once its slots are full: up to ``slots_per_actor`` fragments per actor wait beyond the
  queue's capacity (the receiver's own CPU is not modelled apart: ``fragment_s`` is the learner's per fragment).
* **The queue**: bounded in fragments and bytes, with the overflow policy (``block`` holds the producer until there
  is room, ``reject`` refuses the new fragment, ``drop_oldest`` evicts the oldest).
* **Ray** (``runner=ray``): the learner drives each actor with rollout calls instead, at most
  ``runner.max_inflight`` outstanding per actor and only while the actor's lead allows (counting the calls in
  flight), each reserving its rollout from the budget when issued; an actor runs its calls one after another
  (loading the newest snapshot first, as above); a receiver takes each answer, puts its fragments in the queue
  (waiting where ``block`` says) and issues that actor's next call. Ray's per-call costs are the snapshot board's
  answer (``board_cpu_s`` on a core: the board is one process, at the workers' niceness, answering the calls one at
  a time, so calls queue for it as the workers grow: at 1 ms an answer it answers at most 1,000 calls a second;
  the board and the learner start on the same core, both being next to the learner), the rest of the round trip
  (``call_s``, a wait), the worker's own CPU on the way (``snapshot_cpu_s``: reading the answer and the snapshot,
  loading it; on its core before its first env step, so in a crowd the way waits for a core: the worker's process
  spent 1.3 ms of CPU a call at 6 workers and 1.7 at 24, its calls' thread 0.8 and 1.1 of it (the rest is mostly
  Ray's I/O thread taking the answer), and that thread waited 0.6 and 7.0 ms for a core, in calls of 3.6-4.8 and
  15.5-17 ms: ActorStats.snapshot_cpu_s and snapshot_wait_s, 2026-12-07), ``call_cpu_s`` (what Ray's own
  processes compute for it, on a core, beside the call), the actor's CPU and the learner's ``fragment_s`` as
  calibrated from a Ray run; ``call_s_mean`` is a call's mean way
  from the asking to its first env step over the middle half of the updates (a run's actors.parquet
  ``snapshot_s`` per ``rollouts`` over the same window); ``board_utilization`` the share of the run the board spent
  answering (NaN for other runners: where it nears 1 the board, not the learner, sets the pace). Ray's workers run
  at nice 15
  (``worker_niceness``, set once Ray's part of their start is done), so the learner preempts them as it does the
  process runner's actors. The board's round
  trip is drawn per call from an exponential of mean ``call_s``: an assumption, chosen (2026-12-06) because a
  constant put workers of one latency in lockstep (mean lag +19% / +36% against real runs at 12 / 10 workers); the
  real per-call times vary less (a coefficient of variation of 0.4-0.85 in those runs, the exponential's is 1) and
  grow with the worker count (means of 3.8 ms at 6 workers, 9.3 at 18, 15 at 24: actors.parquet's snapshot_s over
  updates where one call completed), which the model does not have (``call_s`` is the least crowded run's). An actor
  waiting for its next call counts as throttled (``actor_throttle_frac``). Ray starts its workers a few at a time
  (its raylet: as many as the machine has CPUs, each until it registers; Ray's part of a start, ``boot_cpu_s`` and
  ``boot_wait_s``, at nice 0, leaving the nice-15 workers on its core their weight's share; then the rest of
  ``start_cpu_s`` (plus ``start_crowding_s`` per actor per core: it grows with the crowd) beside the other
  starting workers, then
  ``start_wait_s``, then its first call: :func:`simulate`'s ``ray_start``; each worker draws its own wait, spread
  by ``start_wait_sd_s`` as the calibration runs' workers' waits spread: with few uniform workers those phases
  decide, for the whole run, which calls start inside an update and so get the version before, and a run's mean lag
  is a draw of them, 0.484-0.609 over 25 runs of 4 workers): ``start_spread_s`` is the model's time
  from the first worker's first env step to the last's (a run's summary: ``startup.all_actors_stepping -
  startup.first_env_step``) and ``start_mean_s`` the workers' mean first env step after they were asked for (a
  run's ``startup_actors.first_env_step`` less ``startup.actors_started``); both NaN where the model has no start
  (the process runner, or costs without ``start_cpu_s`` / ``start_wait_s``), and the whole run's ``sps`` counts it.
  Workers Ray started before they were asked for (at ``ray.init``: in runs here the snapshot board took one and
  the first actor another, also at ``runner.cpus_per_actor=1`` with 16 workers) are ``prestarted``: they only take
  up their actors. A publication reaches the board only after the learner has posted it (``publish_s`` of its CPU:
  encoding, the object store, the board's call) and the board has taken the post in turn with the calls; a call
  acts with the version the board answered, so the calls asked in between get the version before (a trace of 8
  workers, 2026-12-07: the post done 2.1 ms after the update ends, the board holding the new version 3.5 ms after
  it; answers received up to 9 ms after it carried the version before; in one run of 8 workers every batch held
  one call two versions old, which a model that published at the update's end never had). Not modelled: the answer's trip back (about 3 ms, median, at 2 workers: a temporary trace, 2026-12-06), and
  the receiver thread sharing the learner's GIL.
* **The learner**: takes fragments one at a time (``Costs.fragment_s`` each: receiving, admission, books,
  staging), drops those older than ``learner.max_policy_lag`` versions, updates once per batch
  (``Costs.update_s``), publishes every ``learner.broadcast_every`` updates (the snapshot ``actor.fixed_lag``
  publications back, if set) with the actors' credit; when it finds the queue empty for ``runner.poll_s`` it
  grants credit for what it has taken (as ``serve`` does).
* **CPU**: ``Costs.cores`` CPUs shared by everything that computes. The learner preempts actors (process actors
  run at nice 19, Ray's workers at 15); actors queue for a core among themselves (``actor_cpu_wait_frac``: their
  share of time runnable without a core). Waiting on an env (a sleep) holds no core. Each core keeps its own run
  queue, as Linux does (``_Cores``, from ``perf sched`` traces of real runs: ``benchmarks/sched_trace.py``): a
  waking task queues on the core it last ran on even when another is idle (it moves with ``Costs.wake_move_p``,
  0.07-0.21 in six traces here), and a core whose queue empties idles while tasks wait on the other until a tick
  pulls one, so a machine stands partly idle with tasks runnable (``idle_while_queued_frac``: 5-9% of the cores'
  time at 16-64 process actors in the traces, 4-7% in the model) and crowded actors wait longer than in one shared
  pool (``--sched pool``, the model until 2026-12-06, which over-predicted SPS by 6-17% at 56-64 process actors).
  Actors crowded on cores cost each other: their CPU per env step is ``step_cpu_s + crowding_s x actors / cores``
  (a line fitted over calibration runs at two counts; measured growth, not a model of caches or the scheduler).

Not modelled (refused, so no prediction silently ignores them): ``actor.refresh_lag``,
``learner.max_kl_behavior`` (they depend on the policy's KL), chaos faults.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .config import Config, ConfigError, Overflow, batch_fragments


class SimError(ValueError):
    """A cost, distribution or setting the model cannot take (the message names it and the allowed range)."""


META = ("calibrated_from", "calibrated_actors_per_core", "wait_share", "notes")  # (a costs file's facts about itself,
# not costs: wait_share is the share of the waits for a core taken out of step_wait_s)


@dataclass
class Costs:
    """What each piece of work costs, in seconds (calibrate with :func:`calibrate` from real runs)."""
    update_s: float = 0.010  # learner: one update on one batch (metrics.parquet learner/compute_s)
    fragment_s: float = 60e-6  # learner: receiving, admitting, booking and staging one fragment
    infer_s: float = 150e-6  # actor: one batched forward pass over its envs (per rollout step)
    step_cpu_s: float = 20e-6  # actor: CPU per env step besides the env's wait (a CPU-bound env's whole step)
    step_wait_s: float = 0.0  # actor: wall time per env step beyond the configured latency that holds no core
                              # (env=latency: the sleep's overshoot, less the waits for a core it held in the
                              # calibration runs: the model makes its own)
    fetch_s: float = 1e-3  # actor: fetching and loading a snapshot
    send_s: float = 20e-6  # actor: handing one fragment over
    crowding_s: float = 0.0  # actor: CPU per env step added by each actor per core (step_cpu_s + crowding_s x
                             # actors / cores): what actor processes sharing cores cost each other (caches, the
                             # scheduler, Ray's per-worker threads); fitted by --calibrate over runs at two counts
    call_s: float = 0.0  # runner=ray: an actor's wait per call for the snapshot board's answer and the snapshot
                         # (a round trip through Ray: holds no core)
    call_cpu_s: float = 0.0  # runner=ray: CPU per call outside the actors, the learner and the board (Ray's raylet
                             # and GCS; the board's too in costs without board_cpu_s): held on a core, beside the
                             # actor's wait
    board_cpu_s: float = 0.0  # runner=ray: the snapshot board's CPU per answer (summary transport.queue.board): one
                              # process at the workers' niceness answering the calls one at a time; a call waits
                              # for its answer (call_s is the rest of its round trip)
    publish_s: float = 0.0  # runner=ray: the learner's own time posting a publication to the board (encoding the
                            # snapshot, putting it into the object store, calling the board: summary
                            # transport.queue publish_s / publishes; wall time, run as its CPU), on its core after
                            # the update; the board then takes the post in turn with the calls (board_cpu_s),
                            # answering the version before until it has (2026-12-07, 8 workers: 1.6 ms, done 2.1 ms
                            # after the update; answers received up to 9 ms after it carried the version before)
    snapshot_cpu_s: float = 0.0  # runner=ray: the worker's own CPU on a call's way (asking the board, reading the
                                 # snapshot from the object store, loading it: ActorStats.snapshot_cpu_s per call),
                                 # on its core before its first env step: in a crowd the way waits for a core
    wake_move_p: float = 0.16  # the cores: the chance that a task waking to find its core busy and another idle
                               # moves to the idle one (else it queues on its own): a fact of the kernel, measured
                               # with benchmarks/sched_trace.py: an effective parameter (this VM: 0.07-0.21 in six
                               # traces at 16-64 actors; 0.16 from the first three, as the tool then counted)
    startup_s: float = 0.0  # from the run's start (its wall clock: after the tracker) to the actors' first env step
                            # (counted in sps, as a run does); runner=ray with a worker start (start_cpu_s,
                            # start_wait_s): to asking Ray for the workers (startup.actors_started)
    finish_s: float = 0.0  # from the last update to the run's end (its wall clock: the runner's drain and teardown;
                           # on Ray its shutdown too, about 1.4 s here), counted in sps, as a run does. Calibrated
                           # net of the few ms between the tracker's clock and the run's, which startup_s holds
                           # (the two cancel in the model's wall): set by hand, give the teardown less that
    start_cpu_s: float = 0.0  # runner=ray: CPU a worker process spends before its first call (Ray's worker start,
                              # imports, envs: ActorStats.start_cpu_s)
    boot_cpu_s: float = 0.0  # runner=ray: the part of start_cpu_s that is Ray's own worker start (up to taking up
                             # its actor: ActorStats.boot_cpu_s), run as many at a time as Ray has CPUs, at nice 0;
                             # the rest (laglab's imports, the envs) runs beside it at the workers' niceness. 0: no
                             # split (the whole start under the limit, at the workers' niceness: costs before it)
    boot_wait_s: float = 0.0  # runner=ray: the rest of a worker's turn among Ray's starting workers beyond boot_cpu_s
                              # (its turn ends as it registers: the births of the workers after it, cores later)
    start_wait_s: float = 0.0  # runner=ray: a worker's wait after that CPU until its first call (holds no core)
    start_wait_sd_s: float = 0.0  # runner=ray: how far that wait spreads over the workers (a standard deviation):
                                  # each worker draws its own, normal about start_wait_s and no less than 0 (which
                                  # keeps the median and, where the spread nears the wait, raises the mean a little)
    start_crowding_s: float = 0.0  # runner=ray: CPU added to the rest of each worker's start (past boot_cpu_s) by
                                   # each actor per core: start_cpu_s + start_crowding_s x actors / cores (a line
                                   # fitted by --calibrate over runs at two counts, as crowding_s)
    prestarted: float = 0.0  # runner=ray: how many of the workers Ray had started before they were asked for (at
                             # ray.init; the snapshot board takes another): their own part done, they take up their
                             # actors at once (the calibration runs' workers born before startup.actors_started)
    cores: float = 2.0  # CPUs shared by the learner and the actors

    def check(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise SimError(f"costs.{f.name} must be a number >= 0, got {v!r}")
        if self.update_s <= 0:
            raise SimError(f"costs.update_s must be > 0, got {self.update_s!r}")
        if self.wake_move_p > 1:
            raise SimError(f"costs.wake_move_p is a probability: 0 to 1, got {self.wake_move_p!r}")
        if self.boot_cpu_s > self.start_cpu_s:
            raise SimError(f"costs.boot_cpu_s is part of costs.start_cpu_s: 0 to {self.start_cpu_s!r}, got "
                           f"{self.boot_cpu_s!r}")
        if self.prestarted != int(self.prestarted):
            raise SimError(f"costs.prestarted is a count of workers: an integer >= 0, got {self.prestarted!r}")
        if self.cores < 1 or self.cores != int(self.cores):
            raise SimError(f"costs.cores must be an integer >= 1, got {self.cores!r}")

    @classmethod
    def from_dict(cls, d: Dict[str, float]) -> "Costs":
        if not isinstance(d, dict):
            raise SimError(f"costs must be a JSON object of name: seconds (as --calibrate prints), got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known - set(META))
        if unknown:
            raise SimError(f"unknown cost {unknown[0]!r}; known: {', '.join(sorted(known))}")
        vals = {}
        for k, v in d.items():
            if k in known:
                try:
                    vals[k] = float(v)
                except (TypeError, ValueError):
                    raise SimError(f"costs.{k} must be a number, got {v!r}") from None
        c = cls(**vals)
        c.check()
        return c


@dataclass
class Latency:
    """Per env step wait, in ms: ``fixed`` cycles ``env.latency_ms`` over the actors (as env=latency does);
    ``lognormal`` draws each step from a lognormal with median ``median_ms`` and log-space sd ``sigma``."""
    kind: str = "fixed"
    per_actor_ms: List[float] = field(default_factory=list)
    median_ms: float = 0.0
    sigma: float = 0.0

    def check(self) -> None:
        if self.kind not in ("fixed", "lognormal"):
            raise SimError(f"latency kind must be fixed or lognormal, got {self.kind!r}")
        if self.kind == "fixed" and any(not math.isfinite(x) or x < 0 for x in self.per_actor_ms):
            raise SimError(f"latency per actor must be numbers >= 0 ms (negative support), got {self.per_actor_ms}")
        if self.kind == "lognormal":
            if not (math.isfinite(self.median_ms) and self.median_ms > 0):
                raise SimError(f"lognormal latency median must be > 0 ms, got {self.median_ms!r}")
            if not (math.isfinite(self.sigma) and self.sigma >= 0):
                raise SimError(f"lognormal latency sigma must be >= 0, got {self.sigma!r}")
            if self.median_ms > 1e6 or self.sigma > 5:
                raise SimError(f"lognormal latency: median <= 1e6 ms and sigma <= 5 (got {self.median_ms!r}, "
                               f"{self.sigma!r}): beyond that the draws are not a simulator's step times")
        if self.kind == "fixed" and any(x > 1e6 for x in self.per_actor_ms):
            raise SimError(f"latency per actor must be <= 1e6 ms, got {self.per_actor_ms}")

    @classmethod
    def parse(cls, text: str) -> "Latency":
        """``fixed:2,4,8`` (ms, cycled over actors) or ``lognormal:<median ms>,<sigma>``."""
        kind, _, rest = text.partition(":")
        try:
            nums = [float(x) for x in rest.split(",") if x.strip()]
        except ValueError:
            raise SimError(f"--latency {text!r}: numbers expected, e.g. fixed:2,4 or lognormal:2,0.5") from None
        if kind == "fixed":
            lat = cls("fixed", per_actor_ms=nums)
        elif kind == "lognormal" and len(nums) == 2:
            lat = cls("lognormal", median_ms=nums[0], sigma=nums[1])
        else:
            raise SimError(f"--latency {text!r}: allowed fixed:<ms>[,<ms>...] or lognormal:<median ms>,<sigma>")
        lat.check()
        return lat


UNMODELLED = {"actor.refresh_lag": lambda c: c.actor.refresh_lag is not None,
              "learner.max_kl_behavior": lambda c: c.learner.max_kl_behavior is not None,
              "chaos": lambda c: c.chaos.name != "none"}


class _Queue:
    """The bounded fragment queue (fragments and bytes, overflow policy), with events for waiting parties."""

    def __init__(self, env, capacity: int, max_bytes: int, policy: Overflow, frag_bytes: int):
        self.env, self.capacity, self.max_bytes, self.policy = env, capacity, max_bytes, policy
        self.frag_bytes = frag_bytes
        self.items: Deque[Tuple[int, int, int, float]] = collections.deque()  # (actor, steps, version, t_put)
        self.nonempty = env.event()
        self.room = env.event()
        self.area = 0.0  # integral of depth over time
        self._t = 0.0
        self.dropped_steps = 0
        self.rejected_steps = 0

    def _track(self) -> None:
        now = self.env.now
        self.area += len(self.items) * (now - self._t)
        self._t = now

    def fits(self) -> bool:
        return len(self.items) < self.capacity and (len(self.items) + 1) * self.frag_bytes <= self.max_bytes

    def put(self, item):
        """A generator: yields while ``block`` holds the producer."""
        if self.frag_bytes > self.max_bytes:
            self.rejected_steps += item[1]
            return
        while not self.fits():
            if self.policy == Overflow.block:
                yield self.room
                continue
            if self.policy == Overflow.reject:
                self.rejected_steps += item[1]
                return
            self._track()
            self.dropped_steps += self.items.popleft()[1]
        self._track()
        self.items.append(item)
        if not self.nonempty.triggered:
            self.nonempty.succeed()

    def wake(self) -> None:
        if not self.nonempty.triggered:
            self.nonempty.succeed()

    def get(self):
        self._track()
        item = self.items.popleft()
        if not self.items:
            self.nonempty = self.env.event()
        if not self.room.triggered:
            self.room.succeed()
            self.room = self.env.event()
        return item


class _Cores:
    """Cores with a run queue each, as Linux keeps them. What it does is what ``perf sched`` showed on this VM
    (kernel 6.18, HZ=250; ``benchmarks/sched_trace.py``, 16-64 actors of env=latency on two cores): a task that
    wakes goes to the core it last ran on (its home: actor i starts on core i + 1 mod cores, the learner on core 0)
    if that core is idle; if it is busy and another core idle, the task moves there only with probability
    ``Costs.wake_move_p`` (traced 0.07-0.21: mostly it queues on its busy home while the other core idles). A
    core whose queue empties goes idle and does not take work queued elsewhere (in the traces a core that went idle
    while the other had tasks queued took one of them next in 0.4-1.1% of cases) except at the scheduler tick (4 ms),
    when an idle core takes one task waiting on another. Every 32 ms (a busy core's periodic balance: 2 ms x
    busy_factor 16) one task moves its home from the core whose tasks used the most CPU lately (a 32 ms half-life,
    as PELT) to the one whose used the least, where that narrows the gap. The learner (priority 0) preempts an
    actor on the core it wakes on; the preempted actor waits first in that core's queue. ``idle_queued`` adds up
    core-seconds idle while a task waited on another core; ``placed``: wake-ups that found the home busy and a
    core idle, and how many of them moved there. Not modelled: a task waking on the learner's core takes it for a
    moment (0.11-0.20 ms, 4-25% of the learner's time in traces here: reports/sim_validation/sched_trace.txt), which
    update_s, the update's wall time, holds; a model with it was tried (ray_traces.txt, section 6) and not taken."""

    TICK_S = 0.004  # CONFIG_HZ=250: an idle core's balance
    BALANCE_TICKS = 8  # a busy core's periodic load balance: every 32 ms
    HALF_LIFE_S = 0.032  # the tasks' recent CPU (PELT's half-life)

    def __init__(self, env, n: int, move_p: float, rng):
        self.env, self.n, self.move_p, self.rng = env, n, move_p, rng
        self.cur: List[Optional[list]] = [None] * n  # per core: [priority, process, task] of what runs on it
        self.q: List[list] = [[] for _ in range(n)]  # per core: waiting [priority, order, event, process, task]
        self.home: Dict[object, int] = {}
        self.recent: Dict[object, List[float]] = {}  # task -> [its CPU time, decayed; when]
        self.seq = 0
        self.idle_queued = 0.0
        self.placed = [0, 0]
        self._t = 0.0
        env.process(self._tick())

    def _track(self) -> None:
        now = self.env.now
        if now > self._t and any(self.q):
            self.idle_queued += (now - self._t) * sum(1 for c in range(self.n) if self._idle(c))
        self._t = now

    def _idle(self, c: int) -> bool:
        return self.cur[c] is None and not self.q[c]

    def place(self, task, first: int) -> int:
        """The core a waking task queues on (``first``: its core before it has run)."""
        h = self.home.get(task, first % self.n)
        if self._idle(h):
            return h
        idle = [c for c in range(self.n) if self._idle(c)]
        if not idle:
            return h
        self.placed[0] += 1
        if self.rng.random() < self.move_p:
            self.placed[1] += 1
            return idle[0]
        return h

    def _grant(self, c: int) -> None:
        prio, _, ev, proc, task = self.q[c].pop(0)
        self.cur[c] = [prio, proc, task]
        ev.succeed(c)

    def wait(self, c: int, priority: int, ev, proc, task, front: bool) -> None:
        """Queue for core ``c``: granted at once if it is free; the learner preempts an actor running on it;
        ``front``: a preempted task, first among its priority."""
        self._track()
        self.seq += 1
        self.q[c].append([priority, -self.seq if front else self.seq, ev, proc, task])
        self.q[c].sort(key=lambda x: (x[0], x[1]))
        run = self.cur[c]
        if run is not None and priority < run[0]:
            run[1].interrupt("preempted")
            self.cur[c] = None
        if self.cur[c] is None:
            self._grant(c)

    def release(self, c: int, proc) -> None:
        if self.cur[c] is None or self.cur[c][1] is not proc:  # (an invariant: a task frees only its own core)
            raise SimError(f"the model's cores went wrong at t={self.env.now:.6f}s: core {c} freed by a task not "
                           "running on it (a bug in laglab.sim)")
        self._track()
        self.cur[c] = None
        if self.q[c]:
            self._grant(c)

    def _used(self, task, now: float, add: float = 0.0) -> float:
        r = self.recent.setdefault(task, [0.0, now])
        r[0] = r[0] * 0.5 ** ((now - r[1]) / self.HALF_LIFE_S) + add
        r[1] = now
        return r[0]

    def _balance(self) -> None:
        now = self.env.now
        used = {task: self._used(task, now) for task in self.home}
        load = [0.0] * self.n
        for task, c in self.home.items():
            load[c] += used[task]
        hi = max(range(self.n), key=load.__getitem__)
        lo = min(range(self.n), key=load.__getitem__)
        gap, best = load[hi] - load[lo], None
        for task, c in self.home.items():  # the task that best halves the gap (not the one running)
            u = used[task]
            if c == hi and 0 < u < gap and not any(r is not None and r[2] == task for r in self.cur):
                if best is None or abs(gap - 2 * u) < abs(gap - 2 * best[1]):
                    best = (task, u)
        if best is None:
            return
        self.home[best[0]] = lo
        for item in self.q[hi]:  # waiting: it moves with its home
            if item[4] == best[0]:
                self._track()
                self.q[hi].remove(item)
                self.wait(lo, item[0], item[2], item[3], item[4], False)
                return

    def _tick(self):
        ticks = 0
        while True:
            yield self.env.timeout(self.TICK_S)
            ticks += 1
            for c in range(self.n):  # an idle core takes one task waiting on the longest queue
                src = max(range(self.n), key=lambda k: len(self.q[k]))
                if self._idle(c) and self.q[src]:
                    self._track()
                    item = self.q[src].pop()
                    self.wait(c, item[0], item[2], item[3], item[4], False)
            if ticks % self.BALANCE_TICKS == 0:
                self._balance()

    def run(self, seconds: float, priority: int, waited: Optional[List[float]], task, first: int):
        import simpy

        proc = self.env.active_process
        left, c, front = seconds, None, False
        while True:
            t0 = self.env.now
            if c is None:  # (a preempted task stays on its core's queue)
                c = self.place(task, first)
            ev = self.env.event()
            self.wait(c, priority, ev, proc, task, front)
            try:
                c = yield ev
            except simpy.Interrupt:  # preempted after the core was granted (maybe another: a pull), before this
                c = ev.value  # process resumed on it: it waits first in that core's queue
                if waited is not None:
                    waited[0] += self.env.now - t0
                front = True
                continue
            if waited is not None:
                waited[0] += self.env.now - t0
            start = self.env.now
            try:
                yield self.env.timeout(left)
            except simpy.Interrupt:  # the learner took the core
                left -= self.env.now - start
                front = True
                if left > 1e-12:
                    continue
                break  # (taken the instant the work ended: the core is the learner's, nothing to release)
            self.release(c, proc)
            break
        self.home[task] = c
        self._used(task, self.env.now, seconds)


def _cpu(env, cpu, seconds: float, priority: int, waited: Optional[List[float]] = None, who=None):
    """Hold a core for ``seconds`` of work; a preempted actor resumes the rest later. ``waited[0]`` adds up the
    time spent runnable without a core (queued, or preempted and queued again), as the kernel's run delay does.
    ``cpu`` None: a core of its own, always free (no queue, no preemption: just the time); a :class:`_Cores`:
    per-core run queues, ``who`` the task (an actor's index, "learner", "board", ("call", i)); else one shared
    pool."""
    import simpy

    if cpu is None:
        if seconds > 1e-12:  # (as the pool does: no work, no event)
            yield env.timeout(seconds)
        return
    if isinstance(cpu, _Cores):
        if seconds > 1e-12:
            first = 1 + (who if isinstance(who, int) else who[1]) if not isinstance(who, str) else 0  # (actor i:
            # core i+1; the learner and the board: core 0)
            yield from cpu.run(seconds, priority, waited, who, first)
        return
    left = seconds
    while left > 1e-12:
        with cpu.request(priority=priority, preempt=priority == 0) as req:
            t0 = env.now
            try:
                yield req
            except simpy.Interrupt:  # preempted after the core was granted, before this process resumed on it
                if waited is not None:
                    waited[0] += env.now - t0
                continue
            if waited is not None:
                waited[0] += env.now - t0
            start = env.now
            try:
                yield env.timeout(left)
                left = 0.0
            except simpy.Interrupt:
                left -= env.now - start


def check(cfg: Config, costs: Costs, latency: Optional[Latency]) -> None:
    if cfg.runner.name.value == "sync":
        raise SimError("runner=sync is not modelled: it collects and updates in turn in one thread (no queue, no "
                       "overlap); laglab.sim models actor processes (runner=process, runner=ray)")
    if cfg.runner.name.value == "thread":
        raise SimError("runner=thread is not modelled: its actors share the learner's interpreter (the GIL), "
                       "which the model's cores do not; use runner=process or runner=ray")
    if cfg.runner.name.value == "process" and getattr(cfg.runner, "actor_nice", 19) == 0:
        raise SimError("runner.actor_nice=0 is not modelled: the model lets the learner preempt actors, as "
                       "nice-19 actor processes let it; leave runner.actor_nice at its default")
    if not (cfg.runner.poll_s > 0):
        raise SimError(f"runner.poll_s must be > 0 for the model (the learner's starved wait), got {cfg.runner.poll_s}")
    if cfg.runner.name.value == "process":  # a slot pool the runner would refuse
        from .runners.slots import pool_refusal

        refusal = pool_refusal(cfg)
        if refusal:
            raise SimError(refusal)
    costs.check()
    if latency is not None:
        latency.check()
    for key, used in UNMODELLED.items():
        if used(cfg):
            raise SimError(f"{key} is not modelled by laglab.sim (it depends on the policy); leave it unset")


SCHEDULERS = ("cores", "pool")


def draws(cfg: Config, costs: Costs, latency: Optional[Latency] = None, sched: str = "cores") -> bool:
    """Whether the model's prediction depends on its seed: lognormal latencies, Ray's per-call round trips or its
    workers' waits before their first call, or per-core queues that tasks leave by chance (shared cores,
    ``0 < wake_move_p < 1``)."""
    if latency is not None and latency.kind == "lognormal":
        return True
    if cfg.runner.name.value == "ray" and (costs.call_s > 0 or (costs.start_wait_sd_s > 0 and ray_starts(costs))):
        return True
    return sched == "cores" and not own_cores(cfg, costs) and 0 < costs.wake_move_p < 1


def ray_starts(costs: Costs) -> bool:
    """Whether the model has Ray's workers start (runner=ray with any of the start's costs)."""
    return costs.start_cpu_s > 0 or costs.start_wait_s > 0 or costs.start_crowding_s > 0


def own_cores(cfg: Config, costs: Costs) -> bool:
    """A core for the learner and one for each actor, and no Ray per-call CPU beside them (how many of those run at
    once depends on the timing): nothing ever queues for a core."""
    ray = cfg.runner.name.value == "ray"
    board = 1 if ray and costs.board_cpu_s > 0 else 0  # (the board: one process, a core of its own)
    return costs.cores >= cfg.actors + 1 + board and not (ray and costs.call_cpu_s > 0)


NICE_WEIGHTS = {0: 1024, 15: 36}  # the kernel's CFS weights of those niceness levels (sched_prio_to_weight)
START_SLICE_S = 0.004  # a Ray worker's start CPU is served in slices of this (the kernel's tick: time slices at
                       # the workers' niceness are a few ms), so the running workers on its core take turns with it


def simulate(cfg: Config, costs: Optional[Costs] = None, latency: Optional[Latency] = None, seed: int = 0,
             frag_bytes: Optional[int] = None, contend: bool = False, sched: str = "cores",
             trace: bool = False) -> Dict[str, object]:
    """Run the model to the end of ``cfg.total_env_steps``; returns its predictions (see :data:`OUTPUTS`). With a
    core for the learner and one for each actor (and no per-call CPU on Ray, which runs beside its actor) nothing
    ever queues for one, and the model skips the cores' queues altogether (a cluster of 4096 actors: minutes, not
    an hour); ``contend=True`` keeps them anyway (the tests check the two agree). ``sched``: ``cores`` (a run
    queue per core, as Linux keeps them: :class:`_Cores`) or ``pool`` (the cores as one pool any task takes the
    first free core of: the model until 2026-12-06). ``trace`` (``runner=ray``): the result also holds ``call_trace``,
    a row per answered call with the moments a run's ``calls.parquet`` has, and ``update_trace``, each update's start
    and the end of its publication (a run's ``learner/started_t`` and ``learner/published_t``)."""
    import simpy

    if sched not in SCHEDULERS:
        raise SimError(f"sched must be one of {', '.join(SCHEDULERS)}, got {sched!r}")

    costs = costs or Costs()
    if latency is None:
        latency = Latency("fixed", per_actor_ms=list(cfg.env.latency_ms) or [0.0])
    check(cfg, costs, latency)
    rng = np.random.default_rng(seed)
    call_rng = np.random.default_rng([seed, 1])  # (Ray's round trips: their own stream, apart from the latencies')
    start_rng = np.random.default_rng([seed, 3])  # (Ray's workers' waits to their first call: their own stream)
    env = simpy.Environment()
    N, E, T = cfg.actors, cfg.actor.envs_per_actor, cfg.actor.rollout_len
    if own_cores(cfg, costs) and not contend:
        cpu = None
    elif sched == "cores":
        cpu = _Cores(env, int(costs.cores), costs.wake_move_p, np.random.default_rng([seed, 2]))
    else:
        cpu = simpy.PreemptiveResource(env, capacity=int(costs.cores))
    per_rollout = E * T
    total = int(cfg.total_env_steps)
    need = batch_fragments(cfg)
    max_lead = cfg.actor.max_lead_steps
    if frag_bytes is None:  # obs float32 [T, 4] plus the per-step arrays: the order of a small-obs fragment
        frag_bytes = T * (4 * 4 + 8 + 4 * 5 + 2) + 9 * 8
    q = _Queue(env, cfg.transport.capacity, cfg.transport.max_bytes, Overflow(cfg.transport.policy), frag_bytes)
    st = {"version": 0, "reserved": 0, "produced": 0, "updates": 0, "learner_busy": 0.0, "kept": 0, "dropped_lag": 0,
          "trained": 0, "done_actors": 0, "end": 0.0, "fetches": 0, "throttle_s": 0.0, "paused": 0,
          "blocked_s": 0.0, "in_slots": 0, "board_busy": 0.0}
    history: Deque[int] = collections.deque([0], maxlen=(cfg.actor.fixed_lag or 0) + 1)
    published = [0]  # the version actors are given
    on_board = [0]  # ray: the version the snapshot board answers (a publication reaches it after the learner's post)
    consumed = [0] * N  # per actor: steps the learner has taken (learner.consumed)
    sent = [0] * N  # per actor: steps handed to the queue (whatever became of them)
    credit = [0] * N  # per actor: the credit the actor sees (from the last publication or grant)
    news = [env.event()]  # triggered at each publication or grant
    lags: List[int] = []
    ages: List[float] = []
    run_delay = [0.0]  # the actors' time runnable without a core
    marks: List[Tuple[float, int]] = []  # (time, trained steps) at each update
    finished = env.event()
    # runner=ray: the learner drives each actor with rollout calls, at most runner.max_inflight outstanding and
    # only while its lead allows (counting the calls in flight); a receiver takes each answer, puts its fragments
    # in the queue and issues the next call (runners/ray.py: issue, receive)
    ray = cfg.runner.name.value == "ray"
    calls = [simpy.Store(env) for _ in range(N)] if ray else []  # per actor: "call" or "stop" tokens
    inflight = [0] * N  # ray: calls issued to actor i and not yet answered
    answered = [0] * N  # ray: steps of actor i's answered calls (the learner's view of what it produced)
    stopped = [False] * N
    held = [False] * N  # ray: actor i has no call and the throttle gives it none (as a paused process actor)
    answers = simpy.Store(env) if ray else None
    firsts: List[float] = []  # ray: each worker's first env step
    call_times: List[Tuple[float, float]] = []  # ray: (when, how long) each call took from asking to its first env step
    call_rows: List[Dict[str, float]] = []  # trace: each answered call's moments (a run's calls.parquet)
    update_rows: List[Dict[str, float]] = []  # trace: each update's start and the end of its publication
    board = simpy.Resource(env, capacity=1) if ray else None  # ray: the snapshot board answers one call at a time
    starting = None  # ray: the workers' start (Ray's raylet starts as many at a time as the machine has CPUs)
    if ray and ray_starts(costs):
        starting = simpy.Resource(env, capacity=int(costs.cores))
    # runner=process: each actor's free slots, and the pipe its fragments' headers travel in to the receiver
    slotted = cfg.runner.name.value == "process"
    if slotted:
        from .runners.slots import slots_per_actor

        per_actor = slots_per_actor(cfg)
        slots = [simpy.Container(env, capacity=per_actor, init=per_actor) for _ in range(N)]
        pipe = simpy.Store(env)

    def issue(i: int) -> None:
        while not stopped[i] and inflight[i] < cfg.runner.max_inflight:
            if max_lead is not None and answered[i] + inflight[i] * per_rollout - credit[i] >= max_lead:
                held[i] = inflight[i] == 0  # (the throttle, as throttle_state counts the calls in flight)
                return
            if st["reserved"] + per_rollout > total:
                if inflight[i] == 0:  # the budget is spent and nothing is owed: the actor is done
                    stopped[i], held[i] = True, False
                    calls[i].put("stop")
                return
            st["reserved"] += per_rollout
            inflight[i] += 1
            held[i] = False
            calls[i].put("call")

    def ring() -> None:
        ev, news[0] = news[0], env.event()
        ev.succeed()
        for i in range(N if ray else 0):  # new credit: calls a paused actor may now get
            issue(i)

    def step_wait(i: int, n: int) -> float:
        if latency.kind == "fixed":
            ms = latency.per_actor_ms[i % len(latency.per_actor_ms)] if latency.per_actor_ms else 0.0
            return n * ms / 1000.0
        return float(rng.lognormal(math.log(latency.median_ms), latency.sigma, size=n).sum()) / 1000.0

    step_cpu = costs.step_cpu_s + costs.crowding_s * N / costs.cores  # (actors sharing cores cost each other)
    start_more = costs.start_crowding_s * N / costs.cores  # (and so do their starts: laglab's imports, the envs)

    def collect(i: int):
        for _ in range(T):  # one batched inference, then each env in turn: its CPU, then its wait
            for e in range(E):  # (each wait ends in a wake-up that queues for a core again, as each env's sleep does)
                yield from _cpu(env, cpu, (costs.infer_s if e == 0 else 0.0) + step_cpu, 1, run_delay, i)
                w = step_wait(i, 1) + costs.step_wait_s
                if w > 0:
                    yield env.timeout(w)
        st["produced"] += per_rollout

    def refresh(i: int, version: int, newest: Optional[int] = None):
        """An actor's snapshot before a rollout: the newest (``newest``: on Ray the board's answer; else the
        version published last), loaded (at its CPU cost) when it has none yet or it lags the newest by more than
        ``actor.sync_min_lag`` versions; the version it acts with."""
        newest = published[0] if newest is None else newest
        if newest != version and (version < 0 or newest - version > cfg.actor.sync_min_lag):
            yield from _cpu(env, cpu, costs.fetch_s, 1, run_delay, i)
            st["fetches"] += 1
            return newest
        return version

    def sliced(i: int, seconds: float, priority: int = 1):
        """CPU in slices that take turns with the other tasks of its priority on a core, as the kernel's time
        slices do (priority 1: the workers' niceness; 0: the learner's). At priority 0 (Ray's part of a start, at
        nice 0) each slice is followed by the share the kernel's weights leave the workers waiting on its core:
        nice 0 against nice 15 is 1024 : 36 (sched_prio_to_weight), so with k of them waiting it gives up 36 k /
        1024 of its slice (seven: a fifth of the core) rather than holding them off outright."""
        while seconds > 1e-12:
            piece = min(seconds, START_SLICE_S)
            yield from _cpu(env, cpu, piece, priority, None, i)
            seconds -= piece
            if priority == 0 and isinstance(cpu, _Cores) and seconds > 1e-12:
                c = cpu.home.get(i)
                waiting = sum(1 for item in cpu.q[c] if item[0] >= 1) if c is not None else 0
                if waiting:
                    yield env.timeout(piece * NICE_WEIGHTS[15] * waiting / NICE_WEIGHTS[0])

    def ray_start(i: int):
        """A Ray worker's start, in two parts. Ray's own runs ``cores`` workers at a time, each until it registers
        with the raylet (the raylet's ``maximum_startup_concurrency``, the smaller of the machine's CPUs and the
        instance's, which laglab's local instance makes at least the machine's; on a cluster, per node, which the
        model does not know): ``boot_cpu_s`` of CPU and ``boot_wait_s`` more, at nice 0 (a trace of a start,
        2026-12-06: Ray lowers a worker's priority to 15 only later), so it takes turns with the learner and
        preempts the workers already running. Then the worker takes up its actor (laglab's imports, its envs: the
        rest of ``start_cpu_s``) at the workers' niceness beside every other starting worker, and waits
        ``start_wait_s`` (the GCS handing it its actor, the learner's first call) before its first call. The first
        ``prestarted`` workers were started by Ray before they were asked for: they only take up their actors. Costs
        without ``boot_cpu_s`` (calibrated before this split) run the whole start under the limit at the workers'
        niceness, as the model did then."""
        if i >= costs.prestarted:  # (a worker Ray started before it was asked for has only its actor to take up)
            with starting.request() as turn:
                yield turn
                if costs.boot_cpu_s > 0:
                    yield from sliced(i, costs.boot_cpu_s, priority=0)
                else:  # (costs from before the split: the whole start here)
                    yield from sliced(i, costs.start_cpu_s)
                if costs.boot_wait_s > 0:
                    yield env.timeout(costs.boot_wait_s)
        yield from sliced(i, max(0.0, costs.start_cpu_s - (costs.boot_cpu_s or costs.start_cpu_s)) + start_more)
        wait = costs.start_wait_s
        if costs.start_wait_sd_s > 0:
            wait = max(0.0, wait + costs.start_wait_sd_s * float(start_rng.standard_normal()))
        if wait > 0:
            yield env.timeout(wait)

    def ray_actor(i: int):
        version, stepped = -1, False
        if starting is not None:
            yield from ray_start(i)
        while True:
            t0 = env.now
            token = yield calls[i].get()
            st["throttle_s"] += env.now - t0  # (idle: no call from the learner)
            if token == "stop":
                break
            t_call = env.now
            if costs.call_cpu_s > 0:  # (Ray's own processes compute for the call, on a core, beside it)
                env.process(_cpu(env, cpu, costs.call_cpu_s, 1, None, ("call", i)))
            if costs.board_cpu_s > 0:  # (the board answers one call at a time, at the workers' niceness)
                yield from on_the_board()
            # (the version the board answered: the snapshot is read and loaded after; costs from before the board's
            # figures have call_s as the whole round trip, the version read at its end, as then)
            newest = on_board[0] if costs.board_cpu_s > 0 else None
            if costs.call_s > 0:  # (the rest of the round trip: the newest version as the answer arrives)
                yield env.timeout(call_rng.exponential(costs.call_s))
            t_answered = env.now
            # (the worker's own part: reading the answer and the snapshot, loading it; on its core, so in a crowd it
            # waits for one, as each of the real way's wake-ups does)
            yield from _cpu(env, cpu, costs.snapshot_cpu_s, 1, run_delay, i)
            version = yield from refresh(i, version, newest)
            call_times.append((t_call, env.now - t_call))
            row = {"actor": i, "incarnation": i, "version": version, "board_version": version if newest is None
                   else newest, "asked": t_call, "answered": t_answered, "stepping": env.now} if trace else None
            if not stepped:
                stepped = True
                firsts.append(env.now)  # (its first env step comes next)
            yield from collect(i)
            if trace:
                row["ended"] = env.now
            yield from _cpu(env, cpu, E * costs.send_s, 1, run_delay, i)
            yield answers.put((i, version, env.now, row))
        st["done_actors"] += 1
        q.wake()

    def on_the_board():
        """The board's turn for one call (an answer, or the learner's post of a publication): one at a time, on a
        core at the workers' niceness."""
        with board.request() as turn:
            yield turn
            t_b = env.now
            yield from _cpu(env, cpu, costs.board_cpu_s, 1, None, "board")
            st["board_busy"] += env.now - t_b

    def post(version: int):
        """ray: the learner's post of a publication reaches the board in turn with the calls; until then the board
        answers the version before."""
        if costs.board_cpu_s > 0:
            yield from on_the_board()
        on_board[0] = max(on_board[0], version)

    def receiver():
        while True:
            i, version, t_sent, row = yield answers.get()
            if trace:
                call_rows.append({**row, "received": env.now})
            for _ in range(E):
                t0 = env.now
                yield from q.put((i, T, version, t_sent))
                sent[i] += T
                st["blocked_s"] += env.now - t0
            inflight[i] -= 1
            answered[i] += per_rollout
            issue(i)

    def actor(i: int):
        version, produced = -1, 0
        while True:
            version = yield from refresh(i, version)
            if max_lead is not None and produced - credit[i] >= max_lead and st["reserved"] + per_rollout <= total:
                t0 = env.now
                st["paused"] += 1
                yield news[0]
                st["paused"] -= 1
                st["throttle_s"] += env.now - t0
                continue
            if st["reserved"] + per_rollout > total:
                break
            st["reserved"] += per_rollout
            yield from collect(i)
            produced += per_rollout
            yield from _cpu(env, cpu, E * costs.send_s, 1, run_delay, i)
            for _ in range(E):
                t0 = env.now
                if slotted:  # a free slot of its own (blocked while every one waits for the receiver), then the header
                    yield slots[i].get(1)
                    st["in_slots"] += 1
                    pipe.put((i, T, version, env.now))
                else:
                    yield from q.put((i, T, version, env.now))
                sent[i] += T  # handed over (admitted, refused or later evicted: its fate is the queue's)
                st["blocked_s"] += env.now - t0
        st["done_actors"] += 1
        q.wake()  # a learner waiting for data: it may be time to end

    def slot_receiver():
        """runner=process: headers in arrival order; each slot is copied out (freed) before its fragment waits for
        room in the queue, and the headers behind it wait."""
        while True:
            i, steps, version, _ = yield pipe.get()
            slots[i].put(1)
            yield from q.put((i, steps, version, env.now))
            st["in_slots"] -= 1  # (counted until it is in the queue: the learner ends only once none is on its way)

    def learner_cpu(seconds: float):
        """The learner's work (a fragment, an update, a post) on a core: it preempts the actors."""
        t0 = env.now
        yield from _cpu(env, cpu, seconds, 0, None, "learner")
        st["learner_busy"] += env.now - t0

    def learner():
        staged: List[Tuple[int, int, int, float]] = []
        stuck = [-1]  # what had been produced at the last starved poll with every actor paused
        while True:
            if not q.items:
                if st["done_actors"] == N and st["in_slots"] == 0:
                    break
                got = yield q.nonempty | env.timeout(cfg.runner.poll_s)
                if not q.items:
                    if q.nonempty in got:  # woken by a finishing actor, not by data
                        q.nonempty = env.event()
                    else:
                        paused = st["paused"] + sum(held)
                        if paused + st["done_actors"] == N and stuck[0] == st["produced"]:
                            # starved twice with every actor paused and nothing produced between: a model bug
                            raise SimError(f"the model is stuck at t={env.now:.3f}s: every actor is paused and "
                                           "the learner has nothing to take")
                        stuck[0] = st["produced"] if paused + st["done_actors"] == N else -1
                        grant = [max(c, x) for c, x in zip(consumed, sent)]
                        if credit != grant:  # starved for poll_s: credit what was taken or handed over (as
                            credit[:] = grant  # starved_credits: refused or evicted data must not hold actors)
                            ring()
                    continue
            item = q.get()
            ages.append(env.now - item[3])
            yield from learner_cpu(costs.fragment_s)
            a, steps, behavior, _ = item
            consumed[a] += steps
            lag = st["version"] - behavior
            if cfg.learner.max_policy_lag is not None and lag > cfg.learner.max_policy_lag:
                st["dropped_lag"] += steps
                continue
            st["kept"] += steps
            staged.append(item)
            if len(staged) < need:
                continue
            started, closed_by, posted = env.now, staged[-1][0], float("nan")
            yield from learner_cpu(costs.update_s)
            lags.extend(st["version"] - s[2] for s in staged)
            st["trained"] += sum(s[1] for s in staged)
            marks.append((env.now, st["trained"]))
            staged = []
            st["version"] += 1
            st["updates"] += 1
            st["end"] = env.now
            if st["updates"] % cfg.learner.broadcast_every == 0:
                if ray and costs.publish_s > 0:  # (encoding, the object store, the board's call: then the credit)
                    yield from learner_cpu(costs.publish_s)
                history.append(st["version"])
                published[0] = history[0]
                if ray:
                    env.process(post(history[0]))
                credit[:] = consumed
                ring()
                posted = env.now
            if trace:
                update_rows.append({"started": started, "version": st["version"], "closed_by": closed_by,
                                    "published": posted})
        st["end"] = max(st["end"], env.now)
        finished.succeed()

    for i in range(N):
        env.process(ray_actor(i) if ray else actor(i))
    if slotted:
        env.process(slot_receiver())
    if ray:
        env.process(receiver())
        for i in range(N):
            issue(i)
    env.process(learner())
    env.run(until=finished)
    q._track()
    end = max(st["end"], 1e-12)
    wall = end + costs.startup_s + costs.finish_s
    lag_arr = np.asarray(lags, float)
    hist = np.bincount(lag_arr.astype(int)) if len(lag_arr) else np.zeros(0, int)
    offered = st["kept"] + st["dropped_lag"]
    return {
        "sps": st["produced"] / wall,
        "sps_steady": steady_rate([m[0] for m in marks], [m[1] for m in marks]),
        "lag_mean": float(lag_arr.mean()) if len(lag_arr) else float("nan"),
        "lag_p50": float(np.percentile(lag_arr, 50)) if len(lag_arr) else float("nan"),
        "lag_p95": float(np.percentile(lag_arr, 95)) if len(lag_arr) else float("nan"),
        "lag_hist": hist.tolist(),
        "queue_depth_mean": q.area / end,
        "age_s_mean": float(np.mean(ages)) if ages else float("nan"),
        "learner_utilization": st["learner_busy"] / end,
        "board_utilization": st["board_busy"] / end if ray else float("nan"),
        "kept_fraction": st["kept"] / offered if offered else float("nan"),
        "env_steps": st["produced"], "trained_steps": st["trained"], "staged_at_end_steps": st["kept"] - st["trained"],
        "updates": st["updates"], "wall_s": wall,
        "dropped_steps": {"lag": st["dropped_lag"], "overflow": q.dropped_steps},
        "rejected_steps": q.rejected_steps,
        "actor_throttle_frac": st["throttle_s"] / (N * end), "actor_blocked_frac": st["blocked_s"] / (N * end),
        "actor_cpu_wait_frac": run_delay[0] / (N * end),
        "idle_while_queued_frac": (cpu.idle_queued / (cpu.n * end)) if isinstance(cpu, _Cores) else 0.0,
        "wake_moved_frac": (cpu.placed[1] / cpu.placed[0] if isinstance(cpu, _Cores) and cpu.placed[0]
                            else float("nan")),
        "snapshot_loads": st["fetches"],
        "call_s_mean": steady_mean(call_times, [m[0] for m in marks]),
        "start_spread_s": (max(firsts) - min(firsts)) if starting is not None and len(firsts) == N else float("nan"),
        "start_mean_s": float(np.mean(firsts)) if starting is not None and len(firsts) == N else float("nan"),
        **({"call_trace": call_rows, "update_trace": update_rows} if trace else {}),
    }


def steady_mean(timed: Sequence[Tuple[float, float]], times: Sequence[float]) -> float:
    """The mean of the values that started within the middle half of the updates (as :func:`steady_rate`'s
    window; a run's actors.parquet over the same window: ``call_s_mean``), or of every one where there are too few
    updates; NaN where there is none."""
    if len(times) >= 4:
        i, j = steady_window(len(times))
        timed = [x for x in timed if times[i] <= x[0] <= times[j]]
    return float(np.mean([x[1] for x in timed])) if timed else float("nan")


def steady_rate(times: Sequence[float], trained: Sequence[float]) -> float:
    """Steady-state SPS: trained steps per second between the update a quarter of the way through a run's updates
    and the one three quarters through (the middle half). The actors' start (Ray starts its workers a few at a
    time: 32 of them took ~10 s here) and their staggered finish stay outside it; the same rule for a real run
    (metrics.parquet's ``wall_time`` and ``transport/admitted`` per update) and the model (its updates). NaN with
    fewer than 4 updates."""
    t, n = np.asarray(times, float), np.asarray(trained, float)
    if len(t) < 4:
        return float("nan")
    i, j = steady_window(len(t))
    return float((n[j] - n[i]) / (t[j] - t[i])) if t[j] > t[i] else float("nan")


def steady_window(updates: int) -> Tuple[int, int]:
    """The rows (0-based) of the updates a quarter and three quarters of the way through ``updates``: the steady
    middle half that :func:`steady_rate` and the calibration's readings of other processes' CPU are taken over."""
    return updates // 4, (3 * updates) // 4


OUTPUTS = ("sps", "sps_steady", "lag_mean", "lag_p50", "lag_p95", "queue_depth_mean", "age_s_mean",
           "learner_utilization", "kept_fraction")


# ---- calibration from real runs -----------------------------------------------------------------------------
def calibrate(run_dirs: Sequence[str | Path]) -> Dict[str, object]:
    """Costs measured from real runs (medians over the runs): the learner's compute per update and per
    fragment, the actors' inference, env steps and snapshot loads, and the start-up to the first env step. An
    env step's time beyond its configured latency is ``step_wait_s`` for env=latency (a sleep's overshoot holds no
    core) and ``step_cpu_s`` for every other env (the whole step computes). Where the run measured its actor
    processes' CPU (``cpu_s``: process and Ray runners), ``step_cpu_s`` is that CPU besides inference and snapshot
    loads per env step (env code, bookkeeping, sends, polls: what makes many actors contend for cores), and the
    latency env's ``step_wait_s`` is what its steps took beyond the latency and their own CPU (``env_cpu_s``),
    less the waits for a core it held where the runs measured them over their middle half (actors.parquet
    ``cpu_wait_s``, on Ray less the calls' ways' ``snapshot_wait_s``): a sleeping step wakes to wait for a core
    inside the step, so its overshoot grows with the waits (63 us + 0.735 x the waits per step over nine Ray runs
    of 4-32 workers, 2026-12-07), and the model, which makes its own waits, would count the calm runs' twice (at
    6 workers 32 us of the 106 a step). The share is the slope over runs whose waits differ by 1.5x or more
    (:func:`wait_share`), taken from every run or from none; with one density the overshoot stays as measured.
    Ray runs: each call's round trip to the snapshot board is ``call_s`` (a wait), less the worker's own CPU over
    it where the run measured that (``ActorStats.snapshot_cpu_s``: ``snapshot_cpu_s`` per call, a cost of its own,
    taken out of the CPU per env step too; older runs leave it in ``cpu_s``) and less the board's CPU per answer
    where every least crowded run measured it (summary ``transport.queue.board``: ``board_cpu_s``, also taken out
    of ``call_cpu_s``) and, where the run logged the machine's CPU (metrics ``cpu/machine_busy_s``: a local
    instance), ``call_cpu_s`` is what every other process computed per call over the middle half of the updates (Ray's raylet,
    GCS and snapshot board; the slope over runs whose call rates are >= 1.5x apart, else the median ratio; a rough
    figure: on this VM /proc/stat reads 5-9% below the processes' own CPU clocks, which moves it by as much as it
    is). Runs at two or more actor counts also give ``crowding_s``: the growth of the actors' whole CPU per env step
    (CPU time) with the actors per core (:func:`crowding_fit`); without a growth ``step_cpu_s`` is the median over
    the runs. What is measured as wall time (updates, fragments, inference, waits) comes from the runs with the
    fewest actors per core: among crowded actors it also holds waits for a core, which the model makes itself. Ray
    runs that measured their workers' start split the start-up: ``startup_s`` up to asking Ray for the workers,
    then per worker. With each worker's moments (summary ``startup_actors``, ``ActorStats.boot_cpu_s``; workers
    Ray started at ``ray.init`` left out): Ray's part of its start CPU (``boot_cpu_s``), the rest of its turn among
    Ray's starting workers, which ends as it registers (``boot_wait_s``: the births of the workers ``cores`` behind
    it tell), its whole start CPU (``start_cpu_s``), and its waits from registering to taking up its actor and from
    its actor built to its first env step (``start_wait_s``, less the call's round trip; how far those waits
    spread within a run, ``start_wait_sd_s``: a robust standard deviation pooled over the runs); over runs at two or more
    counts, the start past Ray's part as a line in actors per core (``start_crowding_s``, as ``crowding_s``). The
    run's end past its last update (summary ``wall_time_s`` against the last metrics row's ``wall_time``: the drain,
    the teardown, on Ray its shutdown) is ``finish_s``, the median over every run (it does not grow with the crowd). Runs before those moments
    (only ``ActorStats.start_cpu_s``): ``start_cpu_s`` and the first worker's remaining way to its first env step
    (``start_wait_s``). The least crowded runs give one split for all: the one with the moments where every one has
    them, else the older one where every one has that, else none (``startup_s`` to the first env step, as for every
    other runner). All
    runs must be of one runner and one ``actor.envs_per_actor``. Calibrate on a quiet machine: under load every cost grows."""
    import pandas as pd
    import yaml

    from .config import usable_cpus

    here = float(usable_cpus())  # (for runs that did not record theirs: the calibrating machine's)
    cores_of: Dict[str, float] = {}  # run dir -> the CPUs it could use (its provenance's usable_cpus)
    costs: List[Tuple[float, Dict[str, float]]] = []  # (actors per core, its costs) of each run
    envs: Optional[int] = None  # actor.envs_per_actor: one per calibration (inference is per batch of envs)
    crowded: List[Tuple[float, float]] = []  # (actors per core, the actors' CPU per env step) of each run
    others: List[Tuple[float, float]] = []  # Ray runs: (calls per second, the other processes' CPU per second)
    used = []
    runners: Dict[str, str] = {}
    if not run_dirs:
        raise SimError("--calibrate needs at least one run dir")
    for d in map(Path, run_dirs):
        s = json.loads((d / "summary.json").read_text())
        if s.get("status") != "completed":
            raise SimError(f"{d}: not a completed run (status {s.get('status')!r})")
        m = pd.read_parquet(d / "metrics.parquet")
        cfg = yaml.safe_load((d / ".hydra" / "config.yaml").read_text())
        if (cfg.get("learner") or {}).get("max_kl_behavior") is not None:
            raise SimError(f"{d}: ran with learner.max_kl_behavior (its KL checks are in the learner's time per "
                           "fragment, and the model does not have them): calibrate on runs without it")
        if "learner/compute_s" not in m or not len(m):
            raise SimError(f"{d}: metrics.parquet has no learner/compute_s rows (a run with no updates, or from an "
                           "older laglab): calibrate on a completed run of this version")
        E = int(cfg["actor"]["envs_per_actor"])
        lat = [float(x) for x in (cfg["env"].get("latency_ms") or [])]
        runner = str((cfg.get("runner") or {}).get("name", ""))
        runners[str(d)] = runner
        if len(set(runners.values())) > 1:
            raise SimError("calibrate on runs of one runner (their costs differ): got " +
                           ", ".join(f"{k}: {v}" for k, v in runners.items()))
        if envs is not None and E != envs:
            raise SimError(f"calibrate on runs of one actor.envs_per_actor (inference is per batch of envs): got "
                           f"{envs} and {E} ({d})")
        envs = E
        c: Dict[str, float] = {"update_s": float(m["learner/compute_s"].median())}
        if "learner/offer_s" in m:  # the learner's time per fragment, plus the receiver thread's (process runner)
            frags = float(s["transport"]["admitted_fragments"])
            recv = float(m["transport/receive_s"].iloc[-1]) if "transport/receive_s" in m else 0.0  # (net of
            # time blocked on a full queue: the process runner logs it so)
            c["fragment_s"] = (float(m["learner/offer_s"].sum()) + recv) / max(frags, 1.0)
        cores_of[str(d)] = float((s.get("provenance") or {}).get("usable_cpus") or here)
        if len(set(cores_of.values())) > 1:
            raise SimError("calibrate on runs of one machine size (the model has one core count): the runs could use "
                           + ", ".join(f"{v:g} CPUs ({k})" for k, v in cores_of.items()))
        cores = cores_of[str(d)]
        stats = {int(k): a for k, a in (s.get("actors_stats") or {}).items()}  # actor id -> its stats
        crowding = len(stats) / cores
        steps = sum(a.get("steps", 0) for a in stats.values())
        if steps:
            infer = sum(a.get("infer_s", 0.0) for a in stats.values())
            c["infer_s"] = infer / (steps / E)
            env_s = sum(a.get("env_s", 0.0) for a in stats.values())
            fetch = sum(a.get("snapshot_s", 0.0) for a in stats.values())
            cpu = sum(a.get("cpu_s", 0.0) for a in stats.values())
            env_cpu = sum(a.get("env_cpu_s", 0.0) for a in stats.values())
            own_process = runner in ("process", "ray")
            if runner == "ray":  # each call asks the board (a Ray round trip) and maybe loads: a wait per call, whose
                calls = sum(a.get("rollouts", 0) for a in stats.values())  # CPU is in the actor's cpu_s
                c["call_s"] = fetch / max(calls, 1)  # (the whole way here: its own CPU and waits come out below)
                own = sum(a.get("snapshot_cpu_s", 0.0) for a in stats.values())  # (runs from 2026-12-07 05:00 on)
                c["_own"] = ((own / max(calls, 1), sum(a.get("snapshot_wait_s", 0.0) for a in stats.values())
                              / max(calls, 1), steps / max(calls, 1)) if own > 0 else None)
                c["fetch_s"] = 0.0
                queue = (s.get("transport") or {}).get("queue") or {}
                board = dict(queue.get("board") or {})
                if float(queue.get("publishes", 0)) > 0:  # (the learner's post of each publication: from 2026-12-07)
                    c["_publish"] = float(queue.get("publish_s", 0.0)) / float(queue["publishes"])
                board.setdefault("wall_s", s.get("wall_time_s", 0.0))  # (the first runs with the board's figures,
                # 2026-12-07 00:55-01:45, had no wall_s or delay_s: the run's wall time, no waits)
                if (board.get("answers", 0) >= 0.9 * calls and float(board.get("cpu_s", 0)) > 0
                        and float(board["wall_s"] or 0) > 0):  # (a board that restarted answered fewer: none)
                    c["_board"] = {k: float(board.get(k, 0.0)) for k in ("answers", "sets", "cpu_s", "wall_s",
                                                                          "delay_s")}
                fetch = 0.0
                o = others_over_steady(d, m)
                if o is not None:
                    others.append(o)
            # the actors' CPU besides inference and snapshot loads (env code, sends, polls), per env step, where
            # the run measured its actors' processes; else (older runs, in-process runners) the env's time
            step_cpu = max(0.0, cpu - infer - fetch) / steps if cpu > 0 and own_process else None
            if lat:  # env=latency sleeps: its steps' time beyond the latency and their own CPU held no core
                wait = sum(lat[i % len(lat)] / 1000.0 * a.get("steps", 0) for i, a in stats.items())
                in_env = env_cpu if env_cpu > 0 else (step_cpu or 0.0) * steps  # (older runs: all of it)
                c["step_wait_s"] = max(0.0, (env_s - wait - in_env) / steps)
                shot = steady_overshoot(d, m, lat, runner)
                if shot is not None:  # (the same over the middle half, with the waits for a core the steps held)
                    c["_shot"] = shot
                if step_cpu is not None:
                    c["step_cpu_s"] = step_cpu
            else:
                c["step_cpu_s"] = max(env_s / steps, step_cpu or 0.0)
            if step_cpu is not None:  # the actors' whole CPU per env step, inference included (it grows too):
                crowded.append((crowding, max(0.0, cpu - fetch) / steps))  # CPU time only, no wall time
            loads = sum(a.get("loads", 0) for a in stats.values())
            if loads and runner != "ray":
                c["fetch_s"] = fetch / loads
        if s.get("wall_time_s") is not None and "wall_time" in m:  # the last update to the run's end (the drain,
            c["_finish"] = float(s["wall_time_s"]) - float(m["wall_time"].iloc[-1])  # the teardown): every run's
        su = s.get("startup") or {}
        origin = su.get("tracker", su.get("learner"))  # (the run's wall clock, and its sps, start after the tracker)
        if su.get("first_env_step") is not None and origin is not None:
            c["startup_s"] = max(0.0, float(su["first_env_step"]) - float(origin))
        start_cpu = [float(a.get("start_cpu_s", 0.0)) for a in stats.values()]
        slots = s.get("startup_actors") or {}
        if runner == "ray" and su.get("actors_started") is not None and c.get("startup_s") is not None \
                and start_cpu and min(start_cpu) > 0:  # (runs that measured their workers' start)
            cpu0 = float(np.median(start_cpu))
            asked = max(0.0, float(su["actors_started"]) - float(origin))
            born, booted, built, first = ({int(k): float(t) for k, t in (slots.get(w) or {}).items()}
                                          for w in ("born", "booted", "built", "first_env_step"))
            # (workers Ray started before they were asked for, at ray.init, waited for an actor: left out)
            fresh = [k for k in first if k in born and k in booted and k in built and k in stats
                     and born[k] >= float(su["actors_started"]) - 0.1]  # (the mark now precedes the asking; in
            # runs before 2026-12-06 22:10 it followed it, the first births up to 30 ms before it; prestarted
            # workers are born at ray.init, here 0.9 s before)
            # runs before the workers' moments (and each run, for a calibration that mixes them): up to asking for
            # the workers is start-up; then each worker's start CPU and a wait: the first worker's way to its first
            # env step, less its start CPU (the median worker's) and the first call's round trip; clamped at 0 (a
            # worker Ray had started before it was asked for)
            c["_start_old"] = {"startup_s": asked, "start_cpu_s": cpu0,
                               "start_wait_s": max(0.0, c["startup_s"] - asked - cpu0 - c.get("call_s", 0.0))}
            if fresh and all(stats[k].get("boot_cpu_s", 0.0) > 0 for k in fresh):
                # each worker's moments (startup_actors): up to asking for the workers is start-up; a worker's turn
                # among Ray's starting workers ends as it registers, when the worker cores behind it is born (the
                # median of those gaps; with too few workers, its own birth to taking up its actor): boot_cpu_s of
                # CPU (Ray's part, up to taking up its actor) and boot_wait_s more; its start CPU is start_cpu_s;
                # from its turn's end to taking up its actor, and from its actor built to its first env step, less
                # the first call's round trip (the model's own call_s), is start_wait_s (medians over the workers)
                births = sorted(born[k] for k in fresh)
                gaps = [b - a for a, b in zip(births, births[int(cores):])]
                turn = float(np.median(gaps if gaps else [booted[k] - born[k] for k in fresh]))
                boot = float(np.median([stats[k]["boot_cpu_s"] for k in fresh]))
                rests = [stats[k]["start_cpu_s"] - stats[k]["boot_cpu_s"] for k in fresh]
                c["_rest"] = float(np.median(rests))  # (the start past Ray's part: it grows with the crowd)
                c["_start"] = {
                    "startup_s": asked, "start_cpu_s": cpu0, "boot_cpu_s": min(boot, cpu0),
                    "prestarted": float(sum(1 for k in first if k in born and k not in fresh)),
                    "boot_wait_s": max(0.0, turn - boot),
                    "_waits": [booted[k] - born[k] - turn + first[k] - built[k] for k in fresh]}
                c["_start"]["start_wait_s"] = max(0.0, float(np.median(c["_start"]["_waits"])) - c.get("call_s", 0.0))
        costs.append((crowding, c))
        used.append(str(d))
    # every cost measured as wall time (an update, a fragment, an inference, a wait) also holds the waits for a core
    # among crowded actors: those come from the least crowded runs (medians over them); the actors' CPU, measured
    # as CPU time, is a line over every run (crowding_s), and the other processes' a slope over every call rate
    least = min(x for x, _ in costs)
    calm = [c for x, c in costs if x == least]
    newer = [c.pop("_start", None) for c in calm]  # (not costs: the start's figures, below)
    older = [c.pop("_start_old", None) for c in calm]
    boards = [c.pop("_board", None) for _, c in costs]  # (every run's: none is a cost of its own)
    rests = [(x, c.pop("_rest")) for x, c in costs if "_rest" in c]  # (the runs with the workers' moments)
    owns = [c.pop("_own", None) for _, c in costs]  # (Ray: per call, the worker's own CPU and waits on its way)
    posts = [c.pop("_publish", None) for _, c in costs]  # (Ray: the learner's post of a publication)
    shots = [c.pop("_shot", None) for _, c in costs]  # (env=latency: per step, the waits for a core and the overshoot)
    ends = [c.pop("_finish") for _, c in costs if "_finish" in c]  # (each run's end past its last update)

    def calm_of(per_run: List) -> List:  # (a per-run list's entries of the least crowded runs)
        return [v for (x, _), v in zip(costs, per_run) if x == least]

    board, board_wait = board_costs([b for b in boards if b is not None], calm_of(boards))
    out: Dict[str, object] = {k: float(np.median([c[k] for c in calm if k in c]))
                              for k in dict.fromkeys(k for c in calm for k in c)}
    # one definition of startup_s for all: the split with the workers' moments where every calm run has them, else
    # the older split where every calm run has that; else startup_s to the first env step, as every runner's
    for starts in (newer, older):
        if all(s is not None for s in starts):
            out.update({k: float(np.median([s[k] for s in starts])) for k in sorted(starts[0]) if k[0] != "_"})
            if "prestarted" in out:  # (a count: the median of two runs may fall between)
                out["prestarted"] = float(math.floor(out["prestarted"]))
            # how far the workers' waits spread within a run: what sets the phases of few uniform workers, and so
            # which lag state a run falls into. A robust standard deviation (1.4826 x the median distance from each
            # run's median, pooled over the calm runs): a worker's wait is what is left of its way after a turn
            # measured from the others' births, and the last-born worker's can read far off (-0.4 s in a slow
            # start, where the others read 0.10 and 0.13), which would make a plain one 0.3 s. (Mostly one calm run
            # of 5 fresh workers: an estimate good to about a half; the waits hold the first call's round trip,
            # whose own draw the model adds again, 0.1-0.4 ms against tens of ms)
            waits = [np.asarray(s["_waits"], float) for s in starts if len(s.get("_waits", [])) >= 3]
            if waits:
                far = np.concatenate([np.abs(w - np.median(w)) for w in waits])
                out["start_wait_sd_s"] = float(1.4826 * np.median(far))
            break
    rest_fit = crowding_fit(rests) if "boot_cpu_s" in out else None
    if rest_fit is not None:  # the rest of a start as a line in actors per core, as the actors' CPU per env step
        out["start_crowding_s"] = rest_fit[1]
        out["start_cpu_s"] = float(out["boot_cpu_s"]) + rest_fit[0]
    if board is not None and "call_s" in out:  # the board's answer, on a core, is part of the call's round trip;
        out["board_cpu_s"] = board  # its CPU and its waits for a core in the calm runs are the model's own to make
        out["call_s"] = max(0.0, float(out["call_s"]) - board - board_wait)
    cpu_runs = [c["step_cpu_s"] for _, c in costs if "step_cpu_s" in c]
    if cpu_runs:  # (measured as CPU time where the run measured its actors' processes: every run's counts)
        out["step_cpu_s"] = float(np.median(cpu_runs))
    fit = crowding_fit(crowded)
    if fit is not None:  # the line is the whole CPU per env step; step_cpu_s is what it holds besides inference
        at_zero, out["crowding_s"] = fit
        out["step_cpu_s"] = max(0.0, at_zero - float(out.get("infer_s", 0.0)) / envs)
    if owns and all(o is not None for o in owns) and "call_s" in out and "step_cpu_s" in out:  # (every run measured
        # it, or none counts: no mix of gross and net figures)
        # the worker's own CPU on a call's way, a cost of its own on a core (the calm runs'): out of the call's wait
        # with the waits for a core it had there (the model makes its own), and out of the CPU per env step as the
        # same CPU per step at every density (the line's growth stays in it: steps per call are the config's)
        calm_own = calm_of(owns)
        own_cpu = float(np.median([o[0] for o in calm_own]))
        out["snapshot_cpu_s"] = own_cpu
        out["call_s"] = max(0.0, float(out["call_s"]) - own_cpu - float(np.median([o[1] for o in calm_own])))
        out["step_cpu_s"] = max(0.0, float(out["step_cpu_s"]) - own_cpu / float(np.median([o[2] for o in owns])))
    if ends:  # the end does not grow with the crowd (Ray 2026-12-07: 1.38 s at 6 workers, 1.41 at 24, medians over
        out["finish_s"] = max(0.0, float(np.median(ends)))  # fourteen calibrations): every run's, the median
    calm_posts = calm_of(posts)
    if calm_posts and all(p is not None for p in calm_posts):  # (every least crowded run timed its posts, or none
        out["publish_s"] = float(np.median(calm_posts))  # counts)
    share = wait_share(shots) if "step_wait_s" in out and all(x is not None for x in shots) else None
    if share is not None:  # the sleep's overshoot holds that share of the waits for a core: the model makes its own,
        # so it is the calm runs' overshoot less their waits' share (else a prediction of the calm run itself would
        # count its waits twice: 2026-12-07, 32 us of 106 a step at 6 Ray workers)
        calm_shot = calm_of(shots)
        out["step_wait_s"] = float(np.median([max(0.0, over - share * w) for w, over in calm_shot]))
        out["wait_share"] = share
    called = [o for o in others if o[0] > 0]  # (a run with no calls has no CPU per call)
    if called:  # the slope over runs at two call rates (what is left at none is the machine's idle noise)
        rate = np.asarray([o[0] for o in called])
        busy = np.asarray([o[1] for o in called])
        if spread_enough(rate):
            per_call = float(np.polyfit(rate, busy, 1)[0])
        else:  # (one rate, or repeats of one count: their slope would be noise)
            per_call = float(np.median(busy / rate))
        out["call_cpu_s"] = max(0.0, per_call - (board or 0.0))  # (the board's own CPU is board_cpu_s)
    out["cores"] = cores
    out["calibrated_from"] = used
    out["calibrated_actors_per_core"] = [min(x for x, _ in costs), max(x for x, _ in costs)]
    return out


def steady_overshoot(run_dir: Path, m, lat: Sequence[float], runner: str) -> Optional[Tuple[float, float]]:
    """env=latency: (the actors' waits for a core per env step outside their calls' ways, the steps' time beyond
    the latency and the env's own CPU per env step) over the middle half of the updates; None where the run did not
    measure them (actors.parquet ``cpu_wait_s``, ``env_cpu_s``; on Ray ``snapshot_wait_s``)."""
    cols = ["steps", "env_s", "env_cpu_s", "cpu_wait_s"] + (["snapshot_wait_s"] if runner == "ray" else [])
    steady = steady_actor_deltas(run_dir, m, cols)
    if steady is None or not lat:
        return None
    d = steady[0]
    steps = float(d["steps"].sum())
    if steps <= 0 or float(d["env_cpu_s"].sum()) <= 0 or float(d["cpu_wait_s"].sum()) <= 0:
        return None
    slept = sum(lat[int(i) % len(lat)] / 1000.0 * float(n) for i, n in d["steps"].items())
    waits = float(d["cpu_wait_s"].sum()) - (float(d["snapshot_wait_s"].sum()) if runner == "ray" else 0.0)
    return max(0.0, waits) / steps, (float(d["env_s"].sum()) - slept - float(d["env_cpu_s"].sum())) / steps


SPREAD = 1.5  # a slope is fitted over x values this far apart or more (closer ones give a slope of noise)


def spread_enough(x: Sequence[float]) -> bool:
    """Whether a slope over runs at these x values (call rates, answer rates, waits per step) means anything: two or
    more, all positive, the largest at least :data:`SPREAD` times the smallest. Repeats of one count differ by a
    few percent, and a slope over them is their noise."""
    x = np.asarray(x, float)
    return len(x) >= 2 and bool(x.min() > 0) and bool(x.max() >= SPREAD * x.min())


def wait_share(points: Sequence[Tuple[float, float]]) -> Optional[float]:
    """The share of the actors' waits for a core that falls inside their env steps' time: the slope of the
    overshoot per step over the waits per step (``points``: (waits, overshoot) of runs at two or more densities,
    least squares), at most 1; None where the runs' waits do not differ by 1.5x or the slope is not positive. A
    sleeping step wakes to wait for a core inside the env's step, the rest of the waits fall in inference and the
    rollout's bookkeeping: 0.735 over nine Ray runs of 4-32 workers here (2026-12-07; an overshoot of 63 us with
    none), and 0.60 between the 6- and 24-worker calibration runs of that set."""
    w = np.asarray([p[0] for p in points], float)
    o = np.asarray([p[1] for p in points], float)
    if not spread_enough(w):
        return None
    slope = float(np.polyfit(w, o, 1)[0])
    return min(slope, 1.0) if slope > 0 else None


def board_costs(every: Sequence[Dict[str, float]], calm: Sequence[Optional[Dict[str, float]]]):
    """(``board_cpu_s``, the board's wait for a core per answer in the calm runs), or (None, 0) unless every least
    crowded run measured its board (summary ``transport.queue.board``, from 2026-12-07). The board's process CPU
    holds its Ray threads' own time (about 13 ms a second here, answering or not) beside its answers': over runs
    whose answer rates differ by 1.5x or more, CPU = idle x wall + per answer x answers (least squares) gives the
    answer's own CPU; else the calm runs' CPU per answer (which holds the idle time too: high at few answers)."""
    if not calm or any(b is None for b in calm):
        return None, 0.0

    def turns(b):  # (its answers and the learner's posts, where the board counted them: each a turn of the model's)
        return b["answers"] + b.get("sets", 0.0)

    rate = [turns(b) / b["wall_s"] for b in every]
    per = None
    if spread_enough(rate):
        a = np.asarray([[b["wall_s"], turns(b)] for b in every])
        per = float(np.linalg.lstsq(a, np.asarray([b["cpu_s"] for b in every]), rcond=None)[0][1])
    if per is None or per <= 0:
        per = float(np.median([b["cpu_s"] / turns(b) for b in calm]))
    return per, float(np.median([max(0.0, b["delay_s"]) / turns(b) for b in calm]))


def beyond_calibration(cfg: Config, costs: Costs, calibrated: Optional[Sequence[float]]) -> Optional[str]:
    """A warning where ``cfg`` crowds more actors on a core than any calibration run did (``calibrated``: a costs
    file's ``calibrated_actors_per_core``, [least, most]): the actors' CPU per step is a line fitted below that
    density, and the costs may grow faster past it (32 Ray workers on 2 cores against calibrations at 6 and 24: the
    actors' CPU per env step about 20% above its calibration's in all four runs of 2026-12-06 and in one or two
    runs of each set of 2026-12-07, SPS predicted 12-19% high there). None within the range, with a core per actor,
    or without the range (costs from before 2026-12-07, or set by hand)."""
    if not calibrated or own_cores(cfg, costs):
        return None
    density, most = cfg.actors / costs.cores, float(calibrated[-1])
    if density <= most * 1.05:
        return None
    return (f"{cfg.actors} actors on {costs.cores:g} cores is {density:.3g} actors per core, beyond the calibration "
            f"runs' {most:.3g}: the model extends a line fitted below it, and costs may grow faster past it; "
            f"calibrate with a run at about {cfg.actors} actors")


def steady_actor_deltas(run_dir: Path, m, cols: Sequence[str]):
    """(per actor, what its cumulative ``cols`` of actors.parquet grew by over the middle half of the updates; that
    span in seconds), or None where that cannot be read: no actors.parquet or column, too few updates, an actor that
    started or ended inside the window, or one restarted in it (its readings count from 0 again)."""
    import pandas as pd

    path = run_dir / "actors.parquet"
    if "update" not in m or len(m) < 4 or not path.exists():
        return None
    a = pd.read_parquet(path)
    if any(c not in a for c in cols):
        return None
    i, j = steady_window(len(m))
    u0, u1 = m["update"].iloc[i], m["update"].iloc[j]
    at = {u: a[a["update"] == u].set_index("actor") for u in (u0, u1)}
    if at[u0].empty or at[u1].empty or set(at[u1].index) != set(at[u0].index):
        return None
    diff = at[u1][list(cols)] - at[u0][list(cols)].reindex(at[u1].index)
    span = float(m["wall_time"].iloc[j] - m["wall_time"].iloc[i])
    if (diff < 0).any().any() or span <= 0:
        return None
    return diff, span


def others_over_steady(run_dir: Path, m) -> Optional[Tuple[float, float]]:
    """(calls per second, the CPU per second of every process but the run's actors and learner) over the middle half
    of a run's updates (as :func:`steady_rate`: not the actors' start, when Ray's workers import and build), from
    the per-update readings (metrics ``cpu/machine_busy_s``, ``cpu/learner_s``; actors.parquet ``cpu_s``,
    ``rollouts``); None where the run has no machine reading (an older run, a machine that is not the run's)."""
    if any(k not in m for k in ("cpu/machine_busy_s", "cpu/learner_s")) or m["cpu/machine_busy_s"].isna().any():
        return None
    steady = steady_actor_deltas(run_dir, m, ["cpu_s", "rollouts"])
    if steady is None:
        return None
    d, span = steady[0].sum(), steady[1]
    i, j = steady_window(len(m))
    learner_back = m["cpu/learner_s"].iloc[j] < m["cpu/learner_s"].iloc[i]  # (a resumed run's process)
    if d["rollouts"] <= 0 or learner_back:
        return None
    busy = float(m["cpu/machine_busy_s"].iloc[j] - m["cpu/machine_busy_s"].iloc[i])
    learner = float(m["cpu/learner_s"].iloc[j] - m["cpu/learner_s"].iloc[i])
    return float(d["rollouts"]) / span, (busy - learner - float(d["cpu_s"])) / span  # (signed: see the driver)


def crowding_fit(points: Sequence[Tuple[float, float]]) -> Optional[Tuple[float, float]]:
    """``(step_cpu_s, crowding_s)``: the actors' CPU per env step as a line in actors per core, least squares over
    runs at two or more counts (``step_cpu_s`` its value at none, ``crowding_s`` its slope). None where the runs
    cannot show a growth (one count) or show none (a slope <= 0: the median of the runs' step_cpu_s stands). A line
    that would cross zero goes through the origin instead (no CPU per step is negative)."""
    x = np.asarray([p[0] for p in points], float)
    y = np.asarray([p[1] for p in points], float)
    if len(set(x.tolist())) < 2:
        return None
    slope, at_zero = np.polyfit(x, y, 1)
    if slope <= 0:
        return None
    if at_zero < 0:
        return 0.0, float((x * y).sum() / (x * x).sum())
    return float(at_zero), float(slope)


# ---- a scan over actor counts: where throughput stops paying ------------------------------------------------------
KNEE = 1.1  # seed 004's throughput knee: more actors still pay while the steady SPS grows >= 10% per doubling of them
SATURATED = 0.95  # a learner busy at least this share of the time is saturated
SCAN_COLUMNS = ("sps_steady", "learner_utilization", "lag_mean", "lag_p95", "age_s_mean", "queue_depth_mean",
                "kept_fraction", "board_utilization", "actor_cpu_wait_frac")


def pays(n_a: float, sps_a: float, n_b: float, sps_b: float) -> bool:
    """Whether going from ``n_a`` actors to ``n_b`` still pays by seed 004's knee: the steady SPS grows at least
    :data:`KNEE` per doubling of the actors (``KNEE ** log2(n_b / n_a)``), so the rule reads the same on a grid of
    doublings, of single steps (the seed's own: add workers one at a time) or of 4x steps."""
    return sps_b >= sps_a * KNEE ** math.log2(n_b / n_a)


def parse_counts(text: str) -> List[int]:
    """``1,2,4,...``: actor counts for :func:`scan`, at least two, each an integer >= 1, in increasing order."""
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SimError(f"--scan {text!r}: actor counts expected, integers >= 1 separated by commas, e.g. "
                       "--scan 1,2,4,8,16") from None
    if len(counts) < 2 or any(n < 1 for n in counts) or any(b <= a for a, b in zip(counts, counts[1:])):
        raise SimError(f"--scan {text!r}: at least two actor counts, integers >= 1 in increasing order, e.g. "
                       "--scan 1,2,4,8,16 (one count: leave out --scan)")
    return counts


def scan(overrides: Sequence[str], counts: Sequence[int], costs: Costs, latency: Optional[Latency] = None,
         seed: int = 0, sched: str = "cores", cluster: bool = False,
         calibrated: Optional[Sequence[float]] = None) -> List[Dict[str, object]]:
    """The model at each actor count, the overrides otherwise as given (a later ``actors=N`` wins, as in Hydra).
    Each count's budget is raised where needed to at least 10 rollouts per actor and 200 batches, so its steady
    rate is past the start (``total_env_steps`` in each row says what ran). ``cluster``: the learner and every
    actor (and Ray's snapshot board, where it has a cost) on a CPU of its own, as on a cluster of one-CPU slots
    (``costs.cores`` is not used), and Ray's other processes' CPU per call (``call_cpu_s``) left out: on a cluster
    it runs on the workers' nodes, beside them (as ``benchmarks/scale.py`` has it); else every count shares
    ``costs.cores``. A row per count: its actors, cores, budget, the model's :data:`SCAN_COLUMNS` and
    ``beyond_calibration`` (:func:`beyond_calibration`'s warning, from the costs file's ``calibrated``)."""
    rows = []
    for n in counts:
        cfg = compose([*overrides, f"actors={n}"])
        steady = max(10 * n * cfg.actor.envs_per_actor * cfg.actor.rollout_len, 200 * cfg.learner.batch_size)
        if cfg.total_env_steps < steady:
            cfg = compose([*overrides, f"actors={n}", f"total_env_steps={steady}"])
        c = costs
        if cluster:
            board = 1 if cfg.runner.name.value == "ray" and costs.board_cpu_s > 0 else 0  # (as own_cores counts it)
            c = dataclasses.replace(costs, cores=float(n + 1 + board), call_cpu_s=0.0)
        out = simulate(cfg, c, latency, seed=seed, sched=sched)
        rows.append({"actors": n, "cores": c.cores, "total_env_steps": int(cfg.total_env_steps),
                     **{k: out[k] for k in SCAN_COLUMNS},
                     "beyond_calibration": beyond_calibration(cfg, c, calibrated)})
    return rows


def knee(rows: Sequence[Dict[str, object]]) -> Optional[int]:
    """Seed 004's throughput knee over a scan's rows (in increasing counts): the largest count reached from the
    previous one by a step that still :func:`pays`; None without a row."""
    best = None
    for i, r in enumerate(rows):
        if i == 0 or pays(float(rows[i - 1]["actors"]), float(rows[i - 1]["sps_steady"]), float(r["actors"]),
                          float(r["sps_steady"])):
            best = int(r["actors"])
    return best


def saturated_at(rows: Sequence[Dict[str, object]]) -> Optional[int]:
    """The smallest count of a scan at which the learner is busy :data:`SATURATED` of the time or more (None:
    never in the scan)."""
    return next((int(r["actors"]) for r in rows if float(r["learner_utilization"]) >= SATURATED), None)


def scan_verdict(rows: Sequence[Dict[str, object]]) -> Dict[str, object]:
    """What a scan says: ``knee`` (:func:`knee`), ``scan_further`` (the last count still paid: the knee may lie
    beyond it), ``knee_between`` (the knee's step paid but grew the SPS less than the actors: the knee lies
    between the count before and it, and the lag there is below the knee row's: scan between them), and
    ``saturated_at`` (:func:`saturated_at`)."""
    k = knee(rows)
    if k is None:
        return {"knee": None, "scan_further": False, "knee_between": None, "saturated_at": None}
    i = next(j for j, r in enumerate(rows) if r["actors"] == k)
    between = None
    if 0 < i < len(rows) - 1:  # (a knee at the last count: scan further first)
        a, b = rows[i - 1], rows[i]
        if float(b["sps_steady"]) / float(a["sps_steady"]) < 0.9 * float(b["actors"]) / float(a["actors"]):
            between = [int(a["actors"]), k]
    return {"knee": k, "scan_further": i == len(rows) - 1, "knee_between": between, "saturated_at": saturated_at(rows)}


def scan_lines(rows: Sequence[Dict[str, object]], cluster: bool = False) -> List[str]:
    """A scan as a table and what it says (:func:`scan_verdict`)."""
    ray = any(math.isfinite(float(r["board_utilization"])) for r in rows)
    head = (f"{'actors':>7} {'cores':>6} {'steps':>11} {'steady SPS':>11} {'learner':>8} {'lag mean':>9} "
            f"{'lag p95':>8} {'data age':>9} {'kept':>6} {'cpu wait':>9}" + (f" {'board':>6}" if ray else ""))
    out = [head]
    for r in rows:
        age = float(r["age_s_mean"])
        shown = "-" if not math.isfinite(age) else f"{age:.3g} s" if age >= 1 else f"{age * 1e3:.3g} ms"
        out.append(f"{r['actors']:>7} {float(r['cores']):>6g} {r['total_env_steps']:>11,} {float(r['sps_steady']):>11,.0f} "
                   f"{float(r['learner_utilization']):>8.0%} {float(r['lag_mean']):>9.3g} {float(r['lag_p95']):>8.3g} "
                   f"{shown:>9} {float(r['kept_fraction']):>6.0%} {float(r['actor_cpu_wait_frac']):>9.1%}"
                   + (f" {float(r['board_utilization']):>6.0%}" if ray else ""))
    v = scan_verdict(rows)
    k, sat, last = v["knee"], v["saturated_at"], rows[-1]
    at = next(r for r in rows if r["actors"] == k)
    rule = f"the steady SPS growing >= {KNEE:g}x per doubling of the actors"
    if v["scan_further"]:
        out.append(f"throughput still pays at N = {k} ({rule}): scan further")
    else:
        out.append(f"throughput stops paying past N = {k} ({rule} up to it, not after): "
                   f"{float(at['sps_steady']):,.0f} steady SPS, mean lag {float(at['lag_mean']):.3g} versions "
                   f"(p95 {float(at['lag_p95']):.3g}); at N = {last['actors']}: {float(last['sps_steady']):,.0f} SPS, "
                   f"mean lag {float(last['lag_mean']):.3g}")
    if v["knee_between"]:
        a, b = v["knee_between"]
        out.append(f"the step from {a} to {b} grew the SPS {float(at['sps_steady']) / float(rows[rows.index(at) - 1]['sps_steady']):.2f}x "
                   f"for {b / a:.3g}x the actors: the knee lies between them, at a lower lag than {b}'s; scan between "
                   f"them (e.g. --scan {','.join(str(x) for x in _between(a, b))})")
    out.append(f"the learner saturates (>= {SATURATED:.0%} busy) by N = {sat}" if sat is not None else
               f"the learner is not saturated at N = {last['actors']} (at most "
               f"{max(float(r['learner_utilization']) for r in rows):.0%} busy)")
    crowded = next((r for r in rows if float(r["actor_cpu_wait_frac"]) >= 0.10), None)
    if crowded is not None and sat is None and not cluster:
        out.append(f"from N = {crowded['actors']} the actors wait for a core {float(crowded['actor_cpu_wait_frac']):.0%} "
                   f"of their time or more: the cores, not the learner, set the pace (--cluster: a CPU each)")
    out.append("seed 004's rule also wants KL(behavior || current) within 0.01-0.03 at that lag: the model has no "
               "KL (it depends on the policy); read it from a lag-cost study of your env (benchmarks/scale.py maps "
               "the committed ones)")
    return out


def _between(a: int, b: int) -> List[int]:
    """A few counts from ``a`` to ``b`` (both in), about evenly spaced in log scale."""
    pts = sorted({int(round(a * (b / a) ** (k / 4))) for k in range(5)})
    return pts


# ---- command line ------------------------------------------------------------------------------------------
def compose(overrides: Sequence[str]) -> Config:
    """The config train.py would run with these overrides (the same Hydra composition and checks)."""
    from .preflight import compose as compose_config

    try:
        return compose_config(overrides)
    except ConfigError as e:
        raise SimError(str(e)) from None


def _strict(d: Dict[str, object]) -> Dict[str, object]:
    """``d`` for strict JSON: a figure that does not exist (no update, no lag: NaN) is null."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def _print_scan(args, costs: Costs, latency: Optional[Latency], calibrated) -> int:
    """``--scan``: the rows (a table, or JSON with :func:`scan_verdict`), each count beyond the calibration's
    crowding warned of."""
    counts = parse_counts(args.scan)
    given = [o for o in args.overrides if o.split("=", 1)[0].lstrip("+~") == "actors"]
    if given:
        print(f"laglab.sim: note: --scan sets the actor count; {' '.join(given)} is not used", file=sys.stderr)
    if args.cluster and any(kv.partition("=")[0] == "cores" for kv in args.cost):
        print("laglab.sim: note: --cluster gives each actor and the learner a CPU; --cost cores is not used",
              file=sys.stderr)
    overrides = [o for o in args.overrides if o not in given]
    rows = scan(overrides, counts, costs, latency, seed=args.seed, sched=args.sched, cluster=args.cluster,
                calibrated=calibrated)
    for r in rows:
        if r["beyond_calibration"]:
            print(f"laglab.sim: warning: {r['beyond_calibration']}", file=sys.stderr)
    if args.json:
        print(json.dumps({"rows": [_strict(r) for r in rows], **scan_verdict(rows), "cluster": bool(args.cluster)}))
        return 0
    cfg = compose([*overrides, f"actors={counts[0]}"])
    if args.cluster:
        where = ("a cluster: each actor, the learner and the snapshot board on a CPU of its own" if
                 cfg.runner.name.value == "ray" else "one host with a CPU for each actor and the learner (runner="
                 "process moves fragments through shared memory: for a cluster, model runner=ray)")
    else:
        where = f"{costs.cores:g} cores shared"
    print(f"{cfg.env.id}, runner={cfg.runner.name.value}, {cfg.actor.envs_per_actor} envs x {cfg.actor.rollout_len} "
          f"steps a rollout, batch {cfg.learner.batch_size}; {where}")
    for line in scan_lines(rows, cluster=args.cluster):
        print(line)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m laglab.sim", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="config overrides, as for train.py (env=latency actors=16 ...)")
    ap.add_argument("--costs", help="a JSON file of costs (from --calibrate)")
    ap.add_argument("--cost", action="append", default=[], metavar="NAME=SECONDS",
                    help="set one cost, e.g. --cost update_s=0.012 (after --costs)")
    ap.add_argument("--latency", help="per env step wait: fixed:<ms>[,<ms>...] (cycled over actors) or "
                                      "lognormal:<median ms>,<sigma> (default: env.latency_ms)")
    ap.add_argument("--seed", type=int, default=0, help="the draws' seed: lognormal latencies, Ray's per-call round "
                    "trips (at 14 Ray workers of one latency, seeds 0-4 moved mean lag 2.04-2.12 and SPS 0.5%%)")
    ap.add_argument("--sched", choices=SCHEDULERS, default="cores", help="the cores: a run queue each, as Linux "
                    "keeps them (default), or one pool any waiting task takes the first free core of")
    ap.add_argument("--calibrate", nargs="+", metavar="RUN_DIR", help="print the costs measured from real runs")
    ap.add_argument("--out", help="--calibrate: also write the costs to this file (for --costs)")
    ap.add_argument("--scan", metavar="N1,N2,...", help="run the model at each of these actor counts (increasing) "
                    "and say where throughput stops paying (seed 004's knee: each count >= 1.1x the previous count's "
                    "steady SPS) and where the learner saturates")
    ap.add_argument("--cluster", action="store_true", help="--scan: the learner and every actor (and Ray's board) "
                    "on a CPU of its own, as on a cluster (else every count shares costs.cores)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_intermixed_args(argv)  # (overrides before, after or between the options)
    if args.cluster and not args.scan:
        ap.error("--cluster goes with --scan (a single prediction takes --cost cores=N)")
    if args.scan and args.calibrate:
        ap.error("--scan predicts and --calibrate measures: one at a time")
    try:
        if args.calibrate:
            text = json.dumps(calibrate(args.calibrate), indent=1)
            if args.out:
                Path(args.out).write_text(text + "\n")
            print(text)
            return 0
        costs, calibrated = Costs(), None
        if args.costs:
            given_file = json.loads(Path(args.costs).read_text())
            costs = Costs.from_dict(given_file)
            calibrated = given_file.get("calibrated_actors_per_core")
            if calibrated is not None and not (isinstance(calibrated, list) and len(calibrated) == 2 and all(
                    isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in calibrated)):
                raise SimError(f"{args.costs}: calibrated_actors_per_core must be [least, most] actors per core, "
                               f"numbers > 0 (as --calibrate writes it), got {calibrated!r}")
        given = dataclasses.asdict(costs)
        for kv in args.cost:  # (checked together: boot_cpu_s is part of start_cpu_s whichever is given first)
            k, _, v = kv.partition("=")
            try:
                given[k] = float(v)
            except ValueError:
                raise SimError(f"--cost {kv}: NAME=SECONDS expected, e.g. --cost update_s=0.012") from None
        costs = Costs.from_dict(given) if args.cost else costs
        latency = Latency.parse(args.latency) if args.latency else None
        if args.scan:
            return _print_scan(args, costs, latency, calibrated)
        cfg = compose(args.overrides)
        out = simulate(cfg, costs, latency, seed=args.seed, sched=args.sched)
        beyond = beyond_calibration(cfg, costs, calibrated)
    except (SimError, ConfigError, FileNotFoundError, json.JSONDecodeError, KeyError) as e:
        print(f"laglab.sim: {e}", file=sys.stderr)
        return 2
    if beyond:
        print(f"laglab.sim: warning: {beyond}", file=sys.stderr)
    out["beyond_calibration"] = beyond
    if args.json:  # strict JSON: a figure that does not exist (no update, no lag) is null
        print(json.dumps(_strict(out)))
        return 0
    print(f"actors {cfg.actors} x {cfg.actor.envs_per_actor} envs, batch {cfg.learner.batch_size}, "
          f"{cfg.total_env_steps:,} steps, {costs.cores:g} cores")
    for k in OUTPUTS:
        print(f"  {k:22s} {out[k]:.4g}")
    h = out["lag_hist"]
    shown = ", ".join(f"{k}: {c}" for k, c in enumerate(h) if c)
    print(f"  lag histogram          {{lag: fragments}} {{{shown if len(shown) < 300 else shown[:300] + ' ...'}}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
