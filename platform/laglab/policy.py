"""Actor-critic networks (categorical or Gaussian head): MLPs, or an encoder and a recurrent core (GRU | LSTM)
shared by both heads; their snapshots and numpy inference are in :mod:`laglab.inference`."""
from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor, nn

from .recurrent import state_shape
from .algo import LOG_STD_MAX, LOG_STD_MIN, categorical_logp_entropy, gaussian_entropy, gaussian_logp
from .envs import EnvSpec
from .inference import InferencePolicy, Snapshot  # noqa: F401 - the actors' side lives in laglab.inference



class _HostTanh(torch.autograd.Function):
    """tanh of a CPU tensor computed by numpy into a tensor torch allocates; the gradient is torch's own
    ``tanh_backward``. Why: this torch build's CPU tanh is scalar code — 290 us for a [2048, 64] batch where numpy's
    takes 28 (at [64, 64] 10 vs 5 us; with the backward, 423 vs 81 us and 38 vs 36 us) — and the actors' numpy
    inference uses the same numpy tanh."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        y = torch.empty_like(x)
        np.tanh(x.detach().numpy(), out=y.numpy())
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)


class Tanh(nn.Module):
    """``nn.Tanh``; with ``host``, by numpy on the CPU (see :class:`_HostTanh`). Chosen once per model, not per
    tensor, so a row's activations do not depend on the size of the batch it is computed in: the learner's
    full-batch pass and its minibatches agree bit for bit (:func:`laglab.learner.build_model` turns ``host`` on
    where a minibatch is large enough to gain: below ~8192 values per layer the Python function's own cost
    outweighs it, HalfCheetah's [64, 64] minibatches ran 5% slower)."""

    HOST_MIN = 8192

    def __init__(self, host: bool = False):
        super().__init__()
        self.host = bool(host)

    def forward(self, x: Tensor) -> Tensor:
        if self.host and x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64):
            return _HostTanh.apply(x)
        return torch.tanh(x)


def _act(activation: str, host_tanh: bool) -> nn.Module:
    return Tanh(host_tanh) if activation == "tanh" else {"relu": nn.ReLU, "elu": nn.ELU}[activation]()


def _mlp(sizes: Sequence[int], activation: str, out_gain: float, host_tanh: bool = False) -> nn.Sequential:
    layers = []
    for i in range(len(sizes) - 1):
        lin = nn.Linear(sizes[i], sizes[i + 1])
        last = i == len(sizes) - 2
        nn.init.orthogonal_(lin.weight, out_gain if last else math.sqrt(2.0))
        nn.init.zeros_(lin.bias)
        layers.append(lin)
        if not last:
            layers.append(_act(activation, host_tanh))
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    """Separate policy and value MLPs. Discrete: logits. Continuous: mean + state-independent log_std,
    clamped to [LOG_STD_MIN, LOG_STD_MAX] wherever it is used."""

    def __init__(self, spec: EnvSpec, hidden_sizes: Sequence[int] = (64, 64), activation: str = "tanh",
                 log_std_init: float = 0.0, host_tanh: bool = False):
        super().__init__()
        self.spec = spec
        obs_dim = int(np.prod(spec.obs_shape))
        hidden = list(hidden_sizes)
        self.pi = _mlp([obs_dim] + hidden + [spec.n_actions], activation, 0.01, host_tanh)
        self.v = _mlp([obs_dim] + hidden + [1], activation, 1.0, host_tanh)
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




