"""Environments: ``make_env`` for any gymnasium id, a small same-step-autoreset env group that an actor
steps with one batched action, and the running statistics used for observation/reward normalization.

MuJoCo's C library prints its warnings straight to the process's stderr (descriptor 2, not Python's
``sys.stderr`` nor the warnings module): mujoco 4.0 warns ``compiler attribute 'settotalmass' is deprecated``
for every HalfCheetah it compiles, in every actor process. ``make_env`` hands them to MuJoCo's warning
callback instead, which writes each distinct message once per process to the run's log file."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import gymnasium as gym
import numpy as np

from .config import ConfigError, EnvConfig
from .console import LOG_FILE_ENV, third_party_log


LATENCY_ID = "laglab/Latency-v0"


class LatencyEnv(gym.Env):
    """A task whose every step costs ``latency_ms`` of wall time without holding the GIL (a sleep), for scaling
    studies that separate runner overhead from env cost. Observations are 4 random numbers, the reward is 1
    when the action matches the sign of the first one, episodes last ``horizon`` steps (truncated)."""

    metadata = {"render_modes": []}

    def __init__(self, latency_ms: float = 2.0, horizon: int = 200):
        self.latency_s = float(latency_ms) / 1000.0
        self.horizon = horizon
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0
        self._obs = np.zeros(4, np.float32)

    def _draw(self) -> np.ndarray:
        self._obs = self.np_random.uniform(-1.0, 1.0, 4).astype(np.float32)
        return self._obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._draw(), {}

    def step(self, action):
        if self.latency_s > 0:
            time.sleep(self.latency_s)
        reward = float(int(action) == int(self._obs[0] > 0))
        self.t += 1
        return self._draw(), reward, False, self.t >= self.horizon, {}


if LATENCY_ID not in gym.registry:
    gym.register(LATENCY_ID, entry_point=LatencyEnv)


MASK_KEY = "action_mask"


class MaskFromDict(gym.Wrapper):
    """A Dict observation ``{"action_mask": ..., <one Box>: ...}`` as the Box alone, with the mask moved to
    ``info["action_mask"]`` (where laglab reads every env's mask)."""

    def __init__(self, env: gym.Env, key: str):
        super().__init__(env)
        self._key = key
        self.observation_space = env.observation_space[key]

    def _split(self, obs, info):
        info = dict(info)
        info[MASK_KEY] = np.asarray(obs[MASK_KEY])
        return obs[self._key], info

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return self._split(obs, info)

    def step(self, action):
        obs, r, te, tr, info = self.env.step(action)
        o, info = self._split(obs, info)
        return o, r, te, tr, info


def _unmask_dict(env: gym.Env, env_id: str) -> gym.Env:
    space = env.observation_space
    if not isinstance(space, gym.spaces.Dict):
        return env
    others = [k for k in space.spaces if k != MASK_KEY]
    if MASK_KEY not in space.spaces or len(others) != 1 or not isinstance(space[others[0]], gym.spaces.Box):
        env.close()
        raise ConfigError(f"invalid config: env.id={env_id!r} has observation space {space}; allowed: Box, or a Dict "
                          f"of one Box and an {MASK_KEY!r} entry")
    return MaskFromDict(env, others[0])


class MaskedPickEnv(gym.Env):
    """A small task that needs action masks. Each step the agent picks one of ``n`` items; the observation is each
    item's value, and ``info["action_mask"]`` says which items may be picked this step (each with probability 1/2,
    at least one). The reward is the picked item's value (in [0, 1]). Items that may not be picked look better
    (their values are in [0.5, 1.5]: a policy that ignores the mask is drawn to them), and picking one ends the
    episode with reward -1 (terminated). Episodes are truncated after ``horizon`` steps. Under the mask the best
    policy picks the most valuable legal item (about 0.72 per step); without it a policy must tell legality from
    the values alone, which is ambiguous wherever they overlap ([0.5, 1]), and every mistake ends the episode."""

    metadata = {"render_modes": []}

    def __init__(self, n: int = 6, horizon: int = 50):
        self.n, self.horizon = int(n), int(horizon)
        self.observation_space = gym.spaces.Box(0.0, 1.5, shape=(self.n,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(self.n)
        self.t = 0
        self._mask = np.ones(self.n, bool)
        self._vals = np.zeros(self.n, np.float32)

    def _draw(self):
        rng = self.np_random
        self._mask = rng.random(self.n) < 0.5
        if not self._mask.any():
            self._mask[rng.integers(self.n)] = True
        self._vals = rng.random(self.n).astype(np.float32)
        self._vals[~self._mask] += 0.5
        return self._vals.copy(), {MASK_KEY: self._mask.copy()}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._draw()

    def step(self, action):
        a = int(action)
        self.t += 1
        if not self._mask[a]:
            obs, info = self._draw()
            return obs, -1.0, True, False, info
        r = float(self._vals[a])
        obs, info = self._draw()
        return obs, r, False, self.t >= self.horizon, info


class HiddenVelocities(gym.ObservationWrapper):
    """CartPole with its velocities hidden (the standard partially observed variant): the observation is the cart
    position and the pole angle only, so a memoryless policy cannot tell which way the pole is falling."""

    KEEP = (0, 2)

    def __init__(self, env: gym.Env):
        super().__init__(env)
        box = env.observation_space
        self.observation_space = gym.spaces.Box(box.low[list(self.KEEP)], box.high[list(self.KEEP)], dtype=np.float32)

    def observation(self, obs):
        return np.asarray(obs, np.float32)[list(self.KEEP)]


def _cartpole_pomdp(**kwargs) -> gym.Env:
    return HiddenVelocities(gym.make("CartPole-v1", **kwargs))


CARTPOLE_POMDP_ID = "laglab/CartPolePOMDP-v0"
if CARTPOLE_POMDP_ID not in gym.registry:
    gym.register(CARTPOLE_POMDP_ID, entry_point=_cartpole_pomdp)


MASKED_PICK_ID = "laglab/MaskedPick-v0"
if MASKED_PICK_ID not in gym.registry:
    gym.register(MASKED_PICK_ID, entry_point=MaskedPickEnv)


_mujoco_seen: set = set()


def _mujoco_warning(msg: str) -> None:
    key = (os.environ.get(LOG_FILE_ENV), msg)  # the same warning for every env compiled: once per log file
    if key not in _mujoco_seen:
        _mujoco_seen.add(key)
        third_party_log().warning("mujoco (pid %d): %s", os.getpid(), msg)


def _quiet_mujoco(env_id: str) -> None:
    """Route MuJoCo's C warnings to the run's log file (before the env compiles its model), unless the
    program installed a warning callback of its own."""
    try:
        entry = gym.spec(env_id).entry_point
    except Exception:  # noqa: BLE001 - an id that cannot be looked up is make_env's to report
        return
    if "mujoco" not in str(entry):
        return
    try:
        import mujoco
    except ImportError:
        return  # make_env reports the missing extra
    if mujoco.get_mju_user_warning() is None:
        mujoco.set_mju_user_warning(_mujoco_warning)


def make_env(cfg: EnvConfig, actor_id: Optional[int] = None, render_mode: Optional[str] = None) -> gym.Env:
    """Build one environment; unknown ids and missing extras become a :class:`ConfigError`. For the latency
    env, actor ``i`` gets ``env.latency_ms[i % len]`` (heterogeneous simulators)."""
    kwargs: Dict[str, Any] = dict(cfg.kwargs or {})
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    if cfg.id == LATENCY_ID and cfg.latency_ms:
        kwargs.setdefault("latency_ms", float(cfg.latency_ms[(actor_id or 0) % len(cfg.latency_ms)]))
    if cfg.max_episode_steps is not None:
        kwargs["max_episode_steps"] = cfg.max_episode_steps
    _quiet_mujoco(cfg.id)
    try:
        env = gym.make(cfg.id, **kwargs)
    except gym.error.Error as e:  # unknown id, deprecated version, bad kwargs the registry catches
        raise ConfigError(f"invalid config: env.id={cfg.id!r} could not be made: {e}") from e
    except (ImportError, ModuleNotFoundError) as e:
        raise ConfigError(
            f"invalid config: env.id={cfg.id!r} needs an optional dependency ({e}); "
            "for MuJoCo tasks: pip install 'gymnasium[mujoco]'"
        ) from e
    except TypeError as e:
        raise ConfigError(f"invalid config: env.kwargs={cfg.kwargs!r} rejected by {cfg.id!r}: {e}") from e
    env = _unmask_dict(env, cfg.id)
    if not isinstance(env.action_space, (gym.spaces.Discrete, gym.spaces.Box)):
        raise ConfigError(
            f"invalid config: env.id={cfg.id!r} has action space {env.action_space}; allowed: Discrete or Box"
        )
    if not isinstance(env.observation_space, gym.spaces.Box):
        raise ConfigError(
            f"invalid config: env.id={cfg.id!r} has observation space {env.observation_space}; allowed: Box"
        )
    return env


@dataclass(frozen=True)
class EnvSpec:
    """What actors and the learner need to agree on about an env (no live objects)."""

    obs_shape: Tuple[int, ...]
    discrete: bool
    n_actions: int  # Discrete: number of actions; Box: action dimension
    action_low: Optional[np.ndarray] = None
    action_high: Optional[np.ndarray] = None
    masked: bool = False  # Discrete only: the env says which actions are legal (``info["action_mask"]``)

    @staticmethod
    def of(env: gym.Env, info: Optional[Dict[str, Any]] = None, use_mask: bool = True) -> "EnvSpec":
        """The spec of ``env``; ``info``: what its reset returned (whether it provides action masks; without it the
        spec is unmasked). ``use_mask`` False: the masks are ignored (env.action_mask=false)."""
        space = env.action_space
        if isinstance(space, gym.spaces.Discrete):
            masked = bool(use_mask and info is not None and MASK_KEY in info)
            return EnvSpec(tuple(env.observation_space.shape), True, int(space.n), masked=masked)
        if use_mask and info is not None and MASK_KEY in info:
            raise ConfigError(f"invalid config: env {env.spec.id if env.spec else env!r} names legal actions "
                              f"(info[{MASK_KEY!r}]) but its actions are continuous ({space}); action masks need "
                              "discrete actions: set env.action_mask=false to ignore them")
        return EnvSpec(
            tuple(env.observation_space.shape),
            False,
            int(np.prod(space.shape)),
            np.asarray(space.low, dtype=np.float32),
            np.asarray(space.high, dtype=np.float32),
        )

    @property
    def action_shape(self) -> Tuple[int, ...]:
        return () if self.discrete else (self.n_actions,)


@dataclass
class StepResult:
    next_obs: np.ndarray  # [E, *obs]: after autoreset, the first obs of the new episode
    rewards: np.ndarray  # [E] float64, raw env rewards
    terminated: np.ndarray  # [E] bool
    truncated: np.ndarray  # [E] bool (and not terminated)
    final_obs: Dict[int, np.ndarray]  # env index -> last obs of an episode that ended this step
    masks: Optional[np.ndarray] = None  # [E, n_actions] bool: the legal actions at next_obs (masked envs)


def _sometimes(env_id: str) -> str:
    return (f"env {env_id!r} named its legal actions (info[{MASK_KEY!r}]) on a step or reset but not at its first "
            "reset: a masked env must name them after every reset and step (or set env.action_mask=false)")


def action_mask(info: Dict[str, Any], n: int, env_id: str) -> np.ndarray:
    """The legal actions an env's ``info`` names, as bool [n]; a ConfigError when a masked env stops providing
    them or provides the wrong shape (a mask that allows nothing is passed on: admission refuses its fragment)."""
    if MASK_KEY not in info:
        raise ConfigError(f"env {env_id!r} named its legal actions (info[{MASK_KEY!r}]) at its first reset but not "
                          "on a later reset or step: a masked env must name them after every reset and step (or set "
                          "env.action_mask=false)")
    m = np.asarray(info[MASK_KEY])
    if m.shape != (n,):
        raise ConfigError(f"env {env_id!r}: info[{MASK_KEY!r}] has shape {m.shape}; allowed: ({n},), one entry per "
                          "action")
    m = m.astype(bool)
    if not m.any():
        raise ConfigError(f"env {env_id!r}: info[{MASK_KEY!r}] allows no action (every entry false): a masked env "
                          "must leave at least one action legal")
    return m


class EnvGroup:
    """E environments stepped together; an episode that ends is reset in the same step (its final
    observation is returned separately, so truncation can be bootstrapped)."""

    def __init__(self, cfg: EnvConfig, n: int, seed: int, actor_id: Optional[int] = None):
        self.envs: List[gym.Env] = [make_env(cfg, actor_id) for _ in range(n)]
        self.spec = EnvSpec.of(self.envs[0])  # masked or not is known after the first reset
        self.n = n
        self._seed = seed
        self._id = cfg.id
        self._use_mask = cfg.action_mask
        self.masks: Optional[np.ndarray] = None  # [n, n_actions] legal actions at the current obs (masked envs)

    def tag(self, first_instance: int) -> None:
        """Tell tagged envs which env instance they are (other envs ignore it)."""
        for i, env in enumerate(self.envs):
            if hasattr(env.unwrapped, "set_instance"):
                env.unwrapped.set_instance(first_instance + i)

    def reset(self) -> np.ndarray:
        """Reset every env (seeded); sets ``spec`` (masked or not: the first env's reset info says) and ``masks``."""
        out = [env.reset(seed=self._seed + i) for i, env in enumerate(self.envs)]
        for i, env in enumerate(self.envs):
            env.action_space.seed(self._seed + i)
        self.spec = EnvSpec.of(self.envs[0], out[0][1], self._use_mask)
        if self._use_mask and not self.spec.masked and any(MASK_KEY in info for _, info in out):
            raise ConfigError(_sometimes(self._id))
        if self.spec.masked:
            self.masks = np.stack([action_mask(info, self.spec.n_actions, self._id) for _, info in out])
        return np.stack([o for o, _ in out]).astype(np.float32)

    def step(self, actions: np.ndarray, which: Optional[np.ndarray] = None) -> StepResult:
        """Step every env (or the envs ``which``, in that order) with one action each; results are in the
        order of the envs stepped, and ``final_obs`` is keyed by that position."""
        envs = self.envs if which is None else [self.envs[int(i)] for i in which]
        n = len(envs)
        next_obs = [None] * n
        rewards = np.empty(n, dtype=np.float64)
        term = np.zeros(n, dtype=bool)
        trunc = np.zeros(n, dtype=bool)
        final: Dict[int, np.ndarray] = {}
        masked = self.spec.masked
        masks = np.empty((n, self.spec.n_actions), bool) if masked else None
        for i, env in enumerate(envs):
            o, r, te, tr, info = env.step(actions[i])
            rewards[i] = r
            if te or tr:
                term[i] = bool(te)
                trunc[i] = bool(tr) and not te
                final[i] = np.asarray(o, dtype=np.float32)
                o, info = env.reset()
            next_obs[i] = o
            if masked:
                masks[i] = action_mask(info, self.spec.n_actions, self._id)
            elif self._use_mask and self.spec.discrete and MASK_KEY in info:
                raise ConfigError(_sometimes(self._id))
        if masked:
            if which is None:
                self.masks = masks
            else:
                self.masks[np.asarray(which, dtype=np.int64)] = masks
        return StepResult(np.array(next_obs, dtype=np.float32), rewards, term, trunc, final, masks)

    def close(self) -> None:
        for env in self.envs:
            env.close()


class RunningMeanStd:
    """Running mean/variance over a stream of batches (parallel-variance update, Chan et al.)."""

    def __init__(self, shape: Tuple[int, ...] = (), epsilon: float = 1e-4):
        self.mean = np.zeros(shape, dtype=np.float64)
        self.var = np.ones(shape, dtype=np.float64)
        self.count = float(epsilon)

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.float64)
        b_mean, b_var, b_count = x.mean(axis=0), x.var(axis=0), x.shape[0]
        delta = b_mean - self.mean
        total = self.count + b_count
        self.mean = self.mean + delta * b_count / total
        m2 = self.var * self.count + b_var * b_count + delta**2 * self.count * b_count / total
        self.var = m2 / total
        self.count = total


def normalize(obs: np.ndarray, mean: np.ndarray, var: np.ndarray, clip: float) -> np.ndarray:
    return np.clip((obs - mean) / np.sqrt(var + 1e-8), -clip, clip).astype(np.float32)


def discounted_return(acc: np.ndarray, rewards: np.ndarray, gamma: float) -> np.ndarray:
    """The running discounted return of each env's episode after this step's rewards (as gymnasium's
    NormalizeReward keeps it): ``acc * gamma + r``. The caller resets it to 0 when an episode ends."""
    return acc * gamma + rewards


from . import tagged  # noqa: E402,F401 - registers the tagged-episode env with gymnasium
