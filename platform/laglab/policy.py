"""Actor-critic networks (categorical or Gaussian head) and immutable, versioned policy snapshots."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Dict, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor, nn

from .algo import (HALF_LOG_2PI, LOG_STD_MAX, LOG_STD_MIN, categorical_logp_entropy, gaussian_entropy,
                   gaussian_logp)
from .envs import EnvSpec

_ACT = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU}


def _mlp(sizes: Sequence[int], activation: str, out_gain: float) -> nn.Sequential:
    layers = []
    for i in range(len(sizes) - 1):
        lin = nn.Linear(sizes[i], sizes[i + 1])
        last = i == len(sizes) - 2
        nn.init.orthogonal_(lin.weight, out_gain if last else math.sqrt(2.0))
        nn.init.zeros_(lin.bias)
        layers.append(lin)
        if not last:
            layers.append(_ACT[activation]())
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    """Separate policy and value MLPs. Discrete: logits. Continuous: mean + state-independent log_std,
    clamped to [LOG_STD_MIN, LOG_STD_MAX] wherever it is used."""

    def __init__(self, spec: EnvSpec, hidden_sizes: Sequence[int] = (64, 64), activation: str = "tanh",
                 log_std_init: float = 0.0):
        super().__init__()
        self.spec = spec
        obs_dim = int(np.prod(spec.obs_shape))
        hidden = list(hidden_sizes)
        self.pi = _mlp([obs_dim] + hidden + [spec.n_actions], activation, 0.01)
        self.v = _mlp([obs_dim] + hidden + [1], activation, 1.0)
        self.discrete = spec.discrete
        if not spec.discrete:
            self.log_std = nn.Parameter(torch.full((spec.n_actions,), float(log_std_init)))

    def value(self, obs: Tensor) -> Tensor:
        return self.v(obs.flatten(1)).squeeze(-1)

    def clamped_log_std(self) -> Tensor:
        return torch.clamp(self.log_std, LOG_STD_MIN, LOG_STD_MAX)

    def logp_entropy(self, obs: Tensor, actions: Tensor) -> Tuple[Tensor, Tensor]:
        out = self.pi(obs.flatten(1))
        if self.discrete:
            return categorical_logp_entropy(out, actions)
        log_std = self.clamped_log_std().expand_as(out)
        return gaussian_logp(actions, out, log_std), gaussian_entropy(log_std)


@dataclass(frozen=True)
class Snapshot:
    """An immutable, versioned policy: weights (read-only numpy arrays, keyed as the model's state dict)
    plus the observation-normalizer statistics. Published atomically (one object swap), so an actor never
    runs a mix of two versions. Plain arrays: the same record can cross a process or host boundary.

    ``consumed`` maps actor incarnation -> env steps of its data the learner had taken when the
    snapshot was made (the actors' throttle reads it). ``reward_var`` is the variance of the discounted
    return the learner scales rewards by (reward normalization is the learner's; shipped for evaluation)."""

    version: int
    weights: Mapping[str, np.ndarray]
    obs_mean: np.ndarray
    obs_var: np.ndarray
    consumed: Mapping[int, int] = field(default_factory=dict)
    reward_var: float = 1.0

    @staticmethod
    def make(version: int, model: nn.Module, obs_mean: np.ndarray, obs_var: np.ndarray,
             consumed: Optional[Dict[int, int]] = None, reward_var: float = 1.0) -> "Snapshot":
        weights = {k: _frozen(v.detach().cpu().numpy()) for k, v in model.state_dict().items()}
        return Snapshot(version, MappingProxyType(weights), _frozen(obs_mean), _frozen(obs_var),
                        MappingProxyType(dict(consumed or {})), float(reward_var))

    def load_into(self, model: nn.Module) -> None:
        model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in self.weights.items()})


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.array(a, dtype=np.float32)  # always a private copy
    a.setflags(write=False)
    return a


_NP_ACT = {"tanh": np.tanh, "relu": lambda x: np.maximum(x, 0.0), "elu": lambda x: np.where(x > 0, x, np.expm1(x))}


class InferencePolicy:
    """The actor's view of a snapshot: the same network as :class:`ActorCritic`, evaluated in numpy.

    Actors run many tiny batches; a numpy forward pass costs a fraction of torch's per-op overhead and
    holds the GIL for microseconds, which matters when several actor threads share one interpreter.
    Tested against :class:`ActorCritic` for equal log-probs and values."""

    def __init__(self, snap: Snapshot, spec: EnvSpec, activation: str = "tanh"):
        self.version = snap.version
        self.spec = spec
        self.act_fn = _NP_ACT[activation]
        self.pi = self._layers(snap.weights, "pi.")
        self.v = self._layers(snap.weights, "v.")
        self.log_std = None
        if not spec.discrete:
            self.log_std = np.clip(snap.weights["log_std"], LOG_STD_MIN, LOG_STD_MAX).astype(np.float32)

    @staticmethod
    def _layers(weights: Mapping[str, np.ndarray], prefix: str):
        idx = sorted({int(k[len(prefix):].split(".")[0]) for k in weights if k.startswith(prefix)})
        return [(np.ascontiguousarray(weights[f"{prefix}{i}.weight"].T), weights[f"{prefix}{i}.bias"]) for i in idx]

    def _mlp(self, layers, x: np.ndarray) -> np.ndarray:
        for w, b in layers[:-1]:
            x = self.act_fn(x @ w + b)
        w, b = layers[-1]
        return x @ w + b

    def value(self, obs: np.ndarray) -> np.ndarray:
        return self._mlp(self.v, obs.reshape(obs.shape[0], -1))[:, 0]

    def act(self, obs: np.ndarray, rng: np.random.Generator):
        """Sample actions. Returns (actions, logp, value, mean or None, log_std or None)."""
        x = obs.reshape(obs.shape[0], -1)
        out = self._mlp(self.pi, x)
        value = self._mlp(self.v, x)[:, 0]
        if self.spec.discrete:
            z = out - out.max(axis=1, keepdims=True)
            logp_all = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
            cdf = np.exp(logp_all).cumsum(axis=1)
            u = rng.random((x.shape[0], 1), dtype=np.float32) * cdf[:, -1:]
            a = np.minimum((cdf < u).sum(axis=1), self.spec.n_actions - 1)
            return a.astype(np.int64), logp_all[np.arange(x.shape[0]), a], value, None, None
        log_std = np.broadcast_to(self.log_std, out.shape)
        a = (out + rng.standard_normal(out.shape, dtype=np.float32) * np.exp(log_std)).astype(np.float32)
        z = (a - out) * np.exp(-log_std)
        logp = (-0.5 * z * z - log_std - HALF_LOG_2PI).sum(axis=1)
        return a, logp.astype(np.float32), value, out, log_std