def pieces(dones: np.ndarray, start: np.ndarray):
    """How :meth:`RecurrentActorCritic.outputs` lays ``N`` sequences of ``T`` steps out as pieces for one call of the
    fused kernel. ``dones`` [T, N] bool (an episode ended at step t), ``start`` [N] the step each sequence starts at.
    A piece ends at an episode end (at or after its sequence's start) or at the last step, and begins at the
    sequence's start or one step after the previous piece's end. Returns (cols [S]: each piece's sequence, first [S]
    bool: the piece begins its sequence — it starts from the sequence's state, the others from zero —, pos [L, S]:
    the flat position ``t * N + n`` in [T * N] of each of its steps, ``T * N`` past its end (padding), valid [L, S])."""
    T, N = dones.shape
    end = dones.copy()
    end[T - 1] = True
    end[np.arange(T).reshape(-1, 1) < start.reshape(1, -1)] = False
    cols, ends = np.nonzero(end.T)
    first = np.ones(len(cols), dtype=bool)
    first[1:] = cols[1:] != cols[:-1]
    a0 = np.where(first, start[cols], np.concatenate([[0], ends[:-1] + 1]))
    lens = ends + 1 - a0
    step = np.arange(int(lens.max())).reshape(-1, 1)
    valid = step < lens.reshape(1, -1)
    pos = np.where(valid, (a0.reshape(1, -1) + step) * N + cols.reshape(1, -1), T * N)
    return cols, first, pos, valid


