"""Admission: every fragment is checked before it can reach the learner, and every refusal has a reason.

Checks, in order (the first failure names the reason):
``schema`` unknown schema version · ``identity`` actor/env index out of range, malformed interval or
episode counters · ``length`` an array's length disagrees with the timestep interval · ``shape`` a shape or
dtype disagrees with the env's spaces · ``non_finite`` observations, rewards, values or bootstrap values
not finite · ``logp`` behavior log-probs not finite, or (discrete) a probability outside (0, 1] ·
``action`` a discrete action out of range or a continuous one not finite · ``flags`` a step both
terminated and truncated, or a truncation bootstrap on a step that was not truncated · ``future_version``
behavior version newer than the learner's.

Duplicates (same actor incarnation, env instance and first timestep) follow ``transport.duplicates``:
``ignore`` admits the first delivery only, ``charge`` admits every delivery; both count them. The seen-set
is bounded: per (incarnation, env instance) it keeps the first timesteps of the last ``dedup_window``
fragments; a delivery at or below the largest first timestep it has forgotten is refused as ``too_old``
rather than risk admitting a duplicate twice. Its memory is O(incarnations x envs x dedup_window). A
fragment whose length differs from ``actor.rollout_len`` is refused as ``length`` (a batch is whole
fragments of that length).
"""
from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field
from typing import Deque, Dict, List, Optional, Set, Tuple

import numpy as np

from .config import Duplicates
from .envs import EnvSpec
from .fragment import SCHEMA_VERSION, Fragment

KNOWN_SCHEMAS = frozenset({SCHEMA_VERSION})
_FLOAT_FIELDS = ("rewards", "values", "trunc_values")


@dataclass
class AdmissionStats:
    admitted_fragments: int = 0
    admitted_steps: int = 0
    bytes_admitted: int = 0
    duplicates_detected: int = 0  # deliveries of a fragment already seen (fragments)
    duplicate_steps_admitted: int = 0  # transitions admitted again under duplicates=charge
    rejected: Dict[str, int] = field(default_factory=collections.Counter)  # steps by reason
    discarded: Dict[Tuple[str, str], int] = field(default_factory=collections.Counter)  # by the transport


def validate(frag: Fragment, spec: EnvSpec, n_actors: int, envs_per_actor: int, learner_version: int) -> Optional[str]:
    """The reason ``frag`` must be refused, or None if it is well-formed. Never raises on bad input."""
    try:
        return _validate(frag, spec, n_actors, envs_per_actor, learner_version)
    except Exception:  # noqa: BLE001 - a malformed record must be refused, not crash the learner
        return "malformed"


def _validate(frag: Fragment, spec: EnvSpec, n_actors: int, envs_per_actor: int, learner_version: int) -> Optional[str]:
    fid = frag.id
    if fid.schema_version not in KNOWN_SCHEMAS:
        return "schema"
    if not (0 <= fid.actor_id < n_actors and 0 <= fid.env_index < envs_per_actor and fid.incarnation >= 0
            and 0 <= fid.t_start <= fid.t_end and fid.episode_id >= 0 and fid.episode_t0 >= 0):
        return "identity"
    T = fid.t_end - fid.t_start + 1
    arrays = (frag.obs, frag.actions, frag.rewards, frag.terminated, frag.truncated, frag.logp, frag.values,
              frag.trunc_values)
    if any(not isinstance(a, np.ndarray) or a.ndim < 1 or a.shape[0] != T for a in arrays):
        return "length"
    if (frag.obs.shape[1:] != spec.obs_shape or frag.obs.dtype != np.float32
            or not isinstance(frag.last_obs, np.ndarray) or frag.last_obs.shape != spec.obs_shape
            or frag.last_obs.dtype != np.float32
            or any(getattr(frag, n).shape != (T,) or getattr(frag, n).dtype != np.float32 for n in _FLOAT_FIELDS)
            or frag.logp.shape != (T,) or frag.logp.dtype != np.float32
            or frag.terminated.shape != (T,) or frag.truncated.shape != (T,)):
        return "shape"
    if spec.discrete:
        if frag.actions.shape != (T,) or frag.actions.dtype != np.int64:
            return "shape"
    else:
        want = (T, spec.n_actions)
        if (frag.actions.shape != want or frag.actions.dtype != np.float32 or frag.mean is None
                or frag.log_std is None or frag.mean.shape != want or frag.log_std.shape != want):
            return "shape"
    if not (np.isfinite(frag.obs).all() and np.isfinite(frag.last_obs).all()
            and all(np.isfinite(getattr(frag, n)).all() for n in _FLOAT_FIELDS)):
        return "non_finite"
    if not np.isfinite(frag.logp).all() or (spec.discrete and (frag.logp > 0).any()):
        return "logp"
    if spec.discrete:
        if ((frag.actions < 0) | (frag.actions >= spec.n_actions)).any():
            return "action"
    elif not (np.isfinite(frag.actions).all() and np.isfinite(frag.mean).all() and np.isfinite(frag.log_std).all()):
        return "action"
    if frag.terminated.dtype != np.bool_ or frag.truncated.dtype != np.bool_:
        return "flags"
    if (frag.terminated & frag.truncated).any() or (frag.trunc_values[~frag.truncated] != 0).any():
        return "flags"
    if fid.behavior_version > learner_version:
        return "future_version"
    return None


