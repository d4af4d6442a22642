"""The actors' side of a policy, in numpy only (actor processes never import torch): immutable, versioned
snapshots and the inference that samples actions from them."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Dict, Mapping, Optional

import numpy as np

from .envs import EnvSpec
from .recurrent import Cell, state_shape

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


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
    def make(version: int, model: Any, obs_mean: np.ndarray, obs_var: np.ndarray,
             consumed: Optional[Dict[int, int]] = None, reward_var: float = 1.0) -> "Snapshot":
        weights = {k: _frozen(v.detach().cpu().numpy()) for k, v in model.state_dict().items()}
        return Snapshot(version, MappingProxyType(weights), _frozen(obs_mean), _frozen(obs_var),
                        MappingProxyType(dict(consumed or {})), float(reward_var))

    def load_into(self, model: Any) -> None:
        import torch

        model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in self.weights.items()})


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.array(a, dtype=np.float32)  # always a private copy
    a.setflags(write=False)
    return a


# the hidden layers' activations in numpy (the actors' inference and the learner's numpy step, laglab.npstep)
NP_ACTIVATIONS = {"tanh": np.tanh, "relu": lambda x: np.maximum(x, 0.0), "elu": lambda x: np.where(x > 0, x, np.expm1(x))}


# the widest hidden layer, and the most rows (envs per call), at which the actors run the policy and value MLPs as
# one network (InferencePolicy._fuse): past either, its zero blocks cost more than the calls it saves
# (benchmarks/inference.py: 0.83-0.86x the two networks' time at 64 wide and 8 rows, 0.96-1.01x at 32, 1.1-1.3x from 64)
FUSE_MAX_WIDTH = 64
FUSE_MAX_ROWS = 32


class InferencePolicy:
    """The actor's view of a snapshot: the same network as :class:`ActorCritic` (or, with ``recurrent`` gru | lstm,
    :class:`RecurrentActorCritic`), evaluated in numpy.

    Actors run many tiny batches; a numpy forward pass costs a fraction of torch's per-op overhead and
    holds the GIL for microseconds, which matters when several actor threads share one interpreter.
    Tested against the torch networks for equal log-probs, values and states.

    A recurrent policy takes each env's state before the step (``state`` [B, *S], zero at an episode's start) and
    returns the state after it (before any reset: the caller zeroes the rows whose episode ended)."""

    def __init__(self, snap: Snapshot, spec: EnvSpec, activation: str = "tanh", recurrent: str = "none"):
        self.version = snap.version
        self.spec = spec
        self.act_fn = NP_ACTIVATIONS[activation]
        self.recurrent = None if recurrent in (None, "none") else recurrent
        if self.recurrent is None:
            pi, v = self._layers(snap.weights, "pi."), self._layers(snap.weights, "v.")
            self.n_out = spec.n_actions
            # one network for both heads where it is cheaper: an actor's batches are a few rows, so each numpy
            # call's overhead, not its arithmetic, is the cost -- up to the width where the block-diagonal
            # layers' extra zeros cost more than the calls they save
            # (and only with finite weights: a zero block times an inf is a NaN, which would reach the other head)
            narrow = max((w.shape[1] for w, _ in pi[:-1]), default=0) <= FUSE_MAX_WIDTH
            finite = all(np.isfinite(w).all() and np.isfinite(b).all() for w, b in pi + v)
            self.fused = self._fuse(pi, v) if narrow and finite else None
            self.pi, self.v = pi, v
        else:
            self.enc = self._layers(snap.weights, "enc.")
            self.cell = Cell(self.recurrent, {k: snap.weights[f"core.{k}_l0"]  # (torch.nn.GRU / LSTM, one layer)
                                              for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")})
            # both linear heads as one product: the policy head's columns, then the value's
            self.n_out = snap.weights["pi_head.weight"].shape[0]
            self.heads = (np.ascontiguousarray(np.concatenate([snap.weights["pi_head.weight"],
                                                               snap.weights["v_head.weight"]]).T, dtype=np.float32),
                          np.concatenate([snap.weights["pi_head.bias"], snap.weights["v_head.bias"]]).astype(np.float32))
        self.log_std = None
        if not spec.discrete:
            self.log_std = np.clip(snap.weights["log_std"], LOG_STD_MIN, LOG_STD_MAX).astype(np.float32)

    @property
    def state_shape(self) -> Optional[tuple]:
        return None if self.recurrent is None else state_shape(self.recurrent, self.cell.hidden)

    @staticmethod
    def _layers(weights: Mapping[str, np.ndarray], prefix: str):
        idx = sorted({int(k[len(prefix):].split(".")[0]) for k in weights if k.startswith(prefix)})
        return [(np.ascontiguousarray(weights[f"{prefix}{i}.weight"].T), weights[f"{prefix}{i}.bias"]) for i in idx]

    @staticmethod
    def _fuse(pi, v):
        """The policy and value MLPs (same hidden sizes) as one: the first layers side by side ([in, h + h]), each
        later layer block-diagonal, so one product per layer serves both heads. The output's first columns are the
        policy head's, its last the value. Equal to the two networks to float32 rounding (the zero blocks add
        exact zeros -- for finite hidden values: an inf in one head's layer would make the other's output NaN;
        the sums' order may differ)."""
        out = []
        for k, ((wp, bp), (wv, bv)) in enumerate(zip(pi, v, strict=True)):
            if k == 0:
                w = np.concatenate([wp, wv], axis=1)
            else:
                w = np.zeros((wp.shape[0] + wv.shape[0], wp.shape[1] + wv.shape[1]), dtype=np.float32)
                w[:wp.shape[0], :wp.shape[1]] = wp
                w[wp.shape[0]:, wp.shape[1]:] = wv
            out.append((np.ascontiguousarray(w, dtype=np.float32), np.concatenate([bp, bv]).astype(np.float32)))
        return out

    def _mlp(self, layers, x: np.ndarray) -> np.ndarray:
        for w, b in layers[:-1]:
            x = self.act_fn(x @ w + b)
        w, b = layers[-1]
        return x @ w + b

    def _heads(self, obs: np.ndarray, state: Optional[np.ndarray]):
        """(policy head output, value, next state or None)."""
        x = obs.reshape(obs.shape[0], -1)
        if self.recurrent is None:
            if self.fused is None or x.shape[0] > FUSE_MAX_ROWS:
                return self._mlp(self.pi, x), self._mlp(self.v, x)[:, 0], None
            out = self._mlp(self.fused, x)
            return out[:, :self.n_out], out[:, self.n_out], None
        if state is None:
            raise ValueError("a recurrent policy needs the state of every env (zero at an episode's start)")
        for w, b in self.enc:
            x = self.act_fn(x @ w + b)
        nxt = self.cell.step(x, state)
        h = Cell.output(self.recurrent, nxt)
        w, b = self.heads
        out = h @ w + b
        return out[:, :self.n_out], out[:, self.n_out], nxt

    def value(self, obs: np.ndarray, state: Optional[np.ndarray] = None) -> np.ndarray:
        return self._heads(obs, state)[1]

    def act(self, obs: np.ndarray, rng: np.random.Generator, mask: Optional[np.ndarray] = None,
            state: Optional[np.ndarray] = None):
        """Sample actions (``mask`` [B, n] bool: only the legal actions, renormalized). Returns (actions, logp,
        value, mean or None, log_std or None, next state or None)."""
        out, value, nxt = self._heads(obs, state)
        B = out.shape[0]
        if self.spec.discrete:
            if mask is not None:
                out = np.where(mask, out, -np.inf)
            z = out - out.max(axis=1, keepdims=True)
            logp_all = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
            cdf = np.exp(logp_all).cumsum(axis=1)
            r = rng.random((B, 1), dtype=np.float32)
            if mask is not None:  # u in (0, total]: u = 0 would pick action 0 even where its mask forbids it
                r = 1.0 - r
            u = r * cdf[:, -1:]
            a = np.minimum((cdf < u).sum(axis=1), self.spec.n_actions - 1)
            return a.astype(np.int64), logp_all[np.arange(B), a], value, None, None, nxt
        log_std = np.broadcast_to(self.log_std, out.shape)
        a = (out + rng.standard_normal(out.shape, dtype=np.float32) * np.exp(log_std)).astype(np.float32)
        z = (a - out) * np.exp(-log_std)
        logp = (-0.5 * z * z - log_std - HALF_LOG_2PI).sum(axis=1)
        return a, logp.astype(np.float32), value, out, log_std, nxt

    def mode(self, obs: np.ndarray, mask: Optional[np.ndarray] = None, state: Optional[np.ndarray] = None):
        """(the deterministic action, next state or None): the most probable action (argmax of the logits, or the
        Gaussian's mean; under ``mask``, the most probable legal one)."""
        out, _, nxt = self._heads(obs, state)
        if self.spec.discrete:
            if mask is not None:
                out = np.where(mask, out, -np.inf)
            return out.argmax(axis=1).astype(np.int64), nxt
        return out.astype(np.float32), nxt


