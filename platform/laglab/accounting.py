"""The books of a run: the env-step budget, and where every produced transition is.

Each party counts what it does, and the ledger brings the counts together:
- producers (actor incarnations): steps produced, steps in hand (collected, not yet sent), and per stream
  (incarnation, env instance) the *watermark* of what they handed to the link (``t_end + 1`` of the last
  fragment sent), plus what they never sent, by reason (``actor_crash``, ``abandoned``, ``shutdown``);
- the link (chaos, a pipe): what it still holds;
- the receiving endpoint: every arrival, classified as the first copy of its fragment, a duplicate, a
  delivery too old to tell (``too_old``) or one whose identity cannot be attributed to any stream; and the
  fates it decides at the door (refused because the run is stopping or the sender was abandoned);
- the queue (what it holds, evicts and refuses), the learner (staging, admitted, dropped for lag) and
  admission (rejected by reason).

Loss is *detected*, not reported by whoever lost the data: per stream, ``sent - arrived - still in the
link`` is lost in transit. The identity ``produced == admitted + dropped + rejected + in_flight`` (in flight
= in hand + link + queue + staging) is checked at every learner update; ``unaccounted`` is what does not
close, and must be 0. Every move between these places happens under :attr:`Ledger.lock`, so the check
reads one consistent state.
"""
from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field
from typing import Callable, Deque, Dict, Iterable, Optional, Set, Tuple

# arrival classes
FIRST, DUPLICATE, TOO_OLD, UNATTRIBUTED = "first", "duplicate", "too_old", "unattributed"


class Budget:
    """The run's env-step budget. Actors reserve a whole rollout before collecting it, so the steps
    produced never exceed ``total``; a rollout that fails before it is produced gives its steps back."""

    def __init__(self, total: int, used: int = 0):
        self.total = total
        self.used = used
        self._lock = threading.Lock()

    def reserve(self, n: int) -> bool:
        with self._lock:
            if self.used + n > self.total:
                return False
            self.used += n
            return True

    def has_room(self, n: int) -> bool:
        with self._lock:
            return self.used + n <= self.total

    def release(self, n: int) -> None:
        with self._lock:
            self.used -= n


@dataclass
class Stream:
    """One (incarnation, env instance) stream of fragments, as both ends see it."""

    sent: int = 0  # producer's watermark: steps handed to the link (its fragments go out in order)
    arrived: int = 0  # steps of distinct fragments that reached the receiving endpoint
    order: Deque[int] = field(default_factory=collections.deque)  # first timesteps remembered, arrival order
    seen: Set[int] = field(default_factory=set)
    floor: int = -1  # the largest first timestep forgotten (the seen-set is bounded)


