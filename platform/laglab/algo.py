"""Pure tensor functions: advantage estimators, policy losses, log-probs, KL estimators.

No threads, no config objects. Time-major layout: ``[T, N]`` (T steps of N independent sequences).
``discounts[t]`` is the discount applied *after* step t: ``gamma * (1 - done[t])``; a truncated step is
handled by the caller by folding ``gamma * V(final_obs)`` into its reward and marking it done.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from .inference import HALF_LOG_2PI, LOG_STD_MAX, LOG_STD_MIN  # noqa: E402,F401 - shared with the numpy side


def backward_scan(deltas: Tensor, coef: Tensor, last: Tensor) -> Tensor:
    """out[t] = deltas[t] + coef[t] * out[t + 1] for t = T-1 .. 0, with out[T] = ``last`` ([T, N], [T, N], [N]).
    The same float operations in the same order on any device; on the host a numpy loop (~10x cheaper per step than
    torch's per-op dispatch on these small rows, and the results identical bit for bit); tensors that need
    gradients take the torch loop."""
    T = deltas.shape[0]
    if deltas.device.type == "cpu" and not (deltas.requires_grad or coef.requires_grad or last.requires_grad):
        d, c = deltas.numpy(), coef.numpy()
        res = torch.empty_like(deltas)  # (a tensor torch made, written through its numpy view)
        out = res.numpy()
        acc = last.numpy()
        for t in range(T - 1, -1, -1):
            acc = d[t] + c[t] * acc
            out[t] = acc
        return res
    out = torch.zeros_like(deltas)
    acc = last
    for t in range(T - 1, -1, -1):
        acc = deltas[t] + coef[t] * acc
        out[t] = acc
    return out


def gae(rewards: Tensor, values: Tensor, bootstrap: Tensor, discounts: Tensor, lam: float,
        carry: Optional[Tensor] = None) -> Tensor:
    """Generalized advantage estimation (Schulman et al. 2016).

    A_t = sum_k (prod_{i<k} discounts[t+i] * lam) * delta_{t+k},
    delta_t = r_t + discounts[t] * V_{t+1} - V_t, with V_T = bootstrap.
    ``carry`` [N]: the advantage at the first step of a proven-adjacent next fragment (default 0: the
    sequence ends here and is bootstrapped with V_T alone).
    """
    next_values = torch.cat([values[1:], bootstrap.unsqueeze(0)], dim=0)
    deltas = rewards + discounts * next_values - values
    return backward_scan(deltas, discounts * lam, torch.zeros_like(bootstrap) if carry is None else carry)


class VTraceReturns(NamedTuple):
    vs: Tensor  # value targets v_s
    advantages: Tensor  # q_s - V(x_s), with q_s = r_s + discount_s * v_{s+1}


def vtrace(
    behavior_logp: Tensor,
    target_logp: Tensor,
    rewards: Tensor,
    values: Tensor,
    bootstrap: Tensor,
    discounts: Tensor,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    lam: float = 1.0,
    carry: Optional[Tensor] = None,
) -> VTraceReturns:
    """V-trace targets (Espeholt et al. 2018, eq. 1), computed by the backward recursion

    v_s - V(x_s) = delta_s + discount_s * c_s * (v_{s+1} - V(x_{s+1})),
    delta_s = rho_s (r_s + discount_s V(x_{s+1}) - V(x_s)), rho_s = min(rho_bar, pi/mu),
    c_s = lam * min(c_bar, pi/mu).

    The returned advantage is ``r_s + discount_s * v_{s+1} - V(x_s)`` *without* the paper's rho_s factor:
    the PPO surrogate multiplies by its own (clipped) ratio pi_theta / mu, so applying rho_s here too would
    weight the policy gradient twice. On fresh data with lam=1 these are the n-step / GAE(1) targets.
    ``carry`` [N]: v - V at the first step of a proven-adjacent next fragment (default 0).
    """
    with torch.no_grad():
        ratio = torch.exp(target_logp - behavior_logp)
        rhos = torch.clamp(ratio, max=rho_bar)
        cs = lam * torch.clamp(ratio, max=c_bar)
        next_values = torch.cat([values[1:], bootstrap.unsqueeze(0)], dim=0)
        deltas = rhos * (rewards + discounts * next_values - values)
        boot_vs = bootstrap if carry is None else bootstrap + carry
        vs_minus_v = backward_scan(deltas, discounts * cs, torch.zeros_like(bootstrap) if carry is None else carry)
        vs = vs_minus_v + values
        next_vs = torch.cat([vs[1:], boot_vs.unsqueeze(0)], dim=0)
        advantages = rewards + discounts * next_vs - values
    return VTraceReturns(vs, advantages)


class LossInfo(NamedTuple):
    loss: Tensor
    clip_frac: Tensor  # fraction of samples where the eps-clip is active
    dual_clip_frac: Tensor  # fraction where the dual-clip bound c*A is active (0 for plain clip)
    is_trunc_frac: Optional[Tensor] = None  # decoupled: fraction of samples whose weight pi_prox/mu was truncated


def _clipped_objective(logp: Tensor, old_logp: Tensor, adv: Tensor, eps: float):
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - eps, 1.0 + eps) * adv
    obj = torch.minimum(unclipped, clipped)
    clip_frac = ((ratio - 1.0).abs() > eps).float().mean()
    return obj, clip_frac


def ppo_clip_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, eps: float) -> LossInfo:
    """PPO clipped surrogate, as a loss: -E[min(r A, clip(r, 1-eps, 1+eps) A)]."""
    obj, clip_frac = _clipped_objective(logp, old_logp, adv, eps)
    return LossInfo(-obj.mean(), clip_frac, obj.new_zeros(()))


def dual_clip_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, eps: float, c: float) -> LossInfo:
    """Dual-clip PPO (Ye et al. 2020): for A < 0 the objective is max(min(r A, clip(r) A), c A), c > 1.

    Bounds how far one sample with a negative advantage and a huge (stale) ratio can push the loss.
    """
    obj, clip_frac = _clipped_objective(logp, old_logp, adv, eps)
    dual, dual_frac = _dual_bound(obj, adv, c)
    return LossInfo(-dual.mean(), clip_frac, dual_frac)


def _dual_bound(obj: Tensor, adv: Tensor, c: float):
    """Dual clip's lower bound c*A on the objective where A < 0; (bounded objective, fraction where it binds)."""
    lower = c * adv
    neg = adv < 0
    return torch.where(neg, torch.maximum(obj, lower), obj), (neg & (lower > obj)).float().mean()


def decoupled_loss(logp: Tensor, prox_logp: Tensor, behavior_logp: Tensor, adv: Tensor, eps: float, is_cap: float,
                   dual_clip_c: Optional[float] = None) -> LossInfo:
    """The decoupled PPO objective (Hilton et al. 2022, "Batch size-invariance for policy optimization", eq. 2;
    the objective AReaL uses for stale data): the *proximal* policy pi_prox bounds the update, the *behavior*
    policy mu only enters through an importance weight,

        L = -E_mu[ w * min(r A, clip(r, 1-eps, 1+eps) A) ],  r = pi_theta / pi_prox,  w = min(pi_prox / mu, is_cap),

    with w a constant (no gradient). With ``dual_clip_c`` the inner objective is dual-clip's
    max(min(r A, clip(r) A), c A) for A < 0 (Ye et al. 2020). The truncation of w (as truncated importance
    sampling) bounds the variance a very stale sample adds; Hilton et al. cap pi_theta/mu instead, AReaL drops the
    samples past its cap. On fresh data (pi_prox = mu) w = 1 and this is exactly PPO's clipped surrogate.
    """
    with torch.no_grad():
        raw_w = torch.exp(prox_logp - behavior_logp)
        w = torch.clamp(raw_w, max=is_cap)
        trunc = (raw_w > is_cap).float().mean()
    obj, clip_frac = _clipped_objective(logp, prox_logp, adv, eps)
    dual_frac = obj.new_zeros(())
    if dual_clip_c is not None:
        obj, dual_frac = _dual_bound(obj, adv, dual_clip_c)
    return LossInfo(-(w * obj).mean(), clip_frac, dual_frac, trunc)


def effective_sample_fraction(log_w: Tensor) -> float:
    """Kish's effective sample size of importance weights exp(log_w), as a fraction of their count:
    (sum w)^2 / (n sum w^2), in (0, 1]; 1 when every weight is equal (on-policy data). Computed with the weights
    scaled by their maximum, so large log-weights do not overflow."""
    lw = log_w.detach().reshape(-1).to("cpu", torch.float64)  # (one figure per update: the host's float64; MPS has none)
    w = torch.exp(lw - lw.max())
    return float(w.sum() ** 2 / (len(w) * (w * w).sum()))


def gaussian_logp(x: Tensor, mean: Tensor, log_std: Tensor) -> Tensor:
    """Log-density of a diagonal Gaussian, summed over the last (action) dimension."""
    z = (x - mean) * torch.exp(-log_std)
    return (-0.5 * z * z - log_std - HALF_LOG_2PI).sum(-1)


def gaussian_entropy(log_std: Tensor) -> Tensor:
    return (log_std + 0.5 + HALF_LOG_2PI).sum(-1)


def categorical_logp_entropy(logits: Tensor, actions: Tensor, mask: Optional[Tensor] = None):
    """Log-prob of ``actions`` and entropy of the categorical; ``mask`` (bool, as logits): the distribution over the
    legal actions only (the others get the most negative finite logit: probability 0, no NaN in the entropy)."""
    if mask is not None:
        logits = logits.masked_fill(~mask, torch.finfo(logits.dtype).min)
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
    terms = logp_all.exp() * logp_all
    if mask is not None:  # 0 * (most negative) is 0 in float32, but not in every dtype: the illegal terms are 0
        terms = torch.where(mask, terms, torch.zeros_like(terms))
    entropy = -terms.sum(-1)
    return logp, entropy


def approx_kl_k3(logp_new: Tensor, logp_old: Tensor) -> Tensor:
    """Schulman's k3 estimator of KL(old || new) from samples drawn under old: E[(r - 1) - log r].

    Each sample's term is >= 0 in exact arithmetic; in floating point ``exp(log r) - 1 - log r`` can round
    below 0 when r is close to 1 (a lag-0 batch showed -3e-9), so the term is computed with ``expm1`` and
    clamped at 0: the estimate is never negative."""
    log_r = logp_new - logp_old
    return (torch.expm1(log_r) - log_r).clamp_min(0.0).mean()


def explained_variance(pred: Tensor, target: Tensor) -> float:
    var = torch.var(target)
    if var.item() == 0.0:
        return float("nan")
    return float(1.0 - torch.var(target - pred) / var)
