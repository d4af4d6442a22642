"""Admission: every fragment is checked before it can reach the learner, and every refusal has a reason.

Checks, in order (the first failure names the reason):
``schema`` unknown schema version · ``identity`` actor/env index out of range, malformed interval or
episode counters · ``length`` an array's length disagrees with the timestep interval · ``shape`` a shape or
dtype disagrees with the env's spaces · ``state`` (recurrent policies) the state at the fragment's start or end
missing, of the wrong shape or dtype, not finite, or not zero where an episode starts; a state sent
to a feed-forward policy · ``non_finite`` observations, rewards, values or bootstrap values
not finite · ``mask`` (envs with action masks) a step whose mask allows no action, or an action its mask does
not allow (an action out of range is ``action``) · ``logp`` behavior log-probs not finite, or (discrete) a
probability outside (0, 1] · ``action`` a discrete action out of range or a continuous one not finite · ``flags`` a step both
terminated and truncated, or a number of final observations (``trunc_obs``) other than the number of
truncated steps · ``future_version``
behavior version newer than the learner's.

Whether a delivery is the first copy of its fragment, a duplicate, or not attributable to any stream is
decided where it arrives (:class:`laglab.accounting.Ledger`); admission applies ``transport.duplicates`` to
the duplicates: ``ignore`` refuses them, ``charge`` admits a well-formed one again (outside the produced
count, and counted). A fragment whose length differs from ``actor.rollout_len`` is refused as ``length``
(a batch is whole fragments of that length). An arrival no stream can own is refused and counted as
``unattributed`` (its steps show up as lost on the stream that sent them).
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Dict, Optional

import numpy as np

from .config import Duplicates
from .envs import EnvSpec
from .fragment import SCHEMA_VERSION, Fragment

KNOWN_SCHEMAS = frozenset({SCHEMA_VERSION})
_FLOAT_FIELDS = ("rewards", "values", "disc_return")


@dataclass
class AdmissionStats:
    admitted_fragments: int = 0
    admitted_steps: int = 0  # first copies admitted
    bytes_admitted: int = 0
    duplicates_refused: int = 0  # re-deliveries refused under ``ignore`` (or malformed under ``charge``)
    duplicate_steps_admitted: int = 0  # transitions admitted again under duplicates=charge
    rejected: Dict[str, int] = field(default_factory=collections.Counter)  # steps of first copies, by reason
    unattributed: int = 0  # steps claimed by arrivals no stream owns (refused)


def validate(frag: Fragment, spec: EnvSpec, n_actors: int, envs_per_actor: int, learner_version: int,
             state_shape: Optional[tuple] = None) -> Optional[str]:
    """The reason ``frag`` must be refused, or None if it is well-formed. Never raises on bad input.
    ``state_shape``: the recurrent policy's state shape (None: a feed-forward policy)."""
    try:
        return _validate(frag, spec, n_actors, envs_per_actor, learner_version, state_shape)
    except Exception:  # noqa: BLE001 - a malformed record must be refused, not crash the learner
        return "malformed"