class Ledger:
    """Sender and receiver books of the transport. ``lock`` (re-entrant) orders every move of a fragment
    between places; the queue's own lock is only ever taken inside it."""

    def __init__(self, rollout_len: int, envs_per_actor: int, dedup_window: int = 64,
                 allocate: Optional[Callable[[], int]] = None):
        """``allocate()`` hands out incarnation numbers (the learner's counter, which checkpoints carry, so a
        resumed run never reuses one); default: 1, 2, 3, ..."""
        self.lock = threading.RLock()
        self.rollout_len = rollout_len
        self.envs_per_actor = envs_per_actor
        self.window = dedup_window
        self.produced = 0
        self.in_hand = 0
        self.dropped: Dict[str, int] = collections.Counter()  # fates decided outside the learner
        self.rejected: Dict[str, int] = collections.Counter()
        self.duplicates = 0  # arrivals of a fragment that had arrived before (deliveries)
        self.too_old = 0  # arrivals older than the seen-set remembers (deliveries)
        self.unattributed = 0  # steps claimed by arrivals that no stream can own
        self.streams: Dict[Tuple[int, int], Stream] = {}
        self.owner: Dict[int, int] = {}  # incarnation -> actor id (of incarnations not retired)
        self.retired_gap = 0  # steps sent and never arrived, of the incarnations retired (see retire)
        self._count = iter(range(1, 2**62))
        self.allocate = allocate or (lambda: next(self._count))

    # ---- producers ----------------------------------------------------------------------------------
    def new_incarnation(self, actor_id: int) -> int:
        """A fresh incarnation number (unique within the run and across resumes)."""
        with self.lock:
            inc = self.allocate()
            self.owner[inc] = actor_id
            return inc

    def produced_rollout(self, steps: int) -> None:
        self.produced += steps
        self.in_hand += steps

    def sent(self, inc: int, env_index: int, t_end: int, steps: int) -> None:
        """A fragment left the producer's hands into the link."""
        self.in_hand -= steps
        self.mark_sent(inc, env_index, t_end)

    def mark_sent(self, inc: int, env_index: int, t_end: int) -> None:
        """Advance a stream's watermark (the producer reports its own in-hand count: the process runner)."""
        s = self.streams.setdefault((inc, env_index), Stream())
        s.sent = max(s.sent, t_end + 1)

    def retire(self, inc: int) -> None:
        """Forget an incarnation from which nothing can arrive any more (its life is finalized, its link empty):
        what it sent and never arrived stays counted as lost; its streams and seen-sets go, so a run with
        thousands of restarts holds the state of its live incarnations only. Anything that still claims to come
        from it is unattributable."""
        with self.lock:
            for env in range(self.envs_per_actor):
                s = self.streams.pop((inc, env), None)
                if s is not None:
                    self.retired_gap += s.sent - s.arrived
            self.owner.pop(inc, None)

    def unsent(self, steps: int, reason: str) -> None:
        """Steps in hand that will never be sent (the producer crashed, was abandoned, or the run stops)."""
        if steps:
            self.in_hand -= steps
            self.dropped[reason] += steps

    def skip(self, inc: int, env_index: int, t_end: int) -> None:
        """A stream's next range, up to ``t_end``, will never be sent (a rollout discarded part-way, whose steps
        the producer books as dropped): the watermark passes it and it counts as arrived, so it is neither lost
        in transit nor claimable by an arrival."""
        s = self.streams.setdefault((inc, env_index), Stream())
        if t_end + 1 > s.sent:
            s.arrived += t_end + 1 - s.sent
            for t in range(max(s.sent, t_end + 1 - self.rollout_len), t_end + 1, self.rollout_len):
                self._remember(s, t)  # an arrival claiming it is a duplicate, not a first copy
            s.sent = t_end + 1

    # ---- the receiving endpoint ---------------------------------------------------------------------
    def _stream_of(self, frag) -> Optional[Stream]:
        try:
            fid = frag.id
            inc, env, t0, t1 = int(fid.incarnation), int(fid.env_index), int(fid.t_start), int(fid.t_end)
        except Exception:  # noqa: BLE001 - a header too broken to read
            return None
        s = self.streams.get((inc, env))
        T = self.rollout_len
        if (s is None or self.owner.get(inc) != getattr(fid, "actor_id", None) or t0 % T or t1 - t0 + 1 != T
                or t1 >= s.sent):
            return None  # no stream sent this: not attributable
        return s

    def classify(self, frag) -> str:
        """first | duplicate | too_old | unattributed (no change to the books)."""
        s = self._stream_of(frag)
        if s is None:
            return UNATTRIBUTED
        t = frag.id.t_start
        if t in s.seen:
            return DUPLICATE
        if t <= s.floor:
            return TOO_OLD
        return FIRST

    def arrive(self, frag, cls: str) -> None:
        """Record an arrival classified by :meth:`classify` (under the same hold of ``lock``)."""
        if cls == FIRST:
            s = self._stream_of(frag)
            s.arrived += self.rollout_len
            self._remember(s, frag.id.t_start)
        elif cls == DUPLICATE:
            self.duplicates += 1
        elif cls == TOO_OLD:
            self.too_old += 1
        else:
            try:
                self.unattributed += max(0, int(frag.id.t_end) - int(frag.id.t_start) + 1)
            except Exception:  # noqa: BLE001
                pass

    def _remember(self, s: Stream, t: int) -> None:
        s.order.append(t)
        s.seen.add(t)
        if len(s.order) > self.window:
            old = s.order.popleft()
            s.seen.discard(old)
            s.floor = max(s.floor, old)

    def has_arrived(self, frag) -> bool:
        s = self.streams.get((frag.id.incarnation, frag.id.env_index))
        return s is not None and (frag.id.t_start in s.seen or frag.id.t_start <= s.floor)

    def book(self, bucket: str, reason: str, steps: int) -> None:
        """A fate decided at the endpoint or in the queue, for the first copy of a fragment."""
        if steps:
            (self.dropped if bucket == "dropped" else self.rejected)[reason] += steps

    # ---- detection ----------------------------------------------------------------------------------
    def link_steps(self, link: Iterable) -> int:
        """Steps of distinct fragments still held in links whose first copy has not arrived."""
        keys = {(f.id.incarnation, f.id.env_index, f.id.t_start): f.length for f in link if not self.has_arrived(f)}
        return sum(keys.values())

    def lost(self, link_steps: int) -> int:
        """Sent, never arrived, and not in any link: lost in transit (detected by timestep watermarks)."""
        return sum(s.sent - s.arrived for s in self.streams.values()) + self.retired_gap - link_steps

    def sent_by_incarnation(self) -> Dict[int, int]:
        """Steps each incarnation has handed to its link (the sum of its streams' watermarks)."""
        out: Dict[int, int] = collections.Counter()
        for (inc, _), s in self.streams.items():
            out[inc] += s.sent
        return dict(out)

    def gaps(self) -> Dict[Tuple[int, int], int]:
        """Per stream: steps sent that have not arrived (in a link or lost)."""
        return {k: s.sent - s.arrived for k, s in self.streams.items() if s.sent != s.arrived}


