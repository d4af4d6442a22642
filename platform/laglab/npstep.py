"""The feed-forward learner's minibatch step in numpy: forward, loss, hand-derived gradients, global-norm
clipping and Adam, on flat copies of the model's parameters and the optimizer's state.

Why: at the presets' sizes (a 64 x 64 MLP, minibatches of 64-256 rows) the torch step is dispatch and autograd
bookkeeping, not arithmetic — ~140 ops of a few microseconds each and an autograd graph per minibatch. The same
step as ~60 numpy calls on the same float32 data is ~3x cheaper (``benchmarks/learner_device.py --backends``), and
the learner is what bounds an asynchronous run on two cores. It computes what :meth:`Learner.update`'s torch
step computes — the same losses (:mod:`laglab.algo`), torch's tie rules for ``minimum``/``maximum``/``clamp``,
``clip_grad_norm`` and ``torch.optim.Adam`` — to float32 rounding (``tests/test_npstep.py`` checks it against
autograd, loss by loss).

Gradients, per minibatch of n rows (L = policy loss - ent_coef * mean(entropy) + vf_coef * 0.5 mean((v - R)^2)):

- clipped objective ``o = min(r A, clip(r, 1-e, 1+e) A)``, ``r = exp(logp - ref)``:
  ``do/dlogp = r A (g_u + g_c [1-e <= r <= 1+e])``, ``g_u, g_c`` = 1/0 for the smaller term, 1/2 each on a tie;
  dual clip ``max(o, cA)`` for A < 0 passes it where o > cA (half on a tie); decoupled weighs it by the constant
  ``w = min(exp(prox - behavior), is_cap)``; ``dL/dlogp = -do/dlogp / n``.
- Gaussian head, ``z = (a - mu) exp(-s)``: ``dlogp/dmu = z exp(-s)``, ``dlogp/ds = z^2 - 1``, ``dH/ds = 1``
  (s = log_std clamped to [LOG_STD_MIN, LOG_STD_MAX]: no gradient outside, the bounds included as torch's clamp).
- Categorical head, ``p = softmax(logits)``: ``dlogp/dlogits = onehot(a) - p``, ``dH/dlogits = -p (log p + H)``,
  zero at masked actions.
- MLP layers: ``dW = d^T h``, ``db = sum d``, ``d <- (d W) act'(h)`` with tanh' = 1 - h^2, relu' = [h > 0],
  elu' = 1 where h > 0 else h + 1.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .inference import HALF_LOG_2PI, LOG_STD_MAX, LOG_STD_MIN, NP_ACTIVATIONS

ACTIVATIONS = tuple(NP_ACTIVATIONS)


def _act_grad(name: str, d: np.ndarray, h: np.ndarray) -> None:
    """``d *= act'(z)`` in place, from the activation's output ``h``."""
    if name == "tanh":
        d *= 1.0 - h * h
    elif name == "relu":
        d *= h > 0
    else:
        d *= np.where(h > 0, np.float32(1.0), h + np.float32(1.0))


def _pick_grad(a: np.ndarray, b: np.ndarray, smaller: bool) -> np.ndarray:
    """The share of ``min(a, b)``'s (``max`` when not ``smaller``) gradient that goes to ``a``: 1, 0, or 1/2 on a tie
    (torch's rule)."""
    wins = a < b if smaller else a > b
    one, half, zero = (np.asarray(v, dtype=a.dtype) for v in (1.0, 0.5, 0.0))
    return np.where(wins, one, np.where(a == b, half, zero))


class Layers:
    """One MLP's linear layers as views into a flat buffer: ``[(W [out, in], b [out]), ...]``."""

    def __init__(self, pairs: List[Tuple[np.ndarray, np.ndarray]], activation: str):
        self.pairs = pairs
        self.activation = activation

    def forward(self, x: np.ndarray, keep: bool = True) -> Tuple[List[np.ndarray], np.ndarray]:
        """(the inputs of each layer — x, then each hidden activation — when ``keep``, the output)."""
        hs = [x]
        h = x
        act = NP_ACTIVATIONS[self.activation]
        for W, b in self.pairs[:-1]:
            z = h @ W.T
            z += b
            h = act(z)
            if keep:
                hs.append(h)
        W, b = self.pairs[-1]
        out = h @ W.T
        out += b
        return hs, out

    def backward(self, hs: List[np.ndarray], d: np.ndarray, grads: List[Tuple[np.ndarray, np.ndarray]]) -> None:
        """Write each layer's gradient into ``grads`` (views, as ``pairs``) from ``d`` = dL/d(output)."""
        for k in range(len(self.pairs) - 1, -1, -1):
            h = hs[k]
            gW, gb = grads[k]
            np.matmul(d.T, h, out=gW)
            d.sum(axis=0, out=gb)
            if k:
                d = d @ self.pairs[k][0]
                _act_grad(self.activation, d, h)


class Flat:
    """Flat float32 copies of a list of tensors, each also seen as a view of its tensor's shape."""

    def __init__(self, tensors: Sequence[torch.Tensor]):
        sizes = [t.numel() for t in tensors]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.data = np.zeros(int(self.offsets[-1]), dtype=np.float32)
        self.views = [self.data[a:b].reshape(tuple(t.shape)) for a, b, t in
                      zip(self.offsets[:-1], self.offsets[1:], tensors)]

    def load(self, tensors: Sequence[torch.Tensor]) -> None:
        for v, t in zip(self.views, tensors):
            v[...] = t.detach().cpu().numpy()

    def store(self, tensors: Sequence[torch.Tensor]) -> None:
        with torch.no_grad():
            for v, t in zip(self.views, tensors):
                t.copy_(torch.from_numpy(v))


def supported(model: torch.nn.Module, device: torch.device, activation: str) -> Optional[str]:
    """None when :class:`NumpyStep` can run this model's updates, else why not."""
    from .policy import ActorCritic

    if device.type != "cpu":
        return f"learner.device={device} (numpy runs on the CPU)"
    if type(model) is not ActorCritic:
        return f"a {type(model).__name__} (recurrent policies need torch's recurrent kernels)"
    if activation not in ACTIVATIONS:
        return f"policy.activation={activation}"
    if any(p.dtype != torch.float32 for p in model.parameters()):
        return "parameters that are not float32"
    return None


class NumpyStep:
    """The update's minibatch steps for a feed-forward :class:`~laglab.policy.ActorCritic` and the learner's
    :class:`~laglab.optim.Adam`: :meth:`load` copies the weights and the optimizer's state in, :meth:`step` runs one
    minibatch, :meth:`store` copies them back (so snapshots, checkpoints and the torch paths see one model)."""

    def __init__(self, model: torch.nn.Module, opt, activation: str, prox_model: Optional[torch.nn.Module] = None):
        self.model, self.opt, self.prox_model = model, opt, prox_model
        self.params = list(model.parameters())
        if [id(p) for p in self.params] != [id(p) for p in opt.params]:
            raise ValueError("NumpyStep: the optimizer's parameters are not the model's, in the model's order")
        self.discrete = bool(model.discrete)
        self.P, self.G = Flat(self.params), Flat(self.params)
        self.M, self.V = Flat(self.params), Flat(self.params)
        pos = {id(p): i for i, p in enumerate(self.params)}

        def layers(flat: Flat, seq) -> Layers:
            lins = [m for m in seq if isinstance(m, torch.nn.Linear)]
            return Layers([(flat.views[pos[id(m.weight)]], flat.views[pos[id(m.bias)]]) for m in lins], activation)

        self.pi, self.v = layers(self.P, model.pi), layers(self.P, model.v)
        self.g_pi = layers(self.G, model.pi).pairs
        self.g_v = layers(self.G, model.v).pairs
        self.log_std = None if self.discrete else self.P.views[pos[id(model.log_std)]]
        self.g_log_std = None if self.discrete else self.G.views[pos[id(model.log_std)]]
        self.Q = self.q_pi = None
        if prox_model is not None:  # (a copy of the model: its parameters in the same order, so the same layout)
            self.Q = Flat(self.params)
            self.q_pi = layers(self.Q, model.pi)
            self.q_log_std = None if self.discrete else self.Q.views[pos[id(model.log_std)]]
        self.steps = np.zeros(len(self.params), dtype=np.int64)

    # ---- the model's state in and out ---------------------------------------------------------------
    def load(self) -> None:
        self.P.load(self.params)
        self.M.load(self.opt.exp_avg)
        self.V.load(self.opt.exp_avg_sq)
        self.steps[:] = self.opt.steps
        if self.prox_model is not None:
            self.Q.load(list(self.prox_model.parameters()))

    def store(self) -> None:
        self.P.store(self.params)
        self.M.store(self.opt.exp_avg)
        self.V.store(self.opt.exp_avg_sq)
        for i, s in enumerate(self.steps):
            self.opt.steps[i] = int(s)
            self.opt.step_t[i].fill_(float(s))
        if self.prox_model is not None:
            self.Q.store(list(self.prox_model.parameters()))

    # ---- the policy's distribution ---------------------------------------------------------------------
    def _dist(self, out: np.ndarray, actions: np.ndarray, mask: Optional[np.ndarray], log_std: Optional[np.ndarray]):
        """(logp [n], entropy [n] or a scalar for the Gaussian, what the gradient needs)."""
        if self.discrete:
            logits = out if mask is None else np.where(mask, out, np.finfo(np.float32).min)
            mx = logits.max(axis=-1, keepdims=True)
            sh = logits - mx
            lse = np.log(np.exp(sh).sum(axis=-1, keepdims=True))
            logp_all = sh - lse
            p = np.exp(logp_all)
            terms = p * logp_all
            if mask is not None:
                terms = np.where(mask, terms, 0.0).astype(np.float32)
            ent = -terms.sum(axis=-1)
            logp = np.take_along_axis(logp_all, actions.reshape(-1, 1).astype(np.int64), axis=-1)[:, 0]
            return logp, ent, (p, logp_all)
        s = np.minimum(np.maximum(log_std, np.float32(LOG_STD_MIN)), np.float32(LOG_STD_MAX))
        inv = np.exp(-s)
        z = (actions - out) * inv
        logp = (-0.5 * z * z - s - HALF_LOG_2PI).sum(axis=-1)
        ent = np.float32((s + 0.5 + HALF_LOG_2PI).sum())
        return logp, ent, (z, inv)

    def prox_logp(self, x: np.ndarray, actions: np.ndarray, mask: Optional[np.ndarray]) -> np.ndarray:
        """Log-probs under the EWMA proximal policy (no gradient)."""
        _, out = self.q_pi.forward(x, keep=False)
        return self._dist(out, actions, mask, None if self.discrete else self.q_log_std)[0]

    def ewma(self, keep: float) -> None:
        """prox <- keep * prox + (1 - keep) * theta (as ``torch.lerp``)."""
        self.Q.data += np.float32(1.0 - keep) * (self.P.data - self.Q.data)

    # ---- one minibatch -------------------------------------------------------------------------------
    def step(self, x: np.ndarray, actions: np.ndarray, mask: Optional[np.ndarray], adv: np.ndarray,
             ret: np.ndarray, old: np.ndarray, start: np.ndarray, loss, lr: float, betas: Tuple[float, float],
             eps_adam: float, kind: str, prox: Optional[np.ndarray] = None) -> Dict[str, float]:
        """One step: :meth:`gradient`, then :meth:`apply`. Returns the figures the torch step reports."""
        with np.errstate(over="ignore", invalid="ignore"):  # (a stale ratio may overflow to inf, as in torch, silently)
            figures = self.gradient(x, actions, mask, adv, ret, old, start, loss, kind, prox)
        self.apply(loss.max_grad_norm, lr, betas, eps_adam)
        return figures

    def gradient(self, x: np.ndarray, actions: np.ndarray, mask: Optional[np.ndarray], adv: np.ndarray,
                 ret: np.ndarray, old: np.ndarray, start: np.ndarray, loss, kind: str,
                 prox: Optional[np.ndarray] = None) -> Dict[str, float]:
        """The loss's gradient into ``self.G``: ``kind`` in clip | dual_clip | decoupled | decoupled_dual_clip;
        ``old`` the behavior log-probs, ``start`` the policy's at the update's start, ``prox`` the decoupled loss's
        proximal log-probs (default ``start``); ``loss`` the config's ``algo.loss``. Returns the step's figures."""
        n = len(adv)
        f32 = np.float32
        hp, out = self.pi.forward(x)
        hv, vout = self.v.forward(x)
        v = vout[:, 0]
        logp, ent, aux = self._dist(out, actions, mask, self.log_std)
        a = adv
        if loss.norm_adv and n > 1:
            c = a - a.sum() / f32(n)
            a = c / (np.sqrt((c * c).sum() / f32(n - 1)) + f32(1e-8))  # (torch's unbiased std)
        decoupled = kind.startswith("decoupled")
        dual = kind.endswith("dual_clip")
        ref = (start if prox is None else prox) if decoupled else old
        eps = loss.clip_eps
        r = np.exp(logp - ref)
        un = r * a
        cr = np.minimum(np.maximum(r, f32(1.0 - eps)), f32(1.0 + eps))  # (np.clip's wrapper costs ~6 us)
        cl = cr * a
        obj = np.minimum(un, cl)
        g_un = _pick_grad(un, cl, smaller=True)
        inside = ((r >= f32(1.0 - eps)) & (r <= f32(1.0 + eps))).astype(f32)
        dobj = r * a * (g_un + (1.0 - g_un) * inside)
        clip_frac = int(np.count_nonzero(np.abs(r - 1.0) > eps)) / n
        dual_frac = 0.0
        if dual:
            lower = f32(loss.dual_clip_c) * a
            neg = a < 0
            dual_frac = int(np.count_nonzero(neg & (lower > obj))) / n
            dobj = np.where(neg, dobj * _pick_grad(obj, lower, smaller=False), dobj)
            obj = np.where(neg, np.maximum(obj, lower), obj)
        trunc = None
        if decoupled:
            raw_w = np.exp(ref - old)
            w = np.minimum(raw_w, f32(loss.is_cap))
            trunc = int(np.count_nonzero(raw_w > loss.is_cap)) / n
            obj = w * obj
            dobj = w * dobj
        pl = -obj.sum() / f32(n)
        dlogp = (dobj * f32(-1.0 / n)).astype(f32)
        v_err = v - ret
        vl = 0.5 * (v_err * v_err).sum() / f32(n)
        dv = (v_err * f32(loss.vf_coef / n)).astype(f32).reshape(-1, 1)
        ent_m = float(ent.sum() / f32(n)) if np.ndim(ent) else float(ent)
        d_ent = f32(-loss.ent_coef / n)  # dL/d(entropy of each row)
        if self.discrete:
            p, logp_all = aux
            dout = -p * dlogp[:, None]
            dout[np.arange(n), actions.reshape(-1).astype(np.int64)] += dlogp
            dout -= d_ent * p * (logp_all + ent[:, None])
            if mask is not None:
                dout = np.where(mask, dout, 0.0)
            dout = dout.astype(f32)
        else:
            z, inv = aux
            dout = (dlogp[:, None] * z * inv).astype(f32)
            g = (dlogp[:, None] * (z * z - 1.0)).sum(axis=0) + d_ent * n
            g *= (self.log_std >= LOG_STD_MIN) & (self.log_std <= LOG_STD_MAX)
            self.g_log_std[...] = g
        self.pi.backward(hp, dout, self.g_pi)
        self.v.backward(hv, dv, self.g_v)
        log_r = logp - start
        kl = float(np.maximum(np.expm1(log_r) - log_r, 0.0).sum() / f32(n))  # (numpy's mean() costs ~9 us a call)
        figures = {"policy_loss": float(pl), "value_loss": float(vl), "entropy": ent_m, "clip_frac": clip_frac,
                   "dual_clip_frac": dual_frac, "approx_kl": kl}
        if trunc is not None:
            figures["is_trunc_frac"] = trunc
        return figures

    def apply(self, max_grad_norm: float, lr: float, betas: Tuple[float, float], eps_adam: float) -> None:
        """``clip_grad_norm`` of ``self.G``, then an Adam step (``torch.optim.Adam``'s arithmetic)."""
        f32 = np.float32
        G = self.G.data
        total = math.sqrt(float(np.dot(G, G)))
        G *= f32(min(max_grad_norm / (total + 1e-6), 1.0))
        b1, b2 = betas
        self.steps += 1
        M, V, P = self.M.data, self.V.data, self.P.data
        M += f32(1.0 - b1) * (G - M)
        V *= f32(b2)
        V += f32(1.0 - b2) * G * G
        if (self.steps == self.steps[0]).all():
            t = int(self.steps[0])
            denom = np.sqrt(V)
            denom /= f32(math.sqrt(1.0 - b2 ** t))
            denom += f32(eps_adam)
            P -= f32(lr / (1.0 - b1 ** t)) * M / denom
        else:  # (parameters with different step counts: each with its own bias correction)
            for i, (lo, hi) in enumerate(zip(self.P.offsets[:-1], self.P.offsets[1:])):
                t = int(self.steps[i])
                denom = np.sqrt(V[lo:hi]) / f32(math.sqrt(1.0 - b2 ** t)) + f32(eps_adam)
                P[lo:hi] -= f32(lr / (1.0 - b1 ** t)) * M[lo:hi] / denom
