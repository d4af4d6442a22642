"""The tagged-episode env and its audit: a test instrument for the transport, kept apart from the production
env code. Observations carry their own provenance (env instance, episode, step), so the learner can check
that every transition it trains on is the one the fragment's identity claims, through stacking, reshaping,
bootstrapping and reassembly."""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import gymnasium as gym
import numpy as np

TAGGED_ID = "laglab/Tagged-v0"
TAG_SCALE = np.array([1000.0, 10000.0, 100.0], dtype=np.float64)  # instance, episode (mod 1e4), timestep


class TaggedEnv(gym.Env):
    """A deterministic small task whose observations carry their own provenance.

    obs = [cue, instance/1000, (episode mod 10000)/10000, t/100]: ``instance`` is the env instance
    (actor_id * envs_per_actor + env index, set by the env group), ``episode`` counts episodes of this env
    object, ``t`` is the step within the episode. The cue is +-1; the right action is 1 when it is
    positive: reward 1 and the episode goes on, a wrong action ends it (terminated, reward 0); after
    ``horizon`` steps it is truncated. Optimal return = horizon; a uniform policy averages ~1.

    ``masked=True`` (the masked variant, ``env.kwargs.masked=true``): ``info["action_mask"]`` names the legal
    actions, a function of the tags: at odd steps only the right action is legal, at even steps both are; so the
    audit can check that every mask the learner trains with is the one of its own observation.
    """

    metadata = {"render_modes": []}

    def __init__(self, horizon: int = 32, masked: bool = False):
        self.horizon = horizon
        self.masked = bool(masked)
        self.observation_space = gym.spaces.Box(-1.0, 1e4, shape=(4,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.instance = 0
        self.episode = -1
        self.t = 0
        self._cue = 1.0

    def set_instance(self, instance: int) -> None:
        self.instance = int(instance)

    def _obs(self) -> np.ndarray:
        return np.array([self._cue, self.instance / TAG_SCALE[0], (self.episode % 10000) / TAG_SCALE[1],
                         self.t / TAG_SCALE[2]], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        self._cue = float(self.np_random.choice([-1.0, 1.0]))
        return self._obs(), self._info()

    def _info(self) -> dict:
        return {"action_mask": expected_mask(self._obs()[None])[0]} if self.masked else {}

    def step(self, action):
        right = int(action) == int(self._cue > 0)
        self.t += 1
        self._cue = float(self.np_random.choice([-1.0, 1.0]))
        terminated = not right
        truncated = right and self.t >= self.horizon
        return self._obs(), float(right), terminated, truncated, self._info()


if TAGGED_ID not in gym.registry:
    gym.register(TAGGED_ID, entry_point=TaggedEnv)


def tags(obs: np.ndarray) -> np.ndarray:
    """[..., 3] integer tags (instance, episode mod 1e4, step) of tagged observations [..., 4]."""
    return np.rint(np.asarray(obs)[..., 1:4].astype(np.float64) * TAG_SCALE).astype(np.int64)


def expected_mask(obs: np.ndarray) -> np.ndarray:
    """[B, 2] the masked variant's legal actions at tagged observations [B, 4]: at odd steps only the right one."""
    obs = np.asarray(obs)
    right = np.stack([obs[:, 0] <= 0, obs[:, 0] > 0], axis=1)
    odd = (tags(obs)[:, 2] % 2 == 1)[:, None]
    return np.where(odd, right, True)


def expected_tags(episode_id: int, episode_t0: int, done: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(episode id, step within episode) of each step of a fragment, from its header and done flags."""
    T = done.shape[0]
    ends_before = np.concatenate([[0], np.cumsum(done[:-1].astype(np.int64))])
    episodes = episode_id + ends_before
    steps = np.empty(T, dtype=np.int64)
    t = episode_t0
    for k in range(T):
        steps[k] = t
        t = 0 if done[k] else t + 1
    return episodes, steps


def audit_tags(obs: np.ndarray, instance: int, episode_id: int, episode_t0: int, done: np.ndarray) -> int:
    """Number of steps whose observation tags disagree with the identity the fragment claims."""
    tg = tags(obs)
    episodes, steps = expected_tags(episode_id, episode_t0, done)
    ok = (tg[:, 0] == instance) & (tg[:, 1] == episodes % 10000) & (tg[:, 2] == steps)
    return int((~ok).sum())


def audit_batch(obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray, trunc_obs: np.ndarray,
                trunc_pos: np.ndarray, last_obs: np.ndarray, frags: Sequence, envs_per_actor: int,
                succ: np.ndarray, masks: Optional[np.ndarray] = None) -> int:
    """Misattributed items in an assembled batch, as the learner will train on it.

    ``obs`` [T*N, 4] (raw, as reshaped for the update), ``actions`` [T*N], ``rewards`` [T, N] (raw),
    ``trunc_obs`` [K, 4] with ``trunc_pos`` [K] their flat [T, N] positions, ``last_obs`` [N, 4] the bootstrap
    observations, ``frags`` the N fragments (column n), ``succ`` the reassembly links. Counted:
    - each step whose observation tags disagree with fragment n's identity at step t (stacking/reshaping),
    - each step whose reward disagrees with its action and cue (obs, action and reward out of line),
    - each bootstrap or truncation observation whose tags are not the step after the one it follows,
    - each joined pair whose first fragment's last observation is not its successor's first observation,
    - (the masked variant: ``masks`` [T*N, 2]) each step whose mask is not the one of its own observation, and each
      action its mask forbids.
    """
    T, N = rewards.shape
    o = np.asarray(obs).reshape(T, N, -1)
    a = np.asarray(actions).reshape(T, N)
    bad = 0
    if masks is not None:
        m = np.asarray(masks, bool).reshape(T * N, -1)
        flat_o = o.reshape(T * N, -1)
        bad += int((m != expected_mask(flat_o)).any(axis=1).sum())
        bad += int((~m[np.arange(T * N), a.reshape(-1)]).sum())
    for n, f in enumerate(frags):
        fid = f.id
        done = np.asarray(f.terminated) | np.asarray(f.truncated)
        instance = fid.actor_id * envs_per_actor + fid.env_index
        bad += audit_tags(o[:, n], instance, fid.episode_id, fid.episode_t0, done)
        right = (a[:, n] == (o[:, n, 0] > 0).astype(np.int64)).astype(np.float64)
        bad += int((np.asarray(rewards)[:, n] != right).sum())
        episodes, steps = expected_tags(fid.episode_id, fid.episode_t0, done)
        nxt_ep = np.where(done, episodes + 1, episodes)
        nxt_t = np.where(done, 0, steps + 1)
        tl = tags(last_obs[n])
        bad += int(not (tl[0] == instance and tl[1] == nxt_ep[-1] % 10000 and tl[2] == nxt_t[-1]))
        for k in np.flatnonzero(trunc_pos % N == n):
            t = int(trunc_pos[k]) // N
            tk = tags(trunc_obs[k])
            bad += int(not (tk[0] == instance and tk[1] == episodes[t] % 10000 and tk[2] == steps[t] + 1))
        j = int(succ[n])
        if j >= 0:
            bad += int(not np.array_equal(last_obs[n], o[0, j]))
    return bad