def claimed_steps(frag: Fragment) -> int:
    try:
        return int(frag.length)
    except Exception:  # noqa: BLE001 - a header too broken to say how long it is
        return 0


class Admission:
    """Validation + duplicate policy + counters, in front of the learner. Thread-safe: the transport
    reports what it discards (``discard``) from actor threads."""

    def __init__(self, spec: EnvSpec, n_actors: int, envs_per_actor: int, duplicates: Duplicates,
                 dedup_window: int = 64, rollout_len: Optional[int] = None):
        self.spec = spec
        self.n_actors = n_actors
        self.envs_per_actor = envs_per_actor
        self.rollout_len = rollout_len
        self.duplicates = Duplicates(duplicates)
        self.window = dedup_window
        self.stats = AdmissionStats()
        # per (incarnation, env): arrival order, the set of first timesteps seen, and a floor (the largest
        # first timestep forgotten): anything at or below the floor that is not remembered is too old
        self._seen: Dict[Tuple[int, int], Tuple[Deque[int], Set[int], List[int]]] = {}
        # fragments the transport discarded before any copy was admitted: (key, t_start) -> (bucket, reason, steps)
        self._discarded: "collections.OrderedDict[Tuple[Tuple[int, int], int], Tuple[str, str, int]]" = \
            collections.OrderedDict()
        self._lock = threading.Lock()

    def _validate(self, frag: Fragment, learner_version: int) -> Optional[str]:
        reason = validate(frag, self.spec, self.n_actors, self.envs_per_actor, learner_version)
        if reason is None and self.rollout_len is not None and frag.id.length != self.rollout_len:
            return "length"
        return reason

    def _slot(self, frag: Fragment):
        return self._seen.setdefault((frag.id.incarnation, frag.id.env_index), (collections.deque(), set(), [-1]))

    def _duplicate(self, frag: Fragment) -> Optional[str]:
        """'duplicate', 'too_old' or None; records the delivery."""
        order, seen, floor = self._slot(frag)
        t = frag.id.t_start
        if t in seen:
            return "duplicate"
        if t <= floor[0]:
            return "too_old"
        order.append(t)
        seen.add(t)
        if len(order) > self.window:
            old = order.popleft()
            seen.discard(old)
            floor[0] = max(floor[0], old)
        return None

    def discard(self, frag: Fragment, bucket: str, reason: str) -> None:
        """The transport refused or evicted ``frag`` (``bucket`` is "dropped" or "rejected"). Exactly one
        copy of a fragment is its fate: a discarded copy of an admitted fragment, or a second discarded
        copy, only counts as a duplicate; a discarded fragment whose other copy is admitted later is
        moved from the discard counts to the duplicates then."""
        steps = claimed_steps(frag)
        with self._lock:
            if validate(frag, self.spec, self.n_actors, self.envs_per_actor, 2**62) in ("identity", "malformed"):
                self.stats.discarded[(bucket, reason)] += steps
                return
            key = ((frag.id.incarnation, frag.id.env_index), frag.id.t_start)
            if frag.id.t_start in self._slot(frag)[1] or key in self._discarded:
                self.stats.duplicates_detected += 1
                return
            self._discarded[key] = (bucket, reason, steps)
            self.stats.discarded[(bucket, reason)] += steps
            if len(self._discarded) > self.window * max(1, self.n_actors * self.envs_per_actor):
                self._discarded.popitem(last=False)  # bounded like the seen-set

    def admit(self, frag: Fragment, learner_version: int) -> Optional[str]:
        """None if ``frag`` may go to the learner; ``"charged"`` for a duplicate admitted again under
        ``charge``; otherwise the reason it was refused (and counted). A duplicate refused under
        ``ignore`` returns ``"duplicate"`` and is not a rejection of produced data: its first delivery
        was admitted."""
        with self._lock:
            return self._admit(frag, learner_version)

    def _admit(self, frag: Fragment, learner_version: int) -> Optional[str]:
        steps = claimed_steps(frag)
        reason = self._validate(frag, learner_version)
        trusted = reason not in ("identity", "malformed")
        if trusted:
            key = ((frag.id.incarnation, frag.id.env_index), frag.id.t_start)
            earlier = self._discarded.pop(key, None)
            if earlier is not None and frag.id.t_start not in self._slot(frag)[1]:
                b, r, n = earlier  # a copy was discarded on the way; this one arrived and is the fragment
                self.stats.discarded[(b, r)] -= n
                self.stats.duplicates_detected += 1
        # a re-delivery is a duplicate whatever its payload: a bad fragment delivered twice is rejected once
        dup = self._duplicate(frag) if trusted else None
        if dup == "duplicate":
            self.stats.duplicates_detected += 1
            if self.duplicates == Duplicates.ignore or reason is not None:
                return "duplicate"
            self.stats.duplicate_steps_admitted += steps  # charged: admitted again, outside `produced`
        elif dup is not None and reason is None:
            reason = dup
        if reason is not None:
            self.stats.rejected[reason] += steps
            return reason
        if dup is None:
            self.stats.admitted_steps += steps
        self.stats.admitted_fragments += 1
        self.stats.bytes_admitted += frag.nbytes
        return None if dup is None else "charged"
