"""The learner's minibatch step in numpy: forward, loss, hand-derived gradients, global-norm clipping and Adam, on
flat copies of the model's parameters and the optimizer's state. A recurrent policy's GRU core runs forwards and
backwards in numpy too (:func:`gru_forward`, :func:`gru_backward`), an LSTM's in torch's fused kernel (see
:meth:`NumpyStep.recurrent_gradient`).

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
from .recurrent import gru_blocks

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

    def __init__(self, pairs: List[Tuple[np.ndarray, np.ndarray]], activation: str, last_act: bool = False):
        self.pairs = pairs
        self.activation = activation
        self.last_act = last_act  # (the recurrent encoder: every layer is followed by the activation)

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
        if self.last_act:
            out = act(out)
        return hs, out

    def backward(self, hs: List[np.ndarray], d: np.ndarray, grads: List[Tuple[np.ndarray, np.ndarray]],
                 out: Optional[np.ndarray] = None) -> None:
        """Write each layer's gradient into ``grads`` (views, as ``pairs``) from ``d`` = dL/d(output) (``out``: the
        output, for a last activation's gradient; ``d`` is then changed in place)."""
        if self.last_act:
            _act_grad(self.activation, d, out)
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


# the reset input's weight into an LSTM's input and forget gates: both exactly 0 (see lanes) while every other gate
# pre-activation stays far below 1e9 in size (only a diverged policy's could reach it)
RESET_WEIGHT = -1e9


def lanes(dones: np.ndarray, start: np.ndarray):
    """A dense layout of ``N`` sequences of ``T`` steps for one call of torch's fused LSTM kernel: sequence n is lane
    n from its step ``start[n]``, with one reset step inserted after each of its episode ends (but the last step).
    A reset step's input is zero but for an extra reset feature of weight :data:`RESET_WEIGHT` into the input and
    forget gates: both gates are exactly 0 (while the other pre-activations are far below 1e9 in size), so the state
    after it is exactly zero (c = 0 * c + 0 * g, h = o * tanh(0)), its output is discarded, and no gradient crosses
    it (each gate's derivative is 0). ``dones`` [T, N]
    bool, ``start`` [N]. Returns (live [T, N] bool: the steps laid out, lane [T, N]: each live step's position in its
    lane, (lane positions, lanes) of the reset steps, L: the lanes' length)."""
    T, N = dones.shape
    t = np.arange(T).reshape(-1, 1)
    live = t >= start.reshape(1, -1)
    d = dones & live
    before = np.zeros((T, N), np.int64)  # episode ends before step t
    np.cumsum(d[:-1], axis=0, out=before[1:])
    lane = t - start.reshape(1, -1) + before
    rt, rc = np.nonzero(d[:-1])
    L = int(np.where(live, lane, -1).max()) + 1
    return live, lane, (lane[rt, rc] + 1, rc), L