def _validate(frag: Fragment, spec: EnvSpec, n_actors: int, envs_per_actor: int, learner_version: int,
              state_shape: Optional[tuple]) -> Optional[str]:
    fid = frag.id
    if fid.schema_version not in KNOWN_SCHEMAS:
        return "schema"
    if not (0 <= fid.actor_id < n_actors and 0 <= fid.env_index < envs_per_actor and fid.incarnation >= 0
            and 0 <= fid.t_start <= fid.t_end and fid.episode_id >= 0 and fid.episode_t0 >= 0):
        return "identity"
    T = fid.t_end - fid.t_start + 1
    arrays = (frag.obs, frag.actions, frag.rewards, frag.terminated, frag.truncated, frag.logp, frag.values,
              frag.disc_return)
    if any(not isinstance(a, np.ndarray) or a.ndim < 1 or a.shape[0] != T for a in arrays):
        return "length"
    if (frag.obs.shape[1:] != spec.obs_shape or frag.obs.dtype != np.float32
            or not isinstance(frag.last_obs, np.ndarray) or frag.last_obs.shape != spec.obs_shape
            or frag.last_obs.dtype != np.float32
            or not isinstance(frag.trunc_obs, np.ndarray) or frag.trunc_obs.ndim != 1 + len(spec.obs_shape)
            or frag.trunc_obs.shape[1:] != spec.obs_shape or frag.trunc_obs.dtype != np.float32
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
    masks = frag.masks
    if spec.masked:
        if (not isinstance(masks, np.ndarray) or masks.dtype != np.bool_
                or masks.shape != (T, spec.n_actions)):
            return "shape"
    elif masks is not None:
        return "shape"
    if state_shape is None:
        if frag.state is not None or frag.final_state is not None:
            return "state"
    else:
        for st in (frag.state, frag.final_state):
            if (not isinstance(st, np.ndarray) or st.dtype != np.float32 or st.shape != tuple(state_shape)
                    or not np.isfinite(st).all()):
                return "state"
        if fid.episode_t0 == 0 and frag.state.any():  # an episode starts from the zero state
            return "state"
        if (frag.terminated[-1] or frag.truncated[-1]) and frag.final_state.any():  # ... so does the next one
            return "state"
    if not (np.isfinite(frag.obs).all() and np.isfinite(frag.last_obs).all() and np.isfinite(frag.trunc_obs).all()
            and all(np.isfinite(getattr(frag, n)).all() for n in _FLOAT_FIELDS)):
        return "non_finite"
    if spec.masked:  # (before logp: an action its mask forbids has no finite behavior log-prob)
        if ((frag.actions < 0) | (frag.actions >= spec.n_actions)).any():
            return "action"
        if not masks.any(axis=1).all() or not masks[np.arange(T), frag.actions].all():
            return "mask"
    if not np.isfinite(frag.logp).all() or (spec.discrete and (frag.logp > 0).any()):
        return "logp"
    if spec.discrete:
        if ((frag.actions < 0) | (frag.actions >= spec.n_actions)).any():
            return "action"
    elif not (np.isfinite(frag.actions).all() and np.isfinite(frag.mean).all() and np.isfinite(frag.log_std).all()):
        return "action"
    if frag.terminated.dtype != np.bool_ or frag.truncated.dtype != np.bool_:
        return "flags"
    if (frag.terminated & frag.truncated).any() or frag.trunc_obs.shape[0] != int(frag.truncated.sum()):
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
    """Validation + duplicate policy + counters, in front of the learner (used from the learner's thread)."""

    def __init__(self, spec: EnvSpec, n_actors: int, envs_per_actor: int, duplicates: Duplicates,
                 rollout_len: Optional[int] = None, state_shape: Optional[tuple] = None):
        self.spec = spec
        self.state_shape = None if state_shape is None else tuple(state_shape)
        self.n_actors = n_actors
        self.envs_per_actor = envs_per_actor
        self.rollout_len = rollout_len
        self.duplicates = Duplicates(duplicates)
        self.stats = AdmissionStats()

    def check(self, frag: Fragment, learner_version: int) -> Optional[str]:
        reason = validate(frag, self.spec, self.n_actors, self.envs_per_actor, learner_version, self.state_shape)
        if reason is None and self.rollout_len is not None and frag.id.length != self.rollout_len:
            return "length"
        return reason

    def admit(self, frag: Fragment, first: Optional[bool], learner_version: int) -> Optional[str]:
        """``first``: True for the first copy of its fragment to arrive, False for a re-delivery, None for an
        arrival no stream owns. Returns None if ``frag`` may go to the learner, ``"charged"`` for a duplicate
        admitted again under ``charge``, otherwise why it was refused: ``"duplicate"`` (not a rejection of
        produced data: its first copy had its own fate), ``"unattributed"``, or a rejection reason (counted)."""
        st = self.stats
        reason = self.check(frag, learner_version)
        if first is None:
            st.unattributed += claimed_steps(frag)
            return reason or "unattributed"
        if not first:
            if self.duplicates == Duplicates.ignore or reason is not None:
                st.duplicates_refused += 1
                return "duplicate"
            st.duplicate_steps_admitted += frag.length
            st.admitted_fragments += 1
            st.bytes_admitted += frag.nbytes
            return "charged"
        if reason is not None:
            st.rejected[reason] += claimed_steps(frag)
            return reason
        st.admitted_steps += frag.length
        st.admitted_fragments += 1
        st.bytes_admitted += frag.nbytes
        return None
