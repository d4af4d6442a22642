"""The Fragment: ``rollout_len`` consecutive steps of one env instance, with its identity.

Arrays plus a plain header (no Python object identity), so the same record can cross a thread, process
or host boundary. Time runs along axis 0.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

SCHEMA_VERSION = 3  # 2: trunc_obs (final observations, evaluated by the learner's critic) and disc_return;
#                    3: masks (envs with action masks) and the recurrent history contract (state, final_state)


@dataclass(frozen=True)
class FragmentId:
    actor_id: int
    incarnation: int  # unique per actor start/restart within a run
    env_index: int  # env instance within the actor
    episode_id: int  # episode (per env instance) at t_start; it increments after every done
    episode_t0: int  # step index within that episode at t_start
    t_start: int  # env-instance step counter (across episodes) of the first step
    t_end: int  # ... of the last step (inclusive)
    behavior_version: int
    schema_version: int = SCHEMA_VERSION

    @property
    def length(self) -> int:
        return self.t_end - self.t_start + 1


@dataclass(frozen=True)
class Fragment:
    id: FragmentId
    obs: np.ndarray  # [T, *obs_shape] float32, raw (unnormalized) observations
    actions: np.ndarray  # [T] int64 or [T, A] float32 (the sampled, unclipped action)
    rewards: np.ndarray  # [T] float32, raw env rewards (the learner scales them if env.normalize_reward)
    terminated: np.ndarray  # [T] bool
    truncated: np.ndarray  # [T] bool (never together with terminated)
    logp: np.ndarray  # [T] float32, behavior log-prob of the action
    values: np.ndarray  # [T] float32, behavior value estimates (diagnostic; the learner recomputes values)
    trunc_obs: np.ndarray  # [K, *obs_shape] float32, the final observation of each truncated step, in time order
    disc_return: np.ndarray  # [T] float32, the episode's discounted raw return through step t (reward scaling)
    last_obs: np.ndarray  # [*obs_shape] obs after the last step (bootstrap)
    mean: Optional[np.ndarray] = None  # [T, A] Gaussian mean (continuous actions)
    log_std: Optional[np.ndarray] = None  # [T, A] Gaussian log-std (continuous actions)
    masks: Optional[np.ndarray] = None  # [T, n] bool: the legal actions at each step (envs with action masks)
    # recurrent policies (the history contract): the behavior policy's state before the first step (zero when it
    # starts an episode) and the state this env's next step starts from (after the last step; zero if it ended one)
    state: Optional[np.ndarray] = None  # [*S] float32
    final_state: Optional[np.ndarray] = None  # [*S] float32

    @classmethod
    def sealed(cls, **fields) -> "Fragment":
        """A fragment whose arrays are read-only: once emitted it cannot change (a retry re-sends it as is)."""
        for v in fields.values():
            if isinstance(v, np.ndarray):
                v.setflags(write=False)
        return cls(**fields)

    @property
    def length(self) -> int:
        """Transitions the header claims (admission checks that the arrays agree); used for accounting."""
        return max(0, self.id.length)

    @property
    def nbytes(self) -> int:
        arrays: Tuple[Optional[np.ndarray], ...] = (
            self.obs, self.actions, self.rewards, self.terminated, self.truncated, self.logp,
            self.values, self.trunc_obs, self.disc_return, self.last_obs, self.mean, self.log_std, self.masks,
            self.state, self.final_state,
        )
        return sum(a.nbytes for a in arrays if isinstance(a, np.ndarray)) + 9 * 8


def successors(frags: Sequence[Fragment]) -> np.ndarray:
    """Reassembly: for each fragment, the index of the fragment that provably continues it, else -1.

    Adjacency must be proven by identity — same actor incarnation, same env instance, ``t_start`` equal
    to the previous ``t_end + 1``, and the episode id the previous fragment's dones lead to. Being the next
    fragment from the same actor id or env slot proves nothing (a restarted actor reuses its counters under
    a new incarnation). A gap leaves the fragment without a successor: its segment ends and is bootstrapped
    from the value of its last observation.

    Recurrent fragments (they carry a ``state``) must also keep the history contract: the successor starts from
    exactly the state the predecessor ended in. Otherwise the two are not joined: each starts from its own stored
    state. (The successor's behavior version may differ: the learner continues a joined successor from the state
    the *current* policy ends the predecessor in, so the version that acted does not enter the state; gating on it
    would cut nearly every join on the asynchronous runners, where the version changes between rollouts.)
    """
    index: Dict[Tuple[int, int, int], int] = {}
    for j, f in enumerate(frags):
        index.setdefault((f.id.incarnation, f.id.env_index, f.id.t_start), j)
    succ = np.full(len(frags), -1, dtype=np.int64)
    for i, f in enumerate(frags):
        j = index.get((f.id.incarnation, f.id.env_index, f.id.t_end + 1))
        if j is None or j == i:
            continue
        g = frags[j]
        ends = int(np.count_nonzero(f.terminated | f.truncated))
        if g.id.actor_id != f.id.actor_id or g.id.episode_id != f.id.episode_id + ends:
            continue
        if f.state is not None and not continues(f, g):
            continue
        succ[i] = j
    return succ


def continues(f: Fragment, g: Fragment) -> bool:
    """The history contract between two adjacent recurrent fragments: ``g`` starts from the state ``f`` ended in
    (bit for bit)."""
    return (g.state is not None and f.final_state is not None and g.state.shape == f.final_state.shape
            and np.array_equal(g.state, f.final_state))


def chain_depths(succ: np.ndarray) -> np.ndarray:
    """Distance from each fragment to the end of its chain (0 = nothing follows it in the batch)."""
    depth = np.full(len(succ), -1, dtype=np.int64)
    for i in range(len(succ)):
        path, j = [], i
        while j >= 0 and depth[j] < 0 and len(path) <= len(succ):
            path.append(j)
            j = int(succ[j])
        d = depth[j] + 1 if j >= 0 else 0
        for k in reversed(path):
            depth[k] = d
            d += 1
    return depth