class RecurrentActorCritic(nn.Module):
    """An encoder MLP (``hidden_sizes``, each layer followed by the activation), a one-layer GRU or LSTM of ``hidden``
    units, then a linear policy head and a linear value head on its output h (shared core, as Sample Factory's and
    CleanRL's recurrent PPO). Weights: orthogonal, zero biases (the core's too, as CleanRL's LSTM agent); the heads'
    gains as the MLP's last layers (0.01 policy, 1 value).

    A state is ``[N, H]`` (GRU) or ``[N, 2, H]`` (LSTM: h then c), zero at an episode's start; the actors' numpy step
    (:mod:`laglab.recurrent`) reads the core's weights in torch's layout. Sequences are run by torch's fused
    multi-step kernel (``nn.GRU`` / ``nn.LSTM``), in pieces between episode ends."""

    def __init__(self, spec: EnvSpec, hidden_sizes: Sequence[int] = (64,), activation: str = "tanh",
                 log_std_init: float = 0.0, kind: str = "gru", hidden: int = 64, host_tanh: bool = False):
        super().__init__()
        self.spec = spec
        self.kind = kind
        self.hidden = int(hidden)
        self.state_shape = state_shape(kind, self.hidden)
        sizes = [int(np.prod(spec.obs_shape))] + list(hidden_sizes)
        layers = []
        for i in range(len(sizes) - 1):
            lin = nn.Linear(sizes[i], sizes[i + 1])
            nn.init.orthogonal_(lin.weight, math.sqrt(2.0))
            nn.init.zeros_(lin.bias)
            layers += [lin, _act(activation, host_tanh)]
        self.enc = nn.Sequential(*layers)
        self.core = (nn.GRU if kind == "gru" else nn.LSTM)(sizes[-1], self.hidden)
        for name, w in self.core.named_parameters():
            nn.init.zeros_(w) if "bias" in name else nn.init.orthogonal_(w, 1.0)
        self.pi_head = nn.Linear(self.hidden, spec.n_actions)
        self.v_head = nn.Linear(self.hidden, 1)
        for head, gain in ((self.pi_head, 0.01), (self.v_head, 1.0)):
            nn.init.orthogonal_(head.weight, gain)
            nn.init.zeros_(head.bias)
        self.discrete = spec.discrete
        if not spec.discrete:
            self.log_std = nn.Parameter(torch.full((spec.n_actions,), float(log_std_init)))

    def zero_state(self, n: int) -> Tensor:
        return self.v_head.weight.new_zeros((n,) + self.state_shape)

    def _hx(self, state: Tensor):
        return state[None] if self.kind == "gru" else (state[:, 0][None].contiguous(), state[:, 1][None].contiguous())

    def _state(self, hx) -> Tensor:
        return hx[0] if self.kind == "gru" else torch.stack([hx[0][0], hx[1][0]], dim=1)

    def step(self, obs: Tensor, state: Tensor) -> Tensor:
        """The next state from one step's observations ``obs`` [N, *obs] and ``state``."""
        _, hx = self.core(self.enc(obs.flatten(1))[None], self._hx(state))
        return self._state(hx)

    def output(self, state: Tensor) -> Tensor:
        """What the heads read: h (of a GRU state [..., H] or an LSTM state [..., 2, H])."""
        return state if self.kind == "gru" else state.select(-2, 0)

    def unroll(self, obs: Tensor, state: Tensor, dones: Tensor) -> Tuple[Tensor, Tensor]:
        """Run ``T`` steps of ``N`` sequences: ``obs`` [T, N, *obs], ``state`` [N, *S] the state before the first step,
        ``dones`` [T, N] bool (an episode ended at step t: the state is zero before step t + 1).

        Returns (h [T, N, H]: what the heads read at each step, ends [T, N, *S]: the state after step t, before any
        reset, at every step that ends an episode and at the last step; zero elsewhere)."""
        T, N = obs.shape[0], obs.shape[1]
        x = self.enc(obs.reshape((T * N, -1))).view(T, N, -1)
        ends = x.new_zeros((T, N) + self.state_shape)
        # run the steps between two episode ends (of any sequence) as one call of the fused kernel, then zero the
        # states of the sequences whose episode ended: a few calls once episodes are long, T at worst
        cuts = np.flatnonzero(dones[:-1].any(dim=1).cpu().numpy()) + 1
        hs, s, a = [], state, 0
        for b in list(cuts) + [T]:
            out, hx = self.core(x[a:b], self._hx(s))
            hs.append(out)
            s = self._state(hx)
            done = dones[b - 1]
            if b < T:
                ends[b - 1] = s * done.view((N,) + (1,) * len(self.state_shape))
                s = s * (~done).to(s.dtype).view((N,) + (1,) * len(self.state_shape))
            a = b
        ends[-1] = self._state(hx)
        return torch.cat(hs), ends

    def outputs(self, obs: Tensor, state: Tensor, dones: Tensor, cut_at: int = 0,
                cut: Optional[Tensor] = None) -> Tensor:
        """h [T, N, H] as :meth:`unroll` (with gradients), in one call of the fused kernel: every sequence is split at
        its own episode ends and each piece runs as its own column (from the sequence's state, or from zero after an
        episode end), padded at its end (the kernel is causal: padding never reaches a piece's steps). ``cut`` [N]
        bool: these sequences start at step ``cut_at`` from their state there, computed without gradients (burn-in;
        their h before ``cut_at`` is zero: those steps are left out of the loss; a cut sequence has no episode end
        before ``cut_at``)."""
        T, N = obs.shape[0], obs.shape[1]
        x = self.enc(obs.reshape((T * N, -1)))
        init = state
        start = np.zeros(N, dtype=np.int64)
        if cut is not None and 0 < cut_at < T and bool(cut.any()):
            c = torch.from_numpy(np.flatnonzero(cut.cpu().numpy())).to(x.device)
            with torch.no_grad():
                _, hx = self.core(x.view(T, N, -1)[:cut_at, c], self._hx(state[c]))
            init = state.clone()
            init[c] = self._state(hx)
            start[c.cpu().numpy()] = cut_at
        cols, first, pos, valid = (torch.from_numpy(v).to(x.device) for v in pieces(dones.cpu().numpy(), start))
        L, S = pos.shape
        xs = torch.cat([x, x.new_zeros((1, x.shape[1]))])[pos.reshape(-1)].view(L, S, -1)
        h0 = init[cols] * first.to(x.dtype).view((S,) + (1,) * len(self.state_shape))
        out, _ = self.core(xs, self._hx(h0))
        return x.new_zeros((T * N, self.hidden)).index_put((pos[valid],), out[valid]).view(T, N, -1)

    def clamped_log_std(self) -> Tensor:
        return torch.clamp(self.log_std, LOG_STD_MIN, LOG_STD_MAX)

    def value_of(self, h: Tensor) -> Tensor:
        """Values from the core's outputs h [..., H] -> [...]."""
        return self.v_head(h).squeeze(-1)

    def logp_entropy_of(self, h: Tensor, actions: Tensor, mask: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """Log-probs and entropies of ``actions`` [B, *action] under the heads at the core's outputs ``h`` [B, H]."""
        out = self.pi_head(h)
        if self.discrete:
            return categorical_logp_entropy(out, actions, mask)
        log_std = self.clamped_log_std().expand_as(out)
        return gaussian_logp(actions, out, log_std), gaussian_entropy(log_std)