@dataclass
class Balance:
    """One reading of the identity ``produced == admitted + dropped + rejected + in_flight``."""

    produced: int
    admitted: int
    dropped: Dict[str, int]
    rejected: Dict[str, int]
    in_flight: Dict[str, int]  # in_hand, link, queue, staging

    @property
    def unaccounted(self) -> int:
        return (self.produced - self.admitted - sum(self.dropped.values()) - sum(self.rejected.values())
                - sum(self.in_flight.values()))

    def metrics(self) -> Dict[str, float]:
        m = {"transport/produced": float(self.produced), "transport/in_flight": float(sum(self.in_flight.values())),
             "transport/unaccounted": float(self.unaccounted)}
        m.update({f"transport/in_flight/{k}": float(v) for k, v in self.in_flight.items()})
        m.update(counters("transport/dropped", self.dropped))
        m.update(counters("transport/rejected", self.rejected))
        return m

    def as_dict(self) -> Dict[str, object]:
        return {"produced": self.produced, "admitted": self.admitted, "dropped": dict(sorted(self.dropped.items())),
                "rejected": dict(sorted(self.rejected.items())), "in_flight": sum(self.in_flight.values()),
                "in_flight_parts": dict(self.in_flight), "unaccounted": self.unaccounted,
                "balanced": self.unaccounted == 0}


def counters(prefix: str, counts: Dict[str, int]) -> Dict[str, float]:
    """``{prefix: total, prefix/<reason>: n}``: the total is always present, reasons once they occur."""
    out = {prefix: float(sum(counts.values()))}
    out.update({f"{prefix}/{reason}": float(n) for reason, n in counts.items()})
    return out


def merged(*counts: Dict[str, int]) -> Dict[str, int]:
    out: Dict[str, int] = collections.Counter()
    for c in counts:
        for k, v in c.items():
            out[k] += v
    return {k: v for k, v in out.items() if v}