def gru_forward(x: np.ndarray, h0: np.ndarray, keep: np.ndarray, w_ih: np.ndarray, w_hh: np.ndarray,
                b_ih: np.ndarray, b_hh: np.ndarray):
    """A GRU (torch's ``nn.GRU`` equations and weight layout: gates r, z, n) over ``T`` steps of ``n`` sequences in
    numpy. ``x`` [T, n, E], ``h0`` [n, H] the states before the first step, ``keep`` [T, n] float: 0 where an
    episode ends at the step (the next step starts from the zero state). Returns (h [T, n, H] each step's output,
    before any reset; the tape :func:`gru_backward` needs). Every step's input projection is one product before the
    loop, so a step is two small products and ten elementwise calls, each on a contiguous block (a strided one
    costs numpy ~2.5x; torch's CPU GRU runs step by step through its dispatcher and autograd: ~3x slower at the
    presets' sizes, ``benchmarks/recurrent_kernels.py``). sigmoid(a) = 0.5 + 0.5 tanh(a / 2): r's and z's weights
    and biases are halved first (:func:`laglab.recurrent.gru_blocks`, as the actors' cell has them)."""
    T, n, E = x.shape
    H = w_hh.shape[1]
    x2 = x.reshape(T * n, E)
    wi_rz, wi_n, w_rz, w_n, b_rz, b_in, b_hn = gru_blocks(w_ih, w_hh, b_ih, b_hh)
    gi_rz = (x2 @ wi_rz).reshape(T, n, 2 * H)
    gi_rz += b_rz
    gi_n = (x2 @ wi_n).reshape(T, n, H)
    gi_n += b_in
    RZ = np.empty((T, n, 2 * H), np.float32)  # r, z
    N = np.empty((T, n, H), np.float32)  # n
    G = np.empty((T, n, H), np.float32)  # W_hn h + b_hn
    out = np.empty((T, n, H), np.float32)
    resets = (keep == 0).any(axis=1)
    keep3 = keep.reshape(T, n, 1).astype(np.float32)
    h = h0.astype(np.float32, copy=False)
    for t in range(T):
        rz = RZ[t]
        np.matmul(h, w_rz, out=rz)
        rz += gi_rz[t]
        np.tanh(rz, out=rz)
        rz *= 0.5
        rz += 0.5
        g = G[t]
        np.matmul(h, w_n, out=g)
        g += b_hn
        nv = N[t]
        np.multiply(rz[:, :H], g, out=nv)
        nv += gi_n[t]
        np.tanh(nv, out=nv)
        o = out[t]
        np.subtract(h, nv, out=o)  # h' = (1 - z) n + z h = n + z (h - n)
        o *= rz[:, H:]
        o += nv
        h = o * keep3[t] if resets[t] else o
    hp = np.empty((T, n, H), np.float32)  # the state each step started from (after a reset)
    hp[0] = h0
    np.multiply(out[:-1], keep3[:-1], out=hp[1:])
    return out, (x2, hp, RZ, N, G, keep3, resets, w_ih, w_hh)


def gru_backward(tape, dout: np.ndarray, cut: Optional[np.ndarray] = None, cut_at: int = 0):
    """Gradients of :func:`gru_forward` given dL/dh ``dout`` [T, n, H]: (dL/dx [T * n, E], dW_ih, dW_hh, db_ih,
    db_hh). ``cut`` [n] bool: no gradient reaches the steps before ``cut_at`` of these sequences through their state
    (burn-in: the state at ``cut_at`` is taken as a constant). With a_r, a_z, a_n the gates' pre-activations and
    g = W_hn h + b_hn, given d = dL/dh' at a step: da_n = d f_n, f_n = (1 - z) (1 - n^2); da_z = d (h - n) z (1 - z);
    da_r = d f_n g r (1 - r); the input path gets (da_r, da_z, da_n), the hidden path (da_r, da_z, d f_n r), and
    the state the step started from d z + (hidden path) W_hh, zero where it was reset. Every factor of d is
    computed for all steps before the loop, so a step is one broadcast product, one matrix product and three
    elementwise calls."""
    x2, hp, RZ, N, G, keep3, resets, w_ih, w_hh = tape
    T, n, H = hp.shape
    r = RZ[..., :H]
    z = np.ascontiguousarray(RZ[..., H:])
    f_n = (1.0 - z) * (1.0 - N * N)
    F = np.empty((T, n, 3, H), np.float32)  # dL/d(hidden path) = d x F, per gate
    np.multiply(f_n, G * r * (1.0 - r), out=F[:, :, 0])
    np.multiply(hp - N, z * (1.0 - z), out=F[:, :, 1])
    np.multiply(f_n, r, out=F[:, :, 2])
    dgh = np.empty((T, n, 3, H), np.float32)
    D = np.empty((T, n, H), np.float32)  # d at each step
    carry = np.zeros((n, H), np.float32)
    tmp = np.empty((n, H), np.float32)
    for t in range(T - 1, -1, -1):
        d = D[t]
        np.add(dout[t], carry, out=d)
        g = dgh[t]
        np.multiply(F[t], d[:, None, :], out=g)
        carry = g.reshape(n, 3 * H) @ w_hh
        np.multiply(d, z[t], out=tmp)
        carry += tmp
        if t and resets[t - 1]:
            carry *= keep3[t - 1]
        if t == cut_at and cut is not None:
            carry[cut] = 0.0
    DGH = dgh.reshape(T * n, 3 * H)
    DGI = DGH.copy()
    np.multiply(D, f_n, out=DGI.reshape(T, n, 3, H)[:, :, 2])  # (the input path's n gate: da_n, without r)
    return DGI @ w_ih, DGI.T @ x2, DGH.T @ hp.reshape(T * n, H), DGI.sum(axis=0), DGH.sum(axis=0)


