"""laglab.optim.Adam: against the paper's algorithm written out slowly in float64, against torch.optim.Adam
(bit for bit, fused and multi-tensor), state dicts that cross between the two, and a run that never imports
torch._dynamo (the reason the class exists: start-up)."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from laglab.optim import Adam, clip_grad_norm

ROOT = Path(__file__).resolve().parents[1]
SHAPES = [(5, 3), (3,), (1, 7), ()]
LARGE = [(64, 64), (64,), (300, 17), (6,)]  # (on tiny tensors torch's fused and multi-tensor arithmetic agree bit for
# bit; on these they do not, so only the same arithmetic passes the bit-for-bit tests)


def _params(seed=0, shapes=SHAPES):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=torch.float32).requires_grad_() for s in shapes]


def _grads(steps, seed=1, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    return [[rng.normal(0, 1 + k, s).astype(np.float32) for k, s in enumerate(shapes)] for _ in range(steps)]


def _run(opt, params, grads, lrs, skip=()):
    """Step ``opt`` through ``grads``; at step t the lr is lrs[t]; parameters (t, i) in ``skip`` get no gradient."""
    for t, gs in enumerate(grads):
        opt.param_groups[0]["lr"] = lrs[t]
        opt.zero_grad(set_to_none=True)
        for i, (p, g) in enumerate(zip(params, gs)):
            if (t, i) not in skip:
                p.grad = torch.from_numpy(g.copy())
        opt.step()
    return [p.detach().clone() for p in params]


def paper_adam(p0, grads, lrs, eps, b1=0.9, b2=0.999, skip=()):
    """Kingma & Ba (2015), Algorithm 1, one element at a time in float64 (epsilon added to sqrt(v_hat), as in
    the paper's Algorithm 1 and in PyTorch; not the paper's "efficient" reordering with epsilon-hat)."""
    out = []
    for i, p in enumerate(p0):
        theta = p.detach().double().numpy().copy().reshape(-1)
        m, v, t = np.zeros_like(theta), np.zeros_like(theta), 0
        for step, gs in enumerate(grads):
            if (step, i) in skip:
                continue
            t += 1
            g = gs[i].astype(np.float64).reshape(-1)
            for j in range(theta.size):
                m[j] = b1 * m[j] + (1 - b1) * g[j]
                v[j] = b2 * v[j] + (1 - b2) * g[j] * g[j]
                m_hat = m[j] / (1 - b1 ** t)
                v_hat = v[j] / (1 - b2 ** t)
                theta[j] = theta[j] - lrs[step] * m_hat / (np.sqrt(v_hat) + eps)
        out.append(theta.reshape(p.shape))
    return out


@pytest.mark.parametrize("fused", [True, False])
def test_adam_follows_the_papers_algorithm(fused):
    grads = _grads(40)
    lrs = list(np.linspace(3e-3, 1e-4, 40))  # an annealed step size, set through param_groups as the learner does
    skip = {(3, 1), (4, 1), (10, 3)}  # a parameter without a gradient neither moves nor advances its step count
    params = _params()
    ref = paper_adam(params, grads, lrs, eps=1e-5, skip=skip)
    got = _run(Adam(params, lr=lrs[0], eps=1e-5, fused=fused), params, grads, lrs, skip)
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a.double().numpy(), b, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("fused", [True, False])
def test_adam_is_torch_optim_adam_bit_for_bit(fused):
    grads, lrs, skip = _grads(30, shapes=LARGE), [1e-3] * 15 + [5e-4] * 15, {(2, 0), (7, 2)}
    theirs = _params(shapes=LARGE)
    ours = _params(shapes=LARGE)
    kind = {"fused": True} if fused else {"foreach": True}
    a = _run(torch.optim.Adam(theirs, lr=1e-3, eps=1e-5, **kind), theirs, grads, lrs, skip)
    opt = Adam(ours, lr=1e-3, eps=1e-5, fused=fused)
    b = _run(opt, ours, grads, lrs, skip)
    assert opt.fused is fused  # (the kernel ran throughout: no silent fallback)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_the_other_arithmetic_differs_so_the_bit_for_bit_test_can_fail():
    grads, lrs = _grads(10, shapes=LARGE), [1e-3] * 10
    theirs, ours = _params(shapes=LARGE), _params(shapes=LARGE)
    a = _run(torch.optim.Adam(theirs, lr=1e-3, eps=1e-5, foreach=True), theirs, grads, lrs)
    b = _run(Adam(ours, lr=1e-3, eps=1e-5, fused=True), ours, grads, lrs)
    assert not all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("max_norm", [0.5, 1e3])  # (clipping, and a norm below the bound: no change)
def test_clip_grad_norm_is_torchs_bit_for_bit_and_clips_to_the_bound(max_norm):
    ours, theirs = _params(), _params()
    for a, b, g in zip(ours, theirs, _grads(1)[0]):
        a.grad = torch.from_numpy(g.copy())
        b.grad = torch.from_numpy(g.copy())
    before = float(np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in _grads(1)[0])))
    n1 = clip_grad_norm(ours, max_norm)
    n2 = torch.nn.utils.clip_grad_norm_(theirs, max_norm)
    assert torch.equal(n1, n2) and float(n1) == pytest.approx(before, rel=1e-6)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(ours, theirs))
    after = float(np.sqrt(sum(float((a.grad.double() ** 2).sum()) for a in ours)))
    assert after == pytest.approx(min(before, max_norm), rel=1e-5)


def test_state_dicts_cross_between_torch_and_laglab():
    """A checkpoint written with torch.optim.Adam (laglab's earlier learners) resumes in ours, and ours loads in
    torch's: the runs continue exactly as one optimizer would have."""
    grads, lrs = _grads(20, shapes=LARGE), [1e-3] * 20
    one = _params(shapes=LARGE)
    whole = _run(torch.optim.Adam(one, lr=1e-3, eps=1e-5, fused=True), one, grads, lrs)

    first = _params(shapes=LARGE)
    t_opt = torch.optim.Adam(first, lr=1e-3, eps=1e-5, fused=True)
    _run(t_opt, first, grads[:10], lrs[:10])
    ours = Adam(first, lr=0.5, eps=1e-5)  # (lr from the state dict)
    ours.load_state_dict(t_opt.state_dict())
    resumed = _run(ours, first, grads[10:], lrs[10:])
    assert all(torch.equal(x, y) for x, y in zip(whole, resumed))

    back = _params(shapes=LARGE)
    o2 = Adam(back, lr=1e-3, eps=1e-5)
    _run(o2, back, grads[:10], lrs[:10])
    t2 = torch.optim.Adam(back, lr=1e-3, eps=1e-5, fused=True)
    t2.load_state_dict(o2.state_dict())
    assert t2.param_groups[0]["fused"] is True  # (torch adopts the saved group's arithmetic)
    again = _run(t2, back, grads[10:], lrs[10:])
    assert all(torch.equal(x, y) for x, y in zip(whole, again))


def test_a_state_dict_for_another_model_is_refused():
    o = Adam(_params(), lr=1e-3)
    other = Adam([torch.zeros(2, requires_grad=True)], lr=1e-3)
    with pytest.raises(ValueError, match="1 group over 4"):
        o.load_state_dict(other.state_dict())
    p = [torch.zeros(s, requires_grad=True) for s in [(5, 4), (3,), (1, 7), ()]]
    wrong = Adam(p, lr=1e-3)
    for q in p:
        q.grad = torch.ones_like(q)
    wrong.step()
    for q in o.params:
        q.grad = torch.ones_like(q)
    o.step()
    before = (o.param_groups[0]["lr"], list(o.steps), [m.clone() for m in o.exp_avg])
    sd = wrong.state_dict()
    sd["param_groups"][0]["lr"] = 9.0
    with pytest.raises(ValueError, match=r"shape \(5, 4\)"):
        o.load_state_dict(sd)
    assert (o.param_groups[0]["lr"], o.steps) == before[:2]  # refused whole: nothing changed
    assert all(torch.equal(a, b) for a, b in zip(o.exp_avg, before[2]))


def test_a_run_never_imports_torch_dynamo(tmp_path):
    """torch.optim imports torch._dynamo and sympy (a large share of start-up on two cores); the learner does
    not need them, and a change that brings them back fails here."""
    code = ("import sys; sys.argv = ['train.py', 'runner=sync', 'total_env_steps=1024', 'learner.batch_size=512', "
            "'tracking.wandb.mode=disabled', 'hydra.run.dir=' + sys.argv[1]]\n"
            "import runpy\n"
            "try:\n    runpy.run_path('train.py', run_name='__main__')\n"
            "except SystemExit as e:\n    assert not e.code, e.code\n"
            "print('LOADED', sorted(m for m in ('torch._dynamo', 'sympy', 'torch.optim') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("LOADED"))
    assert "torch._dynamo" not in line and "sympy" not in line, line
