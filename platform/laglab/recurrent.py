"""Recurrent cores in numpy, for the actors' side of a recurrent policy (actor processes never import torch): one
step of a GRU or an LSTM cell with torch's weight layout and gate order, so a snapshot of ``torch.nn.GRUCell`` /
``torch.nn.LSTMCell`` weights (``weight_ih``, ``weight_hh``, ``bias_ih``, ``bias_hh``) runs here unchanged.

torch.nn.GRUCell (gates r, z, n stacked in that order along the first axis of each weight):
    r = sigmoid(W_ir x + b_ir + W_hr h + b_hr)
    z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
    n = tanh(W_in x + b_in + r * (W_hn h + b_hn))
    h' = (1 - z) * n + z * h
torch.nn.LSTMCell (gates i, f, g, o):
    i, f, o = sigmoid(...), g = tanh(...);  c' = f * c + i * g;  h' = o * tanh(c')

A recurrent state is one float32 array per env: ``[H]`` for a GRU, ``[2, H]`` (h then c) for an LSTM; it is zero
at an episode's start. The policy's state at a fragment's first step travels with the fragment (the history
contract of issue 21); this module is the arithmetic only.
"""
from __future__ import annotations

from typing import Mapping, Optional

import numpy as np

KINDS = ("gru", "lstm")


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # sigmoid(x) = (1 + tanh(x / 2)) / 2: one vectorized op, and no exp to overflow for large |x|
    return 0.5 + 0.5 * np.tanh(0.5 * x)


def state_shape(kind: str, hidden: int) -> tuple:
    if kind not in KINDS:
        raise ValueError(f"recurrent kind {kind!r}; allowed: {', '.join(KINDS)}")
    return (hidden,) if kind == "gru" else (2, hidden)


def policy_state_shape(policy) -> Optional[tuple]:
    """The state shape of a policy config (``policy.recurrent``, ``policy.hidden``); None for a feed-forward one."""
    kind = getattr(policy, "recurrent", "none")
    return None if kind in (None, "none") else state_shape(kind, int(policy.hidden))


def zero_state(kind: str, hidden: int, batch: int) -> np.ndarray:
    return np.zeros((batch,) + state_shape(kind, hidden), np.float32)


def gru_blocks(w_ih: np.ndarray, w_hh: np.ndarray, b_ih: np.ndarray, b_hh: np.ndarray):
    """torch's GRU weights (``weight_ih`` [3H, in], ``weight_hh`` [3H, H], ``bias_ih``, ``bias_hh`` [3H]; gates r, z,
    n) as laglab's numpy GRUs run them — the actors' :meth:`Cell.step` and the learner's
    :func:`laglab.npstep.gru_forward` —, split by gate and transposed for ``x @ w``: ``(wi_rz [in, 2H], wi_n [in, H],
    wh_rz [H, 2H], wh_n [H, H], b_rz [2H], b_in [H], b_hn [H])``. r's and z's weights are halved and their two
    biases summed and halved, so one tanh gives both gates: sigmoid(a) = 0.5 + 0.5 tanh(a / 2) (halving is exact:
    a power of two). n's hidden bias ``b_hn`` stays apart: it sits inside r * (W_hn h + b_hn). float32 throughout."""
    w_ih, w_hh = np.asarray(w_ih, np.float32), np.asarray(w_hh, np.float32)
    b_ih, b_hh = np.asarray(b_ih, np.float32), np.asarray(b_hh, np.float32)
    H, half = w_hh.shape[1], np.float32(0.5)
    return ((w_ih[:2 * H] * half).T, w_ih[2 * H:].T, w_hh[:2 * H].T * half, np.ascontiguousarray(w_hh[2 * H:].T),
            half * (b_ih[:2 * H] + b_hh[:2 * H]), b_ih[2 * H:], b_hh[2 * H:])


class Cell:
    """One recurrent cell's weights (torch's names, without a prefix) and its step on a batch."""

    def __init__(self, kind: str, weights: Mapping[str, np.ndarray]):
        if kind not in KINDS:
            raise ValueError(f"recurrent kind {kind!r}; allowed: {', '.join(KINDS)}")
        self.kind = kind
        self.w_ih = np.ascontiguousarray(np.asarray(weights["weight_ih"], np.float32).T)  # [in, G*H]
        self.w_hh = np.ascontiguousarray(np.asarray(weights["weight_hh"], np.float32).T)  # [H, G*H]
        self.b_ih = np.asarray(weights["bias_ih"], np.float32)
        self.b_hh = np.asarray(weights["bias_hh"], np.float32)
        gates = 3 if kind == "gru" else 4
        self.hidden = self.w_hh.shape[0]
        if self.w_hh.shape[1] != gates * self.hidden or self.w_ih.shape[1] != gates * self.hidden:
            raise ValueError(f"{kind} weights of shapes {self.w_ih.shape[::-1]}, {self.w_hh.shape[::-1]}: "
                             f"not {gates} gates of {self.hidden}")
        if kind == "gru":  # the gates' blocks side by side: one product each for x and h (gru_blocks: halved r, z)
            wi_rz, wi_n, wh_rz, wh_n, b_rz, b_in, self.g_bhn = gru_blocks(weights["weight_ih"], weights["weight_hh"],
                                                                         self.b_ih, self.b_hh)
            self.g_ih = np.concatenate([wi_rz, wi_n], axis=1)  # [in, 3H]
            self.g_hh = np.concatenate([wh_rz, wh_n], axis=1)  # [H, 3H]
            self.g_b = np.concatenate([b_rz, b_in])

    def step(self, x: np.ndarray, state: np.ndarray) -> np.ndarray:
        """The next state ([B, H] GRU, [B, 2, H] LSTM) from inputs ``x`` [B, in] and ``state``."""
        H = self.hidden
        if self.kind == "gru":  # (sigmoid(a) = 0.5 + 0.5 tanh(a / 2), on the halved pre-activations of r and z)
            h = state
            gi = x @ self.g_ih
            gi += self.g_b
            gh = h @ self.g_hh
            rz = gi[:, :2 * H] + gh[:, :2 * H]
            np.tanh(rz, out=rz)
            rz *= 0.5
            rz += 0.5
            n = gh[:, 2 * H:] + self.g_bhn
            n *= rz[:, :H]
            n += gi[:, 2 * H:]
            np.tanh(n, out=n)
            out = h - n  # (1 - z) n + z h = n + z (h - n)
            out *= rz[:, H:]
            out += n
            return out.astype(np.float32, copy=False)
        gi = x @ self.w_ih + self.b_ih
        h, c = np.ascontiguousarray(state[:, 0]), state[:, 1]
        g = gi + h @ self.w_hh + self.b_hh
        sg = _sigmoid(g)  # (i, f and o; g's block is tanh'd below)
        out = np.empty((len(g), 2, H), np.float32)
        c2 = sg[:, H:2 * H] * c + sg[:, :H] * np.tanh(g[:, 2 * H:3 * H])
        out[:, 1] = c2
        out[:, 0] = sg[:, 3 * H:] * np.tanh(c2)
        return out

    @staticmethod
    def output(kind: str, state: np.ndarray) -> np.ndarray:
        """What the heads read: h ([B, H])."""
        return state if kind == "gru" else state[:, 0]


def reset_where(state: np.ndarray, done: np.ndarray) -> np.ndarray:
    """``state`` with the rows of envs whose episode just ended set to zero (their next step starts an episode)."""
    out = state.copy()
    out[np.asarray(done, bool)] = 0.0
    return out