def supported(model: torch.nn.Module, device: torch.device, activation: str, ewma: bool = False) -> Optional[str]:
    """None when :class:`NumpyStep` can run this model's updates (``ewma``: with the decoupled loss's EWMA proximal
    policy), else why not."""
    from .policy import ActorCritic, RecurrentActorCritic

    if device.type != "cpu":
        return f"learner.device={device} (numpy runs on the CPU)"
    if type(model) not in (ActorCritic, RecurrentActorCritic):
        return f"a {type(model).__name__}"
    if type(model) is RecurrentActorCritic and ewma:
        return "a recurrent policy with algo.loss.prox=ewma (the EWMA policy's unroll is torch's)"
    if activation not in ACTIVATIONS:
        return f"policy.activation={activation}"
    if any(p.dtype != torch.float32 for p in model.parameters()):
        return "parameters that are not float32"
    return None


class NumpyStep:
    """The update's minibatch steps for a :class:`~laglab.policy.ActorCritic` or a
    :class:`~laglab.policy.RecurrentActorCritic` (without an EWMA proximal policy) and the learner's
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

        def layers(flat: Flat, seq, last_act: bool = False) -> Layers:
            lins = [m for m in seq if isinstance(m, torch.nn.Linear)]
            return Layers([(flat.views[pos[id(m.weight)]], flat.views[pos[id(m.bias)]]) for m in lins], activation,
                          last_act)

        if hasattr(model, "core"):  # recurrent: encoder -> core (GRU: numpy; LSTM: torch's kernel) -> linear heads
            if prox_model is not None:
                raise ValueError("NumpyStep: a recurrent policy with an EWMA proximal policy (see supported)")
            self.enc, self.g_enc = layers(self.P, model.enc, True), layers(self.G, model.enc, True).pairs
            pi, v = [model.pi_head], [model.v_head]
            self.kind, self.hidden, self.state_shape = model.kind, model.hidden, tuple(model.state_shape)
            # an LSTM: a private torch LSTM whose weights are views of the flat buffer (the kernel reads the
            # weights each step leaves there; its gradients are copied into G), with one more input, the reset (see
            # lanes): its own input weights, refreshed from the flat buffer at each step. A GRU reads the flat
            # buffer directly (gru_forward)
            self.core_at = [pos[id(w)] for w in model.core.parameters()]
            if self.kind == "lstm":
                E = model.core.input_size
                with torch.random.fork_rng(devices=[]):  # (its initial weights are overwritten: draw nothing)
                    self.core = torch.nn.LSTM(E + 1, self.hidden)
                self.w_ih = np.zeros((4 * self.hidden, E + 1), np.float32)
                self.w_ih[:2 * self.hidden, E] = RESET_WEIGHT
                with torch.no_grad():
                    for (name, w), i in zip(self.core.named_parameters(), self.core_at):
                        w.data = torch.from_numpy(self.w_ih if name == "weight_ih_l0" else self.P.views[i])
        else:
            pi, v = model.pi, model.v
        self.pi, self.v = layers(self.P, pi), layers(self.P, v)
        self.g_pi = layers(self.G, pi).pairs
        self.g_v = layers(self.G, v).pairs
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
        hp, out = self.pi.forward(x)
        hv, vout = self.v.forward(x)
        dout, dv, figures = self._loss(out, vout[:, 0], actions, mask, adv, ret, old, start, loss, kind, prox)
        self.pi.backward(hp, dout, self.g_pi)
        self.v.backward(hv, dv, self.g_v)
        return figures

    def _loss(self, out: np.ndarray, v: np.ndarray, actions: np.ndarray, mask: Optional[np.ndarray],
              adv: np.ndarray, ret: np.ndarray, old: np.ndarray, start: np.ndarray, loss, kind: str,
              prox: Optional[np.ndarray]):
        """From the heads' outputs (``out`` [n, A], values ``v`` [n]): (dL/dout, dL/dv [n, 1], the step's figures);
        the log-std's gradient is written into ``self.G``."""
        n = len(adv)
        f32 = np.float32
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
        log_r = logp - start
        kl = float(np.maximum(np.expm1(log_r) - log_r, 0.0).sum() / f32(n))  # (numpy's mean() costs ~9 us a call)
        figures = {"policy_loss": float(pl), "value_loss": float(vl), "entropy": ent_m, "clip_frac": clip_frac,
                   "dual_clip_frac": dual_frac, "approx_kl": kl}
        if trunc is not None:
            figures["is_trunc_frac"] = trunc
        return dout, dv, figures

    # ---- one minibatch of a recurrent policy ----------------------------------------------------------------
    def _hx(self, state: np.ndarray):
        """The kernel's hidden-state argument for states [n, *S] (the model's own conversion)."""
        return self.model._hx(torch.from_numpy(np.ascontiguousarray(state)))

    def _state(self, hx) -> np.ndarray:
        return self.model._state(hx).numpy()

    def _core_grads(self) -> None:
        """The private LSTM's gradients into ``self.G`` (its input weights without the reset input's column)."""
        for (name, w), i in zip(self.core.named_parameters(), self.core_at):
            g = w.grad.numpy()
            self.G.views[i][...] = g[:, :-1] if name == "weight_ih_l0" else g

    def recurrent_step(self, obs: np.ndarray, init: np.ndarray, dones: np.ndarray, keep: np.ndarray,
                       cut: Optional[np.ndarray], cut_at: int, actions: np.ndarray, mask: Optional[np.ndarray],
                       adv: np.ndarray, ret: np.ndarray, old: np.ndarray, start: np.ndarray, loss, lr: float,
                       betas: Tuple[float, float], eps_adam: float, kind: str) -> Dict[str, float]:
        """One step of a recurrent policy: :meth:`recurrent_gradient`, then :meth:`apply`."""
        with np.errstate(over="ignore", invalid="ignore"):
            figures = self.recurrent_gradient(obs, init, dones, keep, cut, cut_at, actions, mask, adv, ret, old,
                                              start, loss, kind)
        self.apply(loss.max_grad_norm, lr, betas, eps_adam)
        return figures

    def recurrent_gradient(self, obs: np.ndarray, init: np.ndarray, dones: np.ndarray, keep: np.ndarray,
                           cut: Optional[np.ndarray], cut_at: int, actions: np.ndarray, mask: Optional[np.ndarray],
                           adv: np.ndarray, ret: np.ndarray, old: np.ndarray, start: np.ndarray, loss,
                           kind: str) -> Dict[str, float]:
        """The loss's gradient into ``self.G`` for ``n`` whole sequences, as the torch path's
        :meth:`~laglab.policy.RecurrentActorCritic.outputs` lays them out: ``obs`` [T, n, *obs], ``init`` [n, *S] the
        states before their first steps, ``dones`` [T, n], ``keep`` [T, n] the steps the loss counts, ``cut`` [n]
        the sequences whose state at step ``cut_at`` is taken without a gradient (burn-in). The rows of the
        per-step arrays (``actions`` ... ``start``) are the kept steps in time-major order. The encoder and the
        heads are numpy's (hand-derived gradients), and so is a GRU core (:meth:`_gru`); an LSTM core runs forwards
        and backwards in torch's fused kernel, one call per minibatch (two with burn-in), on the weights in
        ``self.P``."""
        T, n = dones.shape
        he, e = self.enc.forward(obs.reshape(T * n, -1))
        E = e.shape[1]
        if self.kind == "gru":
            return self._gru(he, e, init, dones, keep, cut if cut is not None and 0 < cut_at < T else None, cut_at,
                             actions, mask, adv, ret, old, start, loss, kind)
        self.w_ih[:, :E] = self.P.views[self.core_at[0]]
        first_step = np.zeros(n, dtype=np.int64)
        if cut is not None and 0 < cut_at < T and cut.any():  # burn-in: the LSTM's state at cut_at, no gradient
            c = np.flatnonzero(cut)
            x = e.reshape(T, n, E)[:cut_at, c]
            x = np.concatenate([x, np.zeros(x.shape[:2] + (1,), np.float32)], axis=2)  # (its reset input: 0)
            with torch.no_grad():
                _, hx = self.core(torch.from_numpy(np.ascontiguousarray(x)), self._hx(init[c]))
            init = init.copy()
            init[c] = self._state(hx)
            first_step[c] = cut_at
        return self._lstm_lanes(he, e, init, dones, keep, first_step, actions, mask, adv, ret, old, start, loss, kind)

    def recurrent_pass(self, obs: np.ndarray, state: np.ndarray, dones: np.ndarray, height: np.ndarray,
                       pred: np.ndarray, actions: np.ndarray, masks: Optional[np.ndarray], last_obs: np.ndarray,
                       trunc_obs: np.ndarray, trunc_pos: np.ndarray):
        """:meth:`laglab.learner.Learner._recurrent_pass` under the weights in ``self.P``, step by step in numpy (the
        actors' :class:`laglab.recurrent.Cell`): one pass over T steps per chain level instead of torch's kernel
        called once per stretch between two episode ends. ``obs`` [T, N, *obs], ``state`` [N, *S] the stored
        states, ``dones`` [T, N], ``height`` / ``pred`` the chains (:func:`laglab.learner.chain_heights`,
        :func:`~laglab.learner.predecessors`), ``actions`` [T * N, ...], ``masks`` [T * N, A] or None. Returns
        (values [T, N], bootstrap [N], the truncations' values [K] or None, log-probs [T, N], initial states
        [N, *S])."""
        from .recurrent import Cell

        T, N = dones.shape
        cell = Cell(self.kind, {k: self.P.views[i] for k, i in
                                zip(("weight_ih", "weight_hh", "bias_ih", "bias_hh"), self.core_at)})
        x = self.enc.forward(obs.reshape(T * N, -1), keep=False)[1].reshape(T, N, -1)
        S = (1,) * len(self.state_shape)
        init = state.copy()
        hs = np.zeros((T, N, self.hidden), np.float32)
        last = np.zeros((N,) + self.state_shape, np.float32)  # the state after the last step
        t_trunc, n_trunc = np.divmod(trunc_pos, N)
        at_trunc = np.zeros((len(trunc_pos),) + self.state_shape, np.float32)
        keep = (~dones).astype(np.float32).reshape((T, N) + S)
        for level in range(int(height.max()) + 1):
            at = np.flatnonzero(height == level)
            if level > 0:
                p = pred[at]
                init[at] = last[p] * keep[-1, p]
            s_ = init[at]
            here = np.isin(n_trunc, at)
            for t in range(T):
                s_ = cell.step(x[t, at], s_)
                hs[t, at] = Cell.output(self.kind, s_)
                if t == T - 1:
                    last[at] = s_
                hit = here & (t_trunc == t)
                if hit.any():  # (a truncated step ends an episode: its state bootstraps the final observation)
                    at_trunc[hit] = s_[np.searchsorted(at, n_trunc[hit])]
                s_ = s_ * keep[t, at]
        _, out = self.pi.forward(hs.reshape(T * N, -1), keep=False)
        logp = self._dist(out, actions, masks, self.log_std)[0].reshape(T, N)
        values = self.v.forward(hs.reshape(T * N, -1), keep=False)[1].reshape(T, N)

        def value_after(o: np.ndarray, s0: np.ndarray) -> np.ndarray:
            s1 = cell.step(self.enc.forward(o.reshape(len(o), -1), keep=False)[1], s0)
            return self.v.forward(Cell.output(self.kind, s1), keep=False)[1][:, 0]

        bootstrap = value_after(last_obs, last * keep[-1])
        trunc_values = value_after(trunc_obs, at_trunc) if len(trunc_pos) else None
        return values, bootstrap, trunc_values, logp, init

    def _heads_backward(self, h: np.ndarray, actions, mask, adv, ret, old, start, loss, kind: str):
        """The heads on the kept steps' core outputs ``h`` [rows, H]: (dL/dh, the step's figures); the heads'
        gradients are written into ``self.G``."""
        hp, pout = self.pi.forward(h)
        hv, vout = self.v.forward(h)
        dout, dv, figures = self._loss(pout, vout[:, 0], actions, mask, adv, ret, old, start, loss, kind, None)
        self.pi.backward(hp, dout, self.g_pi)
        self.v.backward(hv, dv, self.g_v)
        return dout @ self.pi.pairs[0][0] + dv @ self.v.pairs[0][0], figures

    def _gru(self, he, e, init, dones, keep, cut, cut_at, actions, mask, adv, ret, old, start, loss, kind):
        """:meth:`recurrent_gradient`'s core for a GRU, in numpy (:func:`gru_forward`, :func:`gru_backward`): each
        sequence runs whole from its initial state, its state zeroed after each episode end; a burnt-in sequence
        (``cut``) runs its first ``cut_at`` steps too — they have no episode end and no loss, and no gradient crosses
        into them."""
        T, n = dones.shape
        E = e.shape[1]
        w_ih, w_hh, b_ih, b_hh = (self.P.views[i] for i in self.core_at)
        h, tape = gru_forward(e.reshape(T, n, E), init, (~dones).astype(np.float32), w_ih, w_hh, b_ih, b_hh)
        rows = np.flatnonzero(keep.reshape(-1))
        dh = np.zeros((T * n, self.hidden), np.float32)
        dh[rows], figures = self._heads_backward(h.reshape(T * n, -1)[rows], actions, mask, adv, ret, old, start,
                                                 loss, kind)
        de, *grads = gru_backward(tape, dh.reshape(T, n, -1), cut, cut_at)
        for i, g in zip(self.core_at, grads):
            self.G.views[i][...] = g
        self.enc.backward(he, de, self.g_enc, out=e)
        return figures

    def _lstm_lanes(self, he, e, init, dones, keep, first_step, actions, mask, adv, ret, old, start, loss, kind):
        """:meth:`recurrent_gradient`'s core for an LSTM: each sequence is one lane of a single dense call of the
        fused kernel (:func:`lanes`: a reset step after each episode end zeroes the state exactly), instead of one
        padded column per piece between episode ends (twice the kernel's work once episodes are shorter than the
        segments)."""
        T, n = dones.shape
        E = e.shape[1]
        live, lane, (r_lane, r_col), L = lanes(dones, first_step)
        tt, cc = np.nonzero(live)
        xs = np.zeros((L, n, E + 1), np.float32)
        xs[lane[tt, cc], cc, :E] = e.reshape(T, n, E)[tt, cc]
        xs[r_lane, r_col, E] = 1.0
        xs = torch.from_numpy(xs).requires_grad_()
        for w in self.core.parameters():
            w.grad = None
        out, _ = self.core(xs, self._hx(init))
        kt, kc = np.nonzero(keep)  # (the rows, time-major as the caller's arrays)
        at = lane[kt, kc]
        dh, figures = self._heads_backward(out.detach().numpy()[at, kc], actions, mask, adv, ret, old, start, loss,
                                           kind)
        d_out = np.zeros((L, n, self.hidden), np.float32)
        d_out[at, kc] = dh
        out.backward(torch.from_numpy(d_out))
        self._core_grads()
        de = np.zeros((T, n, E), np.float32)
        de[tt, cc] = xs.grad.numpy()[lane[tt, cc], cc, :E]
        self.enc.backward(he, de.reshape(T * n, E), self.g_enc, out=e)
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
