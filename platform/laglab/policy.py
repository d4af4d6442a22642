"""Actor-critic networks (categorical or Gaussian head); their snapshots and numpy inference are in
:mod:`laglab.inference`."""
from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor, nn

from .algo import LOG_STD_MAX, LOG_STD_MIN, categorical_logp_entropy, gaussian_entropy, gaussian_logp
from .envs import EnvSpec
from .inference import InferencePolicy, Snapshot  # noqa: F401 - the actors' side lives in laglab.inference

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

    def logp_entropy(self, obs: Tensor, actions: Tensor, mask: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """``mask`` [B, n] bool (masked envs): log-probs and entropy of the distribution over the legal actions."""
        out = self.pi(obs.flatten(1))
        if self.discrete:
            return categorical_logp_entropy(out, actions, mask)
        log_std = self.clamped_log_std().expand_as(out)
        return gaussian_logp(actions, out, log_std), gaussian_entropy(log_std)


