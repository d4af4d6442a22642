"""The rollout worker: one life (incarnation) of an actor slot. It collects a rollout, keeps it in hand,
and sends its fragments one by one over its link (with chaos, if configured) to the runner's endpoint.
Every move is booked in the run's :class:`~laglab.accounting.Ledger`; what it never sends is booked by
reason when the incarnation ends. Runners differ only in the endpoint (a queue, the learner directly, a
shared-memory slot) and in how the worker is started."""
from __future__ import annotations

import threading
import time
from typing import Callable, List, Optional, Protocol, Sequence


from ..accounting import Budget, Ledger
from ..actor import Actor, ActorStats, steps_per_rollout
from ..chaos import ActorKilled, ChaosChannel, ChaosCounts, kinds_for
from ..config import Config
from ..fragment import Fragment
from ..policy import Snapshot
from ..tracking import Tracker
from ..transport import Closed

OK, CLOSED, ABANDONED = "ok", "closed", "abandoned"


class Abandoned(Exception):
    """The supervisor gave up on this incarnation (no heartbeat): nothing it sends is accepted."""


class Endpoint(Protocol):
    def deliver(self, inc: "Incarnation", frag: Fragment) -> str:
        """Take the fragment at the head of ``inc``'s link: record its arrival and decide what happens to it,
        popping it from the link under the ledger's lock. Returns OK, CLOSED or ABANDONED (refused, booked)."""


class Incarnation:
    def __init__(self, cfg: Config, actor_id: int, ledger: Ledger, chaos_counts: ChaosCounts,
                 chaos_lock: threading.Lock, spec=None):
        self.cfg = cfg
        self.actor_id = actor_id
        self.ledger = ledger
        self.incarnation = ledger.new_incarnation(actor_id)
        self.actor = Actor(cfg, actor_id, self.incarnation, expect=spec)
        kinds = kinds_for(self.actor.spec.masked, recurrent=self.actor.h is not None)
        self.channel = ChaosChannel(cfg.chaos, cfg.seed, actor_id, self.incarnation, kinds)
        self.actor.heartbeat = self.beat
        self.in_hand: List[Fragment] = []
        self.produced = 0
        self.padding = 0  # timesteps skipped past the steps taken (discarded rollouts): the throttle's credit
        self.last_beat = time.monotonic()
        self.abandoned = threading.Event()
        self._run_chaos, self._chaos_lock = chaos_counts, chaos_lock
        self._closed = False

    @property
    def stats(self) -> ActorStats:
        return self.actor.stats

    def beat(self) -> None:
        self.last_beat = time.monotonic()

    @property
    def closed(self) -> bool:
        return self._closed

    def link_contents(self) -> List[Fragment]:
        return self.channel.contents()

    def produce(self, snap: Snapshot, budget: Budget, tracker: Tracker, endpoint: Endpoint,
                wait_hung: Callable[[], None], envs: Optional[Sequence[int]] = None,
                newest: Optional[Callable[[], int]] = None) -> bool:
        """Collect one rollout (of all env instances, or of ``envs``) and send its fragments; ``snap`` is the
        newest snapshot, loaded first if ``actor.sync_min_lag`` says to; ``newest()`` the newest version while
        collecting (``actor.refresh_lag``: a rollout whose snapshot goes stale is discarded, booked ``refresh``).

        Returns False when the budget is exhausted. Raises :class:`ActorKilled` for a scripted crash,
        :class:`Closed` when the run stops and :class:`Abandoned` after a scripted hang; :meth:`close` books
        what was not sent."""
        n = steps_per_rollout(self.cfg) if envs is None else len(envs) * self.cfg.actor.rollout_len
        if self.actor.wants(snap.version):
            self.actor.load(snap)
        if not budget.reserve(n):
            return False
        try:
            ro = self.actor.collect(envs, newest)
        except BaseException:
            budget.release(n)  # nothing was produced
            raise
        if not ro.fragments:  # stale mid-rollout: its steps were produced and are thrown away
            budget.release(n - ro.steps)
            with self.ledger.lock:
                self.ledger.produced_rollout(ro.steps)
                self.ledger.unsent(ro.discarded, "refresh")
                for env_index, t_end in ro.skipped:
                    self.ledger.skip(self.incarnation, env_index, t_end)
            self.produced += ro.steps
            self.padding += ro.padding
            tracker.add_episodes(ro.episodes, budget.used)
            self.beat()
            return True
        with self.ledger.lock:
            self.ledger.produced_rollout(ro.steps)
            self.in_hand = list(ro.fragments)
        self.produced += ro.steps
        tracker.add_episodes(ro.episodes, budget.used)
        self.beat()
        ch = self.channel
        if ch.hang_at is not None and self.produced >= ch.hang_at:
            ch.counts.hangs += 1
            ch.hang_at = None
            wait_hung()  # returns once the supervisor gave up on this incarnation (or the run stops);
            # what it sends after that is refused at the endpoint, as a zombie's data must be
        kill_after = len(ro.fragments)
        if ch.kill_at is not None and self.produced >= ch.kill_at:
            kill_after = int(ch.rng.integers(len(ro.fragments)))  # crash part-way through sending this rollout
        for k in range(len(ro.fragments)):
            if k == kill_after:
                ch.counts.kills += 1
                raise ActorKilled(f"chaos: actor {self.actor_id} (incarnation {self.incarnation}) killed "
                                  f"after {self.produced} steps")
            self._send_next(endpoint)
        return True

    def _send_next(self, endpoint: Endpoint) -> None:
        with self.ledger.lock:
            f = self.in_hand.pop(0)
            self.ledger.sent(f.id.incarnation, f.id.env_index, f.id.t_end, f.length)
            self.channel.send(f)
        self._drain(endpoint, raise_refused=True)

    def _drain(self, endpoint: Endpoint, raise_refused: bool) -> None:
        """Hand everything that leaves the link to the endpoint (each refusal is booked there)."""
        refused = OK
        while self.channel.outbox:
            status = endpoint.deliver(self, self.channel.outbox[0])
            if status != OK:
                refused = status
        if raise_refused and refused == CLOSED:
            raise Closed()
        if raise_refused and refused == ABANDONED:
            raise Abandoned()

    def release_held(self, endpoint: Endpoint) -> None:
        """Deliver what the link holds back now (before the actor pauses: a delay must not last forever)."""
        with self.ledger.lock:
            self.channel.flush()
        self._drain(endpoint, raise_refused=True)

    def close(self, reason: str, endpoint: Optional[Endpoint]) -> None:
        """End this incarnation on any path: what is still in hand is booked as dropped for ``reason``
        (``actor_crash``, ``abandoned``, ``shutdown``); the link delivers what it still holds (the endpoint
        books any refusal); its chaos counts are merged into the run's exactly once; its envs are closed."""
        if self._closed:
            return
        self._closed = True
        try:
            with self.ledger.lock:
                self.ledger.unsent(sum(f.length for f in self.in_hand), reason)
                self.in_hand = []
                self.channel.flush()
            if endpoint is not None:
                self._drain(endpoint, raise_refused=False)
        finally:
            with self._chaos_lock:
                self._run_chaos.merge(self.channel.counts)
            self.actor.close()
