"""Adam, computed as ``torch.optim.Adam`` computes it: with its fused CPU kernel (``fused=True``, the default)
or its multi-tensor ops (``fused=False``, or where the kernel is missing).

Why not ``torch.optim.Adam``: torch.optim imports ``torch._dynamo`` (and sympy with it) the first time an
optimizer is built and at every ``step``: on this 2-core machine that import is a large part of a run's
start-up, and a learner that never compiles anything does not need it. The update (Kingma & Ba 2015,
Algorithm 1, with PyTorch's placement of epsilon) per parameter, at step t:

    m = beta1 m + (1 - beta1) g          v = beta2 v + (1 - beta2) g^2
    p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

:func:`clip_grad_norm` is ``torch.nn.utils.clip_grad_norm_``'s arithmetic, without its per-call overhead.

``state_dict()`` has ``torch.optim.Adam``'s layout, so a checkpoint written with either loads into both.
(No weight decay, amsgrad or maximize: laglab's learner uses none.)"""
from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Sequence

import torch


class Adam:
    def __init__(self, params: Iterable[torch.Tensor], lr: float, eps: float = 1e-8,
                 betas: Sequence[float] = (0.9, 0.999), fused: bool = True):
        self.params: List[torch.Tensor] = list(params)
        if not self.params:
            raise ValueError("Adam: no parameters to optimize")
        if not (lr >= 0 and eps >= 0 and 0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"Adam: invalid lr={lr}, eps={eps} or betas={tuple(betas)}")
        # one group, with the keys torch.optim.Adam's state_dict has (the learner anneals ``lr`` here)
        self.param_groups: List[Dict[str, Any]] = [{
            "lr": float(lr), "betas": (float(betas[0]), float(betas[1])), "eps": float(eps), "weight_decay": 0.0,
            "amsgrad": False, "maximize": False, "foreach": None, "capturable": False, "differentiable": False,
            "fused": None, "decoupled_weight_decay": False, "params": list(range(len(self.params)))}]
        self.steps = [0] * len(self.params)  # per parameter, as torch counts them (a step without a gradient skips)
        # the same, as the kernel reads it (on the parameter's device, as torch.optim.Adam(fused=True) keeps it)
        self.step_t = [torch.zeros((), dtype=torch.float32, device=p.device) for p in self.params]
        self.fused = fused and hasattr(torch, "_fused_adam_") and all(p.dtype in (torch.float32, torch.float64) for p in self.params)
        self.exp_avg = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        lr, (b1, b2), eps = group["lr"], group["betas"], group["eps"]
        live = [i for i, p in enumerate(self.params) if p.grad is not None]
        by_step: Dict[int, List[int]] = {}
        for i in live:  # (one step count for every parameter, unless some once had no gradient)
            self.steps[i] += 1
            by_step.setdefault(self.steps[i], []).append(i)
        for t, idx in by_step.items():
            ps = [self.params[i] for i in idx]
            gs = [self.params[i].grad for i in idx]
            m = [self.exp_avg[i] for i in idx]
            v = [self.exp_avg_sq[i] for i in idx]
            if self.fused:  # one kernel per parameter (torch.optim.Adam(fused=True)'s): a quarter faster on CPU
                steps = [self.step_t[i] for i in idx]
                torch._foreach_add_(steps, 1)
                try:
                    torch._fused_adam_(ps, gs, m, v, [], steps, lr=lr, beta1=b1, beta2=b2, weight_decay=0.0, eps=eps,
                                       amsgrad=False, maximize=False)
                    continue
                except (RuntimeError, NotImplementedError):  # (a dtype or device it has no kernel for; a changed
                    self.fused = False  # signature is a TypeError and fails loudly)
                    torch._foreach_sub_(steps, 1)
            torch._foreach_lerp_(m, gs, 1 - b1)
            torch._foreach_mul_(v, b2)
            torch._foreach_addcmul_(v, gs, gs, 1 - b2)
            denom = torch._foreach_sqrt(v)
            torch._foreach_div_(denom, math.sqrt(1 - b2 ** t))
            torch._foreach_add_(denom, eps)
            torch._foreach_addcdiv_(ps, m, denom, -lr / (1 - b1 ** t))

    def state_dict(self) -> Dict[str, Any]:
        """``torch.optim.Adam``'s layout; ``fused``/``foreach`` say which arithmetic ran, so a torch Adam that
        loads it continues with the same one."""
        state = {i: {"step": torch.tensor(float(self.steps[i])), "exp_avg": self.exp_avg[i].clone(),
                     "exp_avg_sq": self.exp_avg_sq[i].clone()} for i in range(len(self.params)) if self.steps[i]}
        group = dict(self.param_groups[0], params=list(range(len(self.params))), fused=True if self.fused else None,
                     foreach=None if self.fused else True)
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, sd: Dict[str, Any]) -> None:
        """Load a state dict of this class or of ``torch.optim.Adam`` (one group over the same parameters)."""
        groups = sd["param_groups"]
        if len(groups) != 1 or len(groups[0]["params"]) != len(self.params):
            raise ValueError(f"optimizer state has {len(groups)} group(s) over {sum(len(g['params']) for g in groups)} "
                             f"parameters; this model has 1 group over {len(self.params)}")
        g = groups[0]
        if g.get("amsgrad") or g.get("weight_decay") or g.get("maximize"):
            raise ValueError("optimizer state uses amsgrad, weight decay or maximize, which this Adam does not")
        states = sd["state"]
        for pos, key in enumerate(g["params"]):  # everything is checked before anything changes
            st = states.get(key)
            for k in ("exp_avg", "exp_avg_sq"):
                if st is not None and tuple(st[k].shape) != tuple(self.params[pos].shape):
                    raise ValueError(f"optimizer state for parameter {pos} has shape {tuple(st[k].shape)}; "
                                     f"the parameter has {tuple(self.params[pos].shape)}")
        self.param_groups[0].update(lr=float(g["lr"]), betas=tuple(float(b) for b in g["betas"]), eps=float(g["eps"]))
        for pos, key in enumerate(g["params"]):
            st = states.get(key)
            p = self.params[pos]
            if st is None:
                self.steps[pos] = 0
                self.exp_avg[pos] = torch.zeros_like(p)
                self.exp_avg_sq[pos] = torch.zeros_like(p)
            else:
                self.steps[pos] = int(float(st["step"]))
                # (a state saved on another device continues on this parameter's)
                self.exp_avg[pos] = st["exp_avg"].detach().to(p.device, p.dtype).clone()
                self.exp_avg_sq[pos] = st["exp_avg_sq"].detach().to(p.device, p.dtype).clone()
            self.step_t[pos] = torch.tensor(float(self.steps[pos]), dtype=torch.float32, device=p.device)


@torch.no_grad()
def clip_grad_norm(params: Sequence[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale the gradients so that their global L2 norm is at most ``max_norm``; returns the norm before.
    ``torch.nn.utils.clip_grad_norm_``'s arithmetic (same ops, same result bit for bit) without its per-call
    grouping by device and dtype, which cost more than the arithmetic on these small nets."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), device=params[0].device) if params else torch.tensor(0.0)
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
    torch._foreach_mul_(grads, torch.clamp(max_norm / (total + 1e-6), max=1.0))
    return total
