"""Ray actors anywhere in a cluster, the learner in the driver.

How actors start: one Ray actor per slot (``runner.cpus_per_actor`` CPUs, optionally a custom resource
``runner.resource`` for placement; laglab restarts slots itself, so a restarted slot is always a new
incarnation). How bytes move: the learner drives each actor with ``rollout`` calls, at most
``runner.max_inflight`` outstanding per actor and only while the actor's lead (``actor.max_lead_steps``,
counting the calls in flight) allows. A snapshot is put into the object store once per version and posted on
a small board actor next to the learner; a call asks the board for the newest version when it starts (as a
thread or process actor reads the newest snapshot before each rollout) and fetches the snapshot only when the
version changed. A call returns the rollout's fragments as plain numpy arrays with an int64 header. A receiver thread takes the results as they finish, and the arrivals enter the same bounded
queue, admission, books and driver as every runner's.

Faults: an actor that dies (``ray.kill``, a scripted kill, a lost node) fails its outstanding calls; a call
with no answer for ``runner.heartbeat_timeout_s`` marks the actor hung, and it is killed. Either way what it
had in hand is booked (``actor_crash`` / ``abandoned``), what its link held is found lost in transit by the
watermarks, the budget its unanswered calls reserved is given back (those steps were never produced as far
as any book can know), and the slot restarts with a new incarnation within the restart intensity.

Trust: a Ray cluster is one trust domain (Ray itself runs whatever code its members send). laglab sends
only arrays and integers, and admission still validates every field of every fragment that comes back.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import signal
import tempfile
import threading
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ..accounting import Budget, Ledger
from ..actor import ActorStats, Episode, steps_per_rollout, throttle_state
from ..admission import Admission
from ..recurrent import policy_state_shape
from ..chaos import ChaosCounts
from .. import timeline
from ..config import Config, ConfigError
from ..envs import EnvSpec
from ..fragment import FragmentId
from ..inference import SnapshotCodec
from ..learner import Learner
from ..lifetime import (RAY_PREFIX, STOP_SIGNALS, keep_ray_logs, note_run_dir, own_dir, ray_bases, ray_dir_max,
                        release_dir, stop_ray_processes, sweep_left_dirs)
from ..policy import Snapshot
from ..tracking import Tracker
from ..transport import FragmentQueue
from .driver import LearnerDriver, serve
from .endpoint import arrive_at_queue
from .ray_actor import CALL_MOMENTS, HEADER, RolloutWorker, SnapshotBoard, from_wire
from .supervisor import ActorFailed, RestartIntensity

__all__ = ["run", "ActorFailed"]
log = logging.getLogger("laglab")


class _Held:
    """A fragment's identity on a worker's link (for the books: the data stays with the worker)."""

    __slots__ = ("id", "length")

    def __init__(self, row):
        self.id = FragmentId(**{k: int(v) for k, v in zip(HEADER, row)})
        self.length = self.id.length


class _Worker:
    """One life of an actor slot as the learner sees it."""

    def __init__(self, actor_id: int, inc: int, handle):
        self.actor_id, self.inc, self.handle = actor_id, inc, handle
        self.produced = 0  # as last reported
        self.padding = 0  # timesteps skipped past the steps taken (its discarded rollouts)
        self.in_hand = 0
        self.link: List[Any] = []  # identities of what its link holds, and arrivals not yet taken
        self.inflight: Dict[Any, Tuple[str, int]] = {}  # call ref -> (ready | rollout | flush, steps reserved)
        self.progress_at = time.monotonic()  # last answer, or when it last began to owe one
        self.started = False  # answered ready()
        self.finishing = False  # the budget is spent: flush() was called
        self.done = False  # finished normally
        self.finalized = False  # gone; its books are closed
        self.abandoned = False
        self.killed = False  # reported a scripted kill (the learner then kills it)
        self.init_failed = False
        self.died = False  # a call failed while draining
        self.error: Optional[str] = None
        self.node: Optional[str] = None  # the Ray node it runs on
        self.chaos = ChaosCounts()


class _Slot:
    def __init__(self, actor_id: int):
        self.actor_id = actor_id
        self.worker: Optional[_Worker] = None
        self.start_at = 0.0
        self.finished = False
        self.stats = ActorStats()


def _drop(items: List[Any], x: Any) -> None:
    """Remove ``x`` (by identity) from ``items``."""
    for i, y in enumerate(items):
        if y is x:
            del items[i]
            return


def _counts(d: Dict[str, Any]) -> ChaosCounts:
    c = ChaosCounts(**{k: v for k, v in d.items() if k not in ("corrupted", "corrupted_steps")})
    c.corrupted.update(d["corrupted"])
    c.corrupted_steps.update(d["corrupted_steps"])
    return c


def run(cfg: Config, learner: Learner, tracker: Tracker, spec: EnvSpec, budget: Budget, run_dir) -> Dict[str, Any]:
    import ray

    own = not ray.is_initialized()
    local = own and cfg.runner.address is None
    place: Dict[str, Optional[str]] = {"root": None, "session": None}  # a local instance's: ours to remove
    if own:  # a new local Ray instance, or the cluster at runner.address ("auto", "ray://host:10001", ...)
        kw: Dict[str, Any] = {}
        from ..console import to_log_file

        log.info("laglab: starting Ray (%d actors)...", cfg.actors)
        handlers = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
        try:
            if local:  # room for every actor (processes share the cores, as with runner=process)
                kw["num_cpus"] = max(os.cpu_count() or 1, math.ceil(cfg.actors * cfg.runner.cpus_per_actor))
                place["root"], theirs = _own_root()
                if place["root"] is not None:
                    kw["_temp_dir"] = place["root"]
                    note_run_dir(place["root"], run_dir)  # (a start that finds the run killed keeps its logs there)
            with to_log_file("ray"), _own_session(cfg.runner.address is None), _no_crash_handler():
                try:
                    ray.init(address=cfg.runner.address or "local", include_dashboard=False, log_to_driver=False,
                             logging_level="warning", **kw)  # (its warnings: to the run's log file)
                except OSError as e:
                    if "AF_UNIX path length" not in str(e):
                        raise
                    raise ConfigError(f"runner=ray: Ray's socket paths would be longer than 107 bytes ({e}); start "
                                      "it with a shorter TMPDIR or RAY_TMPDIR (e.g. RAY_TMPDIR=/tmp)") from None
            if local and (place["root"] is not None or theirs):
                place["session"] = _session_dir(ray)
        except SystemExit as e:  # ray.init's own SIGTERM handler (sys.exit) ran while Ray started
            _shut_down(ray, handlers, place, None)
            term = handlers.get(signal.SIGTERM)
            if e.code != signal.SIGTERM or not callable(term):
                raise
            term(signal.SIGTERM, None)  # the run's handler gets the signal Ray took: a stop request, counted
            raise KeyboardInterrupt("stopped while Ray was starting") from None
        except BaseException as e:
            _shut_down(ray, handlers, place, None if isinstance(e, (KeyboardInterrupt, ConfigError)) else run_dir)
            raise
        _restore(handlers)
    elif cfg.runner.address is not None:
        log.warning("laglab: Ray is already initialized in this process; runner.address=%s is not used",
                    cfg.runner.address)
    failed = True
    try:
        out = _Runner(cfg, learner, tracker, spec, budget, run_dir).run()
        failed = False
        return out
    except KeyboardInterrupt:
        failed = False
        raise
    finally:
        if own:
            _shut_down(ray, handlers, place, run_dir if failed else None)


@contextlib.contextmanager
def local_instance(**kw: Any) -> Iterator[None]:
    """A local Ray instance for a tool outside a run (``benchmarks/throughput.py``'s Ray path), kept as a run keeps
    its own: its session in a directory of laglab's (:func:`_own_root`), and nothing of it left at the end, however
    the body ends (its processes stopped, the directory removed, the process's stop handlers put back). A tool's
    instance that a SIGKILL left is removed by the next start of a tool or a run (each sweeps dead learners' Ray
    directories first). Refused where this process already has Ray up (it would not be ours to shut down). ``kw``:
    more for ``ray.init`` (``num_cpus``, ...)."""
    import ray

    if ray.is_initialized():
        raise RuntimeError("local_instance: Ray is already initialized in this process; use that instance")
    sweep_left_dirs((RAY_PREFIX,))  # (a killed tool's or run's instance: stopped, its directory removed)
    handlers = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    place: Dict[str, Optional[str]] = {"root": None, "session": None}
    try:
        place["root"], theirs = _own_root()
        if place["root"] is not None:
            kw["_temp_dir"] = place["root"]
        with _own_session(True), _no_crash_handler():
            ray.init(address="local", include_dashboard=False, log_to_driver=False, logging_level="warning", **kw)
        if place["root"] is not None or theirs:
            place["session"] = _session_dir(ray)
        yield
    finally:
        _shut_down(ray, handlers, place, None)


def _own_root() -> Tuple[Optional[str], bool]:
    """The root directory for a local Ray instance this run starts, and whether the session Ray makes is ours to
    remove. Ray keeps each instance's session (its logs, sockets, spilled objects; 0.3-0.6 MB a run) under
    ``$TMPDIR/ray`` for good, one more every run. Ours is a directory of :func:`laglab.lifetime.own_dir`'s
    (``laglab-ray-<pid>-<token>``): removed when the run ends, and by the next start if the learner was killed.
    Ray's socket paths are limited to 107 bytes, so under a ``TMPDIR`` too long for them ours goes in /tmp (as
    the log says). None (Ray's own way) where the user chose Ray's directory (``RAY_TMPDIR``: left as it is), or
    ours cannot be made (no ``flock``; said in the log, and the session Ray made is removed at the run's end, but
    not after a SIGKILL)."""
    if "RAY_TMPDIR" in os.environ:
        return None, False
    pid = os.getpid()
    for base in ray_bases():
        root = own_dir(RAY_PREFIX, ray_dir_max(pid), base)  # (None where too long for Ray's sockets)
        if root is not None:
            if base != tempfile.gettempdir():
                room = ray_dir_max(pid) - len(f"/{RAY_PREFIX}{pid}-") - 8  # (the longest directory ours fits in)
                log.info("laglab: Ray keeps this run's session in %s: the temporary directory %s is longer than the "
                         "%d bytes Ray's socket paths leave it (107 in all)", root, tempfile.gettempdir(), room)
            return root, False
    log.info("laglab: Ray keeps this run's session in its own directory (%s): laglab's could not be made; it is "
             "removed at the run's end, but not after a SIGKILL", os.path.join(tempfile.gettempdir(), "ray"))
    return None, True


def _session_dir(ray) -> Optional[str]:
    """The session directory of the local instance this process started (Ray's private API: None if it moved)."""
    try:
        return ray._private.worker._global_node.get_session_dir_path()
    except AttributeError:
        return None


def _shut_down(ray, handlers: Dict[int, Any], place: Dict[str, Optional[str]], keep_logs_in) -> None:
    """Shut the instance down, put the run's stop handlers back, then leave nothing of a local instance: stop what
    still runs of it (``ray.shutdown()`` waits for neither the raylet's agents nor its workers), copy its logs to
    the run dir if ``keep_logs_in`` (a failed run), remove its directory (ours, or the session Ray made in its
    own). Each step runs even if one before it raised (a second Ctrl-C while Ray shuts down)."""
    try:
        ray.shutdown()
    finally:
        try:
            _restore(handlers)  # (shutting Ray down sets SIGTERM's action to the default behind Python's back)
        finally:
            _leave(place, keep_logs_in)


def _leave(place: Dict[str, Optional[str]], keep_logs_in=None) -> None:
    root, session = place["root"], place["session"]
    where = root or session
    if where is None:
        return
    try:
        stop_ray_processes(where)
        if keep_logs_in is not None:
            _keep_logs(session or os.path.join(root, "session_latest"), keep_logs_in)
    finally:
        if root is not None:
            release_dir(root)
        elif session is not None:
            shutil.rmtree(session, ignore_errors=True)


def _keep_logs(session: str, run_dir) -> None:
    """Copy a failed run's Ray logs to its run dir (:func:`laglab.lifetime.keep_ray_logs`) and say where."""
    try:
        dest = keep_ray_logs(session, run_dir)
    except OSError as e:
        log.warning("laglab: Ray's logs of this run could not be kept (%s)", e)
        return
    if dest is None:
        log.warning("laglab: Ray had not started a session: no Ray logs to keep")
    else:
        log.warning("laglab: Ray's logs of this run are in %s", dest)


@contextlib.contextmanager
def _no_crash_handler() -> Iterator[None]:
    """While ``ray.init`` runs, the driver's core worker installs no crash handler of its own (Ray's
    RAY_DISABLE_FAILURE_SIGNAL_HANDLER, for this process only: the environment variable is read once, at ``import
    ray``). Its handler takes SIGTERM too (an abort with a stack dump), and shutting the worker down leaves SIGTERM
    at its default action, behind Python's back."""
    from ray._private import ray_constants

    old = getattr(ray_constants, "RAY_DISABLE_FAILURE_SIGNAL_HANDLER", False)
    ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
    try:
        yield
    finally:
        ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = old


@contextlib.contextmanager
def _own_session(local: bool) -> Iterator[None]:
    """While ``ray.init`` starts a local Ray instance, start the processes it starts (GCS, raylet, log monitor,
    ...; the raylet's agents and workers share the raylet's) each in a session of its own: a SIGTERM or SIGHUP to
    the run's process group (``kill -TERM -- -<pgid>``, a closed terminal) then stops the run at a safe point, as
    it does with the other runners, instead of ending the Ray instance under it. They stay tied to the learner's
    life where the kernel does it: on Linux Ray asks for SIGKILL when their parent, the learner, exits.
    Elsewhere Ray ties them by a reaper that kills its own process group, so they stay in the run's (with a
    warning). Ray itself blocks only SIGINT in them. (A no-op for a cluster's address.)"""
    import sys

    from ray._private import services, utils

    if not local:
        yield
        return
    popen = getattr(services, "ConsolePopen", None)
    fate = getattr(utils, "detect_fate_sharing_support", lambda: False)
    if popen is None or not sys.platform.startswith("linux") or not fate():
        log.warning("laglab: Ray's processes start in the run's process group: a SIGTERM or SIGHUP to the group "
                    "(a closed terminal) ends them under the run")
        yield
        return

    class _InItsOwnSession(popen):
        def __init__(self, *args, **kwargs):
            kwargs["start_new_session"] = True
            super().__init__(*args, **kwargs)

    services.ConsolePopen = _InItsOwnSession
    try:
        yield
    finally:
        services.ConsolePopen = popen


def _restore(handlers: Dict[int, Any]) -> None:
    """Put back the run's stop handlers: ``ray.init`` replaces SIGTERM's in the driver with one that exits at once
    (``SystemExit: 15``, no safe point), and shutting Ray down leaves SIGTERM at its default action while Python's
    table still names the handler (so every one is set again, whatever ``signal.getsignal`` says)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig, h in handlers.items():
        if h is not None:
            signal.signal(sig, h)


class _Runner:
    def __init__(self, cfg: Config, learner: Learner, tracker: Tracker, spec: EnvSpec, budget: Budget, run_dir):
        import ray

        self.ray = ray
        self.cfg, self.learner, self.tracker, self.spec, self.budget = cfg, learner, tracker, spec, budget
        self.poll = cfg.runner.poll_s
        T = cfg.actor.rollout_len
        self.per_rollout = steps_per_rollout(cfg)
        self.shapes = {k: tuple(v.shape) for k, v in learner.model.state_dict().items()}
        self.codec = SnapshotCodec(self.shapes, spec.obs_shape)
        self.ledger = Ledger(T, cfg.actor.envs_per_actor, cfg.transport.dedup_window, learner.allocate_incarnation)
        self.admission = Admission(spec, cfg.actors, cfg.actor.envs_per_actor, cfg.transport.duplicates, T,
                                   policy_state_shape(cfg.policy))
        self.queue = FragmentQueue(cfg.transport.capacity, cfg.transport.max_bytes, cfg.transport.policy,
                                   on_discard=lambda f, first, bucket, reason:
                                   self.ledger.book(bucket, reason, f.length) if first is True else None)
        self.intensity = RestartIntensity(cfg.runner.actors_max_restarts, cfg.runner.restart_window_s)
        self.slots = [_Slot(i) for i in range(cfg.actors)]
        self.workers: List[_Worker] = []  # lives not yet let go (a restarted slot's dead life is dropped)
        self.nodes: set = set()  # every Ray node an actor ran on
        self.lock = threading.RLock()  # the workers' call bookkeeping (learner and receiver threads)
        self.chaos = ChaosCounts()
        self.malformed = 0
        self.calls_malformed = 0  # (calls.parquet readings that did not parse: dropped, the report taken)
        self.calls = 0
        self.board_work: Optional[Dict[str, float]] = None  # (the snapshot board's answers and CPU, read at the end)
        self.publish_s = 0.0  # the learner's own time posting its publications (encoding, the object store, the
        self.publishes = 0  # board's call: laglab.sim's publish_s), and how many it posted
        self.receive_s = 0.0  # the receiver's own time (answers, books, the queue, next calls), net of a full queue
        self.bytes_in = 0
        self.hangs_detected = 0
        self.stopping = threading.Event()
        self.receiver_error: Optional[BaseException] = None
        self.granted: Dict[int, int] = dict(learner.consumed)
        self.snapshot: Optional[Tuple[int, list]] = None  # (version, [object ref])
        self.first_steps = timeline.FirstSteps(cfg.actors)  # each slot's first env step (start-up)
        opts: Dict[str, Any] = {"num_cpus": cfg.runner.cpus_per_actor, "max_restarts": 0, "max_task_retries": 0,
                                "scheduling_strategy": "SPREAD"}  # a rollout fleet spreads over the nodes
        if cfg.runner.resource:
            opts["resources"] = {cfg.runner.resource: 0.001}
        self.remote_cls = ray.remote(RolloutWorker).options(**opts)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
        # the newest snapshot's version and reference, next to the learner; restarted if it dies (empty until
        # the next publication: actors keep acting with the snapshot they have)
        self.board = ray.remote(SnapshotBoard).options(num_cpus=0, scheduling_strategy=here, max_restarts=-1).remote()
        self.driver = LearnerDriver(cfg, learner, tracker, budget, self.admission, self.ledger,
                                    publish=self.publish, link_steps=self.link_steps,
                                    queue_steps=self.queue.first_steps, gauges=self.gauges,
                                    actors=self.actor_stats, checkpoint_dir=run_dir / "checkpoints")

    # ---- learner -> actors ------------------------------------------------------------------------------------
    def publish(self, snap: Snapshot) -> None:
        first = self.snapshot is None
        t0 = time.perf_counter()
        self.snapshot = (snap.version, [self.ray.put(self.codec.encode(snap))])  # once per version
        posted = self.board.set.remote(*self.snapshot)  # (one caller's calls run in order: no older one overtakes)
        if first:
            self.ray.get(posted)  # on the board before any actor asks (not a publication's post: not timed)
        else:
            self.publish_s += time.perf_counter() - t0
            self.publishes += 1
        self.grant(snap.consumed)

    def grant(self, consumed) -> None:
        self.granted = dict(consumed)
        self.issue()

    def issue(self) -> None:
        """Start rollouts where the lead throttle, ``max_inflight`` and the budget allow."""
        with self.lock:
            if self.stopping.is_set() or self.snapshot is None:
                return
            for s in self.slots:
                w = s.worker
                if w is None or w.finalized or w.finishing or w.abandoned or w.killed:
                    continue
                while sum(kind == "rollout" for kind, _ in w.inflight.values()) < self.cfg.runner.max_inflight:
                    owed = sum(n for _, n in w.inflight.values())
                    pause, _ = throttle_state(w.produced + w.padding + owed, self.granted, w.inc, self.cfg.actor.max_lead_steps)
                    if pause or not self.budget.reserve(self.per_rollout):
                        break
                    if not w.inflight:
                        w.progress_at = time.monotonic()
                    w.inflight[w.handle.rollout.remote(self.board)] = ("rollout", self.per_rollout)
                    self.calls += 1

    # ---- readings ---------------------------------------------------------------------------------------------
    def link_steps(self) -> int:
        return self.ledger.link_steps(f for w in list(self.workers) if not w.finalized for f in w.link)

    def gauges(self) -> Dict[str, float]:
        with self.lock:
            inflight = sum(len(w.inflight) for w in self.workers if not w.finalized)
        return {"transport/queue_depth": float(self.queue.depth), "transport/queue_bytes": float(self.queue.bytes),
                "transport/calls_in_flight": float(inflight), "transport/receive_s": self.receive_s}

    def actor_stats(self) -> Dict[int, ActorStats]:
        return {s.actor_id: s.stats for s in self.slots}

    # ---- workers ------------------------------------------------------------------------------------------------
    def start(self, slot: _Slot) -> None:
        inc = self.ledger.new_incarnation(slot.actor_id)
        handle = self.remote_cls.remote(self.cfg, slot.actor_id, inc, self.shapes, self.spec)
        w = _Worker(slot.actor_id, inc, handle)
        w.inflight[handle.ready.remote()] = ("ready", 0)  # its answer (or failure) says whether it started
        with self.lock:
            self.workers.append(w)
            slot.worker = w
        self.issue()

    def take(self, w: _Worker, res: Dict[str, Any]) -> bool:
        """One report, in order: produced, sent into the link, what left the link (each an arrival). False for
        a malformed report (nothing of it is taken)."""
        led = self.ledger
        received = self.tracker.wall()
        try:
            frags = [from_wire(x) for x in res["fragments"]]
            sent = [(int(e), int(t)) for e, t in res["sent"]]
            held = [_Held(r) for r in res["held"]]
            produced, in_hand = int(res["produced"]), int(res["in_hand"])
            discarded, steps = int(res.get("discarded", 0)), int(res["steps"])
            skipped = [(int(e), int(t)) for e, t in res.get("skipped", ())]
            padding = int(res.get("padding", 0))
            if not 0 <= discarded <= steps <= self.per_rollout:
                raise ValueError("discarded steps")
            episodes = [Episode(w.actor_id, int(e), float(r), int(n)) for e, r, n in res["episodes"]]
            stats, chaos = ActorStats(**res["stats"]), _counts(res["chaos"])
            first = res.get("first_step_wall")
            first = None if first is None else float(first)
            start = res.get("start_wall") or {}
            if not isinstance(start, dict):
                raise TypeError("start_wall")
            start = {str(k): float(v) for k, v in start.items()}
        except (KeyError, TypeError, ValueError):
            self.malformed += 1
            return False
        with led.lock:
            led.produced += produced - w.produced
            led.in_hand += in_hand - w.in_hand
            w.produced, w.in_hand = produced, in_hand
            led.book("dropped", "refresh", discarded)  # a rollout its snapshot made stale (actor.refresh_lag)
            for env_index, t_end in skipped:
                led.skip(w.inc, env_index, t_end)
            w.padding += padding  # the throttle compares timesteps with the credit watermark
            for env_index, t_end in sent:
                led.mark_sent(w.inc, env_index, t_end)
            w.link = held + frags  # on the link until each arrives
        self.tracker.add_episodes(episodes, self.budget.used)
        self.record_call(w, res.get("call"), received)
        for f in frags:
            self.bytes_in += f.nbytes
            arrive_at_queue(led, self.queue, f, lambda: w.abandoned, lambda f=f: _drop(w.link, f), lambda _: None,
                            self.poll)
        if first is not None:  # (start-up: each slot's first env step and its worker's start, on the learner's clock)
            here = time.monotonic() - time.time()
            self.first_steps.saw(w.actor_id, here + first, {k: here + v for k, v in start.items()})
        w.chaos = chaos
        w.killed = bool(res.get("killed"))
        if self.slots[w.actor_id].worker is w:
            self.slots[w.actor_id].stats = stats
        return True

    def record_call(self, w: _Worker, call: Any, received: float) -> None:
        """calls.parquet's row for a rollout's report: its version and moments, sent as the worker's perf_counter
        readings with the one offset that puts them on its wall clock, here put on the run's clock (on one host
        exact to the two clocks' readings; across hosts as good as their wall clocks agree). A malformed one is
        counted and dropped: it is a reading, not the report."""
        if call is None:
            return
        try:
            off = float(call["offset"]) + self.tracker.epoch_offset()
            row = {"actor": w.actor_id, "incarnation": w.inc, "version": int(call["version"]),
                   "board_version": int(call["board_version"]),
                   **{k: float(call[k]) + off for k in CALL_MOMENTS}, "received": received}
        except (KeyError, TypeError, ValueError):
            self.calls_malformed += 1
            return
        self.tracker.add_call(row)

    def finalize(self, w: _Worker, reason: str) -> None:
        """The worker is gone (or let go): book what it had in hand for ``reason``; what its link held is lost
        (the watermarks find it); give back the budget of its unanswered calls; merge its chaos counts. Called
        by the receiver thread only (or by the learner once the receiver has stopped), so a report is never
        taken from a worker that is being finalized."""
        with self.lock:
            if w.finalized:
                return
            owed = sum(n for _, n in w.inflight.values())
            w.inflight.clear()
            if owed:
                self.budget.release(owed)  # reserved for rollouts whose report never reached us
            with self.ledger.lock:
                self.ledger.unsent(w.in_hand, reason)
                w.in_hand = 0
                w.link = []
                w.finalized = True
                self.ledger.retire(w.inc)  # its later answers are void: nothing of it can arrive any more
            self.chaos.merge(w.chaos)
        self.kill(w)

    def answer(self, w: _Worker, ref, kind: str, steps: int) -> None:
        """A call of ``w`` finished: take its result, or book the worker's death."""
        try:
            res = self.ray.get(ref)
        except Exception as e:  # noqa: BLE001 - the actor died (killed, crashed, its node lost)
            if steps:
                self.budget.release(steps)
            w.error = w.error or f"{type(e).__name__}: {str(e)[:4000]}"
            w.init_failed = bool(getattr(e, "actor_init_failed", False))  # its constructor raised (bad config)
            self.finalize(w, "abandoned" if w.abandoned else "actor_crash")
            return
        w.progress_at = time.monotonic()
        if kind == "ready":
            w.started = True
            node, nice = res
            w.node = str(node)
            self.nodes.add(w.node)
            self.driver.actor_nice = int(nice)  # (Ray's worker_niceness: one setting for every worker)
            return
        if not self.take(w, res):  # a worker that reports nonsense is replaced; the call never produced
            if steps:
                self.budget.release(steps)
            w.error = "a malformed report"
            self.finalize(w, "actor_crash")
            return
        if kind == "rollout" and int(res["steps"]) < steps:  # a rollout stopped early (actor.refresh_lag)
            self.budget.release(steps - int(res["steps"]))
        if kind == "flush":
            w.done = True
            self.finalize(w, "shutdown")
        elif w.killed:
            w.error = f"chaos: actor {w.actor_id} (incarnation {w.inc}) killed"
            self.finalize(w, "actor_crash")

    def receive(self) -> None:
        """The receiver thread: each finished call, in completion order."""
        try:
            while not self.stopping.is_set():
                with self.lock:
                    refs = {r: w for w in self.workers if not w.finalized for r in w.inflight}
                if not refs:
                    time.sleep(self.poll / 5)
                    self.issue()
                    continue
                ready, _ = self.ray.wait(list(refs), num_returns=1, timeout=self.poll)
                t0, b0 = time.perf_counter(), self.queue.stats.blocked_s
                for ref in ready:
                    w = refs[ref]
                    # an actor runs its calls one after another, so the calls issued before this one have
                    # finished too: answer them first (each report is cumulative and must be taken in order)
                    with self.lock:
                        if ref not in w.inflight:
                            continue  # answered already, or a void call of a worker given up on
                        order = list(w.inflight)
                        due = [(r, *w.inflight.pop(r)) for r in order[:order.index(ref) + 1]]
                    for r, kind, steps in due:
                        if w.finalized:  # it died answering an earlier call: these reports are void
                            if steps:
                                self.budget.release(steps)
                            continue
                        self.answer(w, r, kind, steps)
                self.issue()
                if ready:  # (reading answers, books, the queue and the next calls; not the wait for them)
                    self.receive_s += time.perf_counter() - t0 - (self.queue.stats.blocked_s - b0)
        except BaseException as e:  # noqa: BLE001 - surfaces in the learner loop
            self.receiver_error = e

    def supervise(self) -> bool:
        if self.receiver_error is not None:
            raise RuntimeError("the Ray runner's receiver failed") from self.receiver_error
        now = time.monotonic()
        live = False
        rc = self.cfg.runner
        for slot in self.slots:
            if slot.finished:
                continue
            live = True
            w = slot.worker
            if w is None:
                if now >= slot.start_at:
                    self.start(slot)
                continue
            if w.finalized:
                if w.done:
                    slot.finished = True
                    continue
                if w.init_failed:  # (not a node that died under it: that is a crash like any other)
                    raise ActorFailed(f"actor {slot.actor_id} could not start on Ray:\n{w.error or 'no error text'}")
                self.intensity.record(slot.actor_id, w.error or "died")
                slot.worker = None
                with self.lock:
                    _drop(self.workers, w)  # its books are closed: let go of its handle (Ray frees the actor)
                slot.start_at = now + rc.restart_backoff_s
                continue
            with self.lock:
                owes = bool(w.inflight)
                if not owes and not w.finishing and w.started and not self.budget.has_room(self.per_rollout):
                    w.finishing = True  # the budget is spent: deliver what its link still holds, then let it go
                    w.inflight[w.handle.flush.remote()] = ("flush", 0)
                    w.progress_at = now
                    continue
            if w.abandoned or w.killed:  # killed: the receiver books it when a call fails
                with self.lock:
                    if not w.inflight:  # it owes nothing: ask it something, so that its death is seen
                        w.inflight[w.handle.ready.remote()] = ("ready", 0)
                continue
            limit = rc.heartbeat_timeout_s if w.started else rc.start_timeout_s
            if owes and now - w.progress_at > limit:
                if self.answered(w):  # it did answer: the receiver is behind (a full queue), not the actor
                    w.progress_at = now
                    continue
                if not w.started:
                    raise ActorFailed(f"actor {slot.actor_id} did not start within {rc.start_timeout_s}s "
                                      "(runner.start_timeout_s)")
                w.error = f"no answer for {rc.heartbeat_timeout_s}s (runner.heartbeat_timeout_s)"
                w.abandoned = True  # what it still delivers is refused and booked as abandoned
                self.hangs_detected += 1
                self.kill(w)  # its calls fail now; the receiver finalizes it
        return live

    def answered(self, w: _Worker) -> bool:
        """Has any call ``w`` owes finished (whether or not the receiver has taken it yet)?"""
        with self.lock:
            refs = list(w.inflight)
        if not refs:
            return False
        done, _ = self.ray.wait(refs, num_returns=1, timeout=0, fetch_local=False)
        return bool(done)

    def kill(self, w: _Worker) -> None:
        try:
            self.ray.kill(w.handle, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass

    def ask_board_work(self) -> Optional[Dict[str, float]]:
        """The snapshot board's answers and CPU (``SnapshotBoard.work``), or None where it cannot say within 5 s (a
        board restarting, a stopped instance): a figure for the books, never a reason to fail the run."""
        try:
            return dict(self.ray.get(self.board.work.remote(), timeout=5.0))
        except Exception:  # noqa: BLE001
            return None

    def drain(self, deadline_s: float = 10.0) -> None:
        """The run is over (or interrupted), the receiver has stopped: take what is still owed and finished
        within ``deadline_s`` in all (the queue is closed, so arrivals are booked as dropped at shutdown), each
        worker's reports in order up to its first missing one, and let every worker go."""
        owed = {}
        for w in self.workers:
            if w.finalized:
                continue
            with self.lock:
                if not w.finishing:
                    try:
                        w.inflight[w.handle.flush.remote()] = ("flush", 0)
                    except Exception:  # noqa: BLE001
                        pass
                owed[w] = list(w.inflight.items())
        refs = [r for calls in owed.values() for r, _ in calls]
        done = set()
        if refs:
            ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=deadline_s)
            done = set(ready)
        for w, calls in owed.items():
            for r, (kind, steps) in calls:
                if r not in done:
                    break
                with self.lock:
                    w.inflight.pop(r, None)
                try:
                    res = self.ray.get(r)
                except Exception:  # noqa: BLE001 - it died: the books say what was lost
                    if steps:
                        self.budget.release(steps)
                    w.died = True
                    break
                if kind != "ready":
                    if not self.take(w, res):
                        if steps:
                            self.budget.release(steps)
                        break
                    if w.killed:
                        break
            self.finalize(w, "abandoned" if w.abandoned else "actor_crash" if (w.killed or w.died) else "shutdown")

    def run(self) -> Dict[str, Any]:
        self.publish(self.learner.snapshot())
        timeline.mark("actors_started")  # (asking for them: Ray starts them in the background as they are asked for)
        for slot in self.slots:
            self.start(slot)
        receiver = threading.Thread(target=self.receive, name="laglab-ray-receiver", daemon=True)
        receiver.start()
        served = False
        try:
            serve(self.queue, self.driver, self.supervise, self.grant, self.cfg)
            served = True
        except BaseException as e:
            cpu = self.driver.cpu_summary()  # (now: the actors' stats are released before the books are read)
            e.laglab_books = lambda: {**self.driver.summary(self.driver.close(), self.intensity.total,
                                                            self.chaos.as_dict()), "cpu": cpu}
            raise
        finally:
            self.stopping.set()
            with self.ledger.lock:
                self.queue.close()  # a receiver blocked on a full queue returns (its arrival booked as shutdown)
            receiver.join(timeout=30)
            try:
                if receiver.is_alive():  # (never seen) it would race drain(): leave the books as they are
                    log.warning("laglab: the Ray receiver did not stop within 30 s; not draining the actors")
                else:
                    self.drain()
                if served:  # (before the board goes with the rest; inside the try, so a Ctrl-C here still kills)
                    self.board_work = self.ask_board_work()
            finally:
                for w in self.workers:
                    self.kill(w)
                try:
                    self.ray.kill(self.board)
                except Exception:  # noqa: BLE001
                    pass
        bal = self.driver.close()
        chaos = self.chaos.as_dict()
        chaos["hangs_detected"] = self.hangs_detected
        queue_info = {"max_depth": self.queue.stats.max_depth, "max_bytes": self.queue.stats.max_bytes,
                      "blocked_s": self.queue.stats.blocked_s, "capacity": self.queue.capacity,
                      "max_bytes_bound": self.queue.max_bytes, "malformed_results": self.malformed,
                      "malformed_call_readings": self.calls_malformed,
                      "calls": self.calls, "bytes_received": self.bytes_in,
                      "ray_nodes": sorted(self.nodes), "board": self.board_work,
                      "publish_s": self.publish_s, "publishes": self.publishes}
        out = self.driver.summary(bal, self.intensity.total, chaos, {"queue": queue_info})
        out.update({"actor_stats": self.actor_stats(), "env_steps": self.budget.used})
        return out