class SnapshotCodec:
    """A snapshot as one flat float32 vector (weights in a fixed key order, then the observation statistics
    and the reward variance), for the shared-memory snapshot buffer of the process runner."""

    def __init__(self, shapes: Mapping[str, tuple], obs_shape: tuple):
        self.items = [(k, tuple(s)) for k, s in shapes.items()]
        self.obs_shape = tuple(obs_shape)
        n_obs = int(np.prod(self.obs_shape, dtype=np.int64))
        self.size = sum(int(np.prod(s, dtype=np.int64)) for _, s in self.items) + 2 * n_obs + 1

    def encode(self, snap: "Snapshot") -> np.ndarray:
        parts = [np.asarray(snap.weights[k], np.float32).ravel() for k, _ in self.items]
        parts += [np.asarray(snap.obs_mean, np.float32).ravel(), np.asarray(snap.obs_var, np.float32).ravel(),
                  np.array([snap.reward_var], np.float32)]
        return np.concatenate(parts)

    def decode(self, version: int, flat: np.ndarray) -> "Snapshot":
        out, off = {}, 0
        for k, s in self.items:
            n = int(np.prod(s, dtype=np.int64))
            out[k] = _frozen(flat[off:off + n].reshape(s))
            off += n
        n_obs = int(np.prod(self.obs_shape, dtype=np.int64))
        mean = flat[off:off + n_obs].reshape(self.obs_shape)
        var = flat[off + n_obs:off + 2 * n_obs].reshape(self.obs_shape)
        return Snapshot(version, MappingProxyType(out), _frozen(mean), _frozen(var), MappingProxyType({}),
                        float(flat[off + 2 * n_obs]))
