"""The math, each against an independent slow reference written from the paper's formula."""
import math

import numpy as np
import pytest
import torch

from laglab import algo

rng = np.random.default_rng(1234)


def _random_rollout(T=7, N=3, p_done=0.25, gamma=0.97):
    rewards = torch.tensor(rng.normal(size=(T, N)), dtype=torch.float64)
    values = torch.tensor(rng.normal(size=(T, N)), dtype=torch.float64)
    bootstrap = torch.tensor(rng.normal(size=N), dtype=torch.float64)
    dones = torch.tensor(rng.random((T, N)) < p_done, dtype=torch.float64)
    discounts = gamma * (1.0 - dones)
    return rewards, values, bootstrap, discounts


def gae_reference(r, v, boot, disc, lam):
    """A_t = sum_{k>=0} (prod_{i<k} lam * disc[t+i]) * delta_{t+k}, written as a double sum."""
    T, N = r.shape
    out = np.zeros((T, N))
    for n in range(N):
        vals = list(v[:, n].tolist()) + [float(boot[n])]
        for t in range(T):
            total, weight = 0.0, 1.0
            for k in range(t, T):
                delta = r[k, n].item() + disc[k, n].item() * vals[k + 1] - vals[k]
                total += weight * delta
                weight *= lam * disc[k, n].item()
            out[t, n] = total
    return out


@pytest.mark.parametrize("lam", [0.0, 0.8, 0.95, 1.0])
def test_gae_matches_double_sum(lam):
    r, v, boot, disc = _random_rollout()
    got = algo.gae(r, v, boot, disc, lam).numpy()
    np.testing.assert_allclose(got, gae_reference(r, v, boot, disc, lam), rtol=1e-10, atol=1e-10)


def test_gae_lambda_one_is_discounted_return_minus_value():
    r, v, boot, disc = _random_rollout(p_done=0.0, gamma=0.9)
    T = r.shape[0]
    ret = np.zeros_like(r.numpy())
    for t in range(T):
        g = sum(0.9 ** (k - t) * r[k].numpy() for k in range(t, T)) + 0.9 ** (T - t) * boot.numpy()
        ret[t] = g
    np.testing.assert_allclose(algo.gae(r, v, boot, disc, 1.0).numpy(), ret - v.numpy(), rtol=1e-10)


def vtrace_reference(b_logp, t_logp, r, v, boot, disc, rho_bar, c_bar, lam):
    """Espeholt et al. (2018) eq. (1), with per-step discounts and lambda in the traces:
    v_s = V(x_s) + sum_{t>=s} (prod_{i=s}^{t-1} disc_i) (prod_{i=s}^{t-1} c_i) delta_t V,
    delta_t V = rho_t (r_t + disc_t V(x_{t+1}) - V(x_t)), rho_t = min(rho_bar, ratio), c_i = lam min(c_bar, ratio)."""
    T, N = r.shape
    ratio = np.exp((t_logp - b_logp).numpy())
    vs = np.zeros((T, N))
    for n in range(N):
        vals = list(v[:, n].tolist()) + [float(boot[n])]
        for s in range(T):
            total = 0.0
            for t in range(s, T):
                coef = 1.0
                for i in range(s, t):
                    coef *= disc[i, n].item() * lam * min(c_bar, ratio[i, n])
                rho_t = min(rho_bar, ratio[t, n])
                total += coef * rho_t * (r[t, n].item() + disc[t, n].item() * vals[t + 1] - vals[t])
            vs[s, n] = vals[s] + total
    next_vs = np.concatenate([vs[1:], boot.numpy()[None]], axis=0)
    adv = r.numpy() + disc.numpy() * next_vs - v.numpy()
    return vs, adv


@pytest.mark.parametrize("rho_bar,c_bar,lam", [(1.0, 1.0, 1.0), (2.0, 0.7, 1.0), (1.5, 1.0, 0.9), (10.0, 10.0, 0.8)])
def test_vtrace_matches_double_sum(rho_bar, c_bar, lam):
    r, v, boot, disc = _random_rollout(T=8, N=4)
    b_logp = torch.tensor(rng.normal(size=r.shape) * 0.6, dtype=torch.float64)
    t_logp = torch.tensor(rng.normal(size=r.shape) * 0.6, dtype=torch.float64)
    ratio = torch.exp(t_logp - b_logp)
    assert (ratio > 1).any() and (ratio < 1).any()  # the test exercises both clipped and unclipped weights
    got = algo.vtrace(b_logp, t_logp, r, v, boot, disc, rho_bar, c_bar, lam)
    vs, adv = vtrace_reference(b_logp, t_logp, r, v, boot, disc, rho_bar, c_bar, lam)
    np.testing.assert_allclose(got.vs.numpy(), vs, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(got.advantages.numpy(), adv, rtol=1e-9, atol=1e-9)


def test_vtrace_on_policy_reduces_to_gae_lambda_one():
    r, v, boot, disc = _random_rollout(T=9, N=3)
    logp = torch.tensor(rng.normal(size=r.shape), dtype=torch.float64)
    got = algo.vtrace(logp, logp, r, v, boot, disc, rho_bar=1.0, c_bar=1.0, lam=1.0)
    gae1 = algo.gae(r, v, boot, disc, 1.0)
    np.testing.assert_allclose(got.vs.numpy(), (gae1 + v).numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got.advantages.numpy(), gae1.numpy(), rtol=1e-10, atol=1e-10)


def test_vtrace_on_policy_with_lambda_gives_gae_lambda_returns():
    r, v, boot, disc = _random_rollout(T=9, N=3)
    logp = torch.zeros(r.shape, dtype=torch.float64)
    got = algo.vtrace(logp, logp, r, v, boot, disc, rho_bar=1.0, c_bar=1.0, lam=0.9)
    np.testing.assert_allclose(got.vs.numpy(), (algo.gae(r, v, boot, disc, 0.9) + v).numpy(), rtol=1e-10)


def _surrogate_reference(logp, old, adv, eps, c=None):
    out, clipped, dual = [], 0, 0
    for lp, lo, a in zip(logp.tolist(), old.tolist(), adv.tolist()):
        r = math.exp(lp - lo)
        obj = min(r * a, min(max(r, 1 - eps), 1 + eps) * a)
        clipped += abs(r - 1) > eps
        if c is not None and a < 0:
            if c * a > obj:
                dual += 1
            obj = max(obj, c * a)
        out.append(obj)
    n = len(out)
    return -sum(out) / n, clipped / n, dual / n


def _loss_inputs(n=200):
    logp = torch.tensor(rng.normal(size=n), dtype=torch.float64)
    old = logp + torch.tensor(rng.normal(size=n) * 1.5, dtype=torch.float64)  # ratios far from 1 both ways
    adv = torch.tensor(rng.normal(size=n) * 2, dtype=torch.float64)
    return logp, old, adv


def test_ppo_clip_loss_matches_reference():
    logp, old, adv = _loss_inputs()
    info = algo.ppo_clip_loss(logp, old, adv, 0.2)
    loss, cf, _ = _surrogate_reference(logp, old, adv, 0.2)
    assert float(info.loss) == pytest.approx(loss, rel=1e-12)
    assert float(info.clip_frac) == pytest.approx(cf)
    assert float(info.dual_clip_frac) == 0.0


@pytest.mark.parametrize("c", [1.5, 3.0])
def test_dual_clip_loss_matches_reference(c):
    logp, old, adv = _loss_inputs()
    info = algo.dual_clip_loss(logp, old, adv, 0.2, c)
    loss, cf, df = _surrogate_reference(logp, old, adv, 0.2, c)
    assert df > 0  # the bound is active somewhere in these inputs
    assert float(info.loss) == pytest.approx(loss, rel=1e-12)
    assert float(info.clip_frac) == pytest.approx(cf)
    assert float(info.dual_clip_frac) == pytest.approx(df)


def test_dual_clip_bounds_negative_advantage_with_huge_ratio():
    # r = e^3 ~ 20, A = -1: clip objective is r*A ~ -20; dual clip caps it at c*A = -3
    info = algo.dual_clip_loss(torch.tensor([3.0]), torch.tensor([0.0]), torch.tensor([-1.0]), 0.2, 3.0)
    assert float(info.loss) == pytest.approx(3.0)
    plain = algo.ppo_clip_loss(torch.tensor([3.0]), torch.tensor([0.0]), torch.tensor([-1.0]), 0.2)
    assert float(plain.loss) == pytest.approx(math.exp(3.0))


def test_gaussian_logp_matches_torch_distributions_and_formula():
    x = torch.tensor(rng.normal(size=(50, 3)), dtype=torch.float64)
    mean = torch.tensor(rng.normal(size=(50, 3)), dtype=torch.float64)
    log_std = torch.tensor(rng.uniform(-2, 1, size=(50, 3)), dtype=torch.float64)
    got = algo.gaussian_logp(x, mean, log_std)
    ref = torch.distributions.Normal(mean, log_std.exp()).log_prob(x).sum(-1)
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-12)
    s = np.exp(log_std.numpy())
    by_hand = (-((x.numpy() - mean.numpy()) ** 2) / (2 * s**2) - np.log(s * math.sqrt(2 * math.pi))).sum(-1)
    np.testing.assert_allclose(got.numpy(), by_hand, rtol=1e-12)
    ent = algo.gaussian_entropy(log_std)
    np.testing.assert_allclose(ent.numpy(), torch.distributions.Normal(mean, log_std.exp()).entropy().sum(-1).numpy())


def test_k3_estimator_is_unbiased_for_kl():
    p_old = np.array([0.5, 0.3, 0.2])
    p_new = np.array([0.2, 0.5, 0.3])
    kl = float((p_old * np.log(p_old / p_new)).sum())
    # exact expectation under old: weight each action by its probability
    log_r = np.log(p_new / p_old)
    exact_k3 = float((p_old * (np.exp(log_r) - 1 - log_r)).sum())
    assert exact_k3 == pytest.approx(kl, rel=1e-12)
    # and the estimator over samples converges to it
    g = np.random.default_rng(0)
    a = g.choice(3, size=200_000, p=p_old)
    est = float(algo.approx_kl_k3(torch.tensor(np.log(p_new[a])), torch.tensor(np.log(p_old[a]))))
    assert est == pytest.approx(kl, rel=0.02)
    # and is zero for identical policies
    assert float(algo.approx_kl_k3(torch.zeros(5), torch.zeros(5))) == 0.0


def test_k3_is_never_negative_on_float_noise():
    """KL is >= 0; the k3 term (r - 1) - log r is >= 0 per sample in exact arithmetic, but float32 rounding of
    exp(log r) - 1 for r near 1 made the mean of a lag-0 batch -3e-9. The estimator clamps each term at 0."""
    g = torch.Generator().manual_seed(0)
    old = torch.log_softmax(torch.randn(10_000, 2, generator=g), -1)[:, 0]
    new = old + 1e-7 * torch.randn(10_000, generator=g)  # the same policy up to float noise
    assert float(algo.approx_kl_k3(new, old)) >= 0.0
    assert float(algo.approx_kl_k3(new, old)) < 1e-12


@pytest.mark.parametrize("estimator", ["gae", "vtrace"])
def test_a_carry_continues_the_sequence_as_if_it_were_one(estimator):
    """Split a rollout in two: the first half with the second's first-step advantage (GAE) or v - V (V-trace)
    as its carry gives the targets of the unsplit rollout (the references above check the unsplit one)."""
    r, v, boot, disc = _random_rollout(T=10, N=3)
    b_logp = torch.tensor(rng.normal(size=r.shape) * 0.5, dtype=torch.float64)
    t_logp = torch.tensor(rng.normal(size=r.shape) * 0.5, dtype=torch.float64)
    k = 6
    if estimator == "gae":
        whole = algo.gae(r, v, boot, disc, 0.9).numpy()
        tail = algo.gae(r[k:], v[k:], boot, disc[k:], 0.9)
        head = algo.gae(r[:k], v[:k], v[k], disc[:k], 0.9, carry=tail[0]).numpy()
        np.testing.assert_allclose(head, whole[:k], rtol=1e-10, atol=1e-10)
    else:
        whole = algo.vtrace(b_logp, t_logp, r, v, boot, disc, 1.5, 0.8, 0.9)
        tail = algo.vtrace(b_logp[k:], t_logp[k:], r[k:], v[k:], boot, disc[k:], 1.5, 0.8, 0.9)
        head = algo.vtrace(b_logp[:k], t_logp[:k], r[:k], v[:k], v[k], disc[:k], 1.5, 0.8, 0.9,
                           carry=tail.vs[0] - v[k])
        np.testing.assert_allclose(head.vs.numpy(), whole.vs[:k].numpy(), rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(head.advantages.numpy(), whole.advantages[:k].numpy(), rtol=1e-10, atol=1e-10)


def test_categorical_logp_and_entropy_match_torch_distributions():
    logits = torch.tensor(rng.normal(size=(40, 5)) * 2, dtype=torch.float64)
    actions = torch.tensor(rng.integers(0, 5, size=40))
    logp, ent = algo.categorical_logp_entropy(logits, actions)
    ref = torch.distributions.Categorical(logits=logits)
    np.testing.assert_allclose(logp.numpy(), ref.log_prob(actions).numpy(), rtol=1e-12)
    np.testing.assert_allclose(ent.numpy(), ref.entropy().numpy(), rtol=1e-12)


def test_explained_variance_is_one_minus_the_residual_variance_share():
    target = torch.tensor([1.0, 2.0, 4.0, 7.0], dtype=torch.float64)
    pred = torch.tensor([1.5, 2.0, 3.0, 7.5], dtype=torch.float64)
    resid = (target - pred).numpy()
    expected = 1.0 - np.var(resid, ddof=1) / np.var(target.numpy(), ddof=1)  # torch.var is the unbiased one
    assert algo.explained_variance(pred, target) == pytest.approx(expected, rel=1e-12)
    assert algo.explained_variance(target, target) == 1.0
    assert math.isnan(algo.explained_variance(pred, torch.full((4,), 3.0, dtype=torch.float64)))


def test_a_ratio_exactly_on_a_bound_is_not_counted_as_clipped():
    """The clip fractions count samples whose objective the bound changes; at exactly 1 +- eps (or r = c for
    the dual bound) it changes nothing. 1.25, 0.75 and 2.0 are exact in float64 through log and exp."""
    logp = torch.log(torch.tensor([1.25, 0.75, 1.25, 0.75], dtype=torch.float64))
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=torch.float64)
    info = algo.ppo_clip_loss(logp, torch.zeros(4, dtype=torch.float64), adv, 0.25)
    assert float(info.clip_frac) == 0.0
    assert float(info.loss) == pytest.approx(-(1.25 + 0.75 - 1.25 - 0.75) / 4)
    logp = torch.log(torch.tensor([2.0, 2.0], dtype=torch.float64))
    dual = algo.dual_clip_loss(logp, torch.zeros(2, dtype=torch.float64), torch.tensor([-1.0, -3.0],
                               dtype=torch.float64), 0.2, 2.0)
    assert float(dual.dual_clip_frac) == 0.0  # r A = c A: the dual bound is reached, not active
    assert float(dual.clip_frac) == 1.0 and float(dual.loss) == pytest.approx((2.0 + 6.0) / 2)


def _decoupled_reference(logp, prox, beh, adv, eps, cap, c=None):
    """Hilton et al. 2022 eq. 2, sample by sample, with the weight truncated: the objective of one sample is
    min(pi/mu * A, clip(pi/prox, 1-eps, 1+eps) * prox/mu * A) with prox/mu replaced by min(prox/mu, cap) in both
    terms (pi/mu = pi/prox * prox/mu), and dual-clip's bound c * A * w for A < 0."""
    out, clipped, trunc = [], 0, 0
    for lp, lx, lb, a in zip(logp.tolist(), prox.tolist(), beh.tolist(), adv.tolist()):
        w = math.exp(lx - lb)
        trunc += w > cap
        w = min(w, cap)
        r = math.exp(lp - lx)
        obj = min(r * w * a, min(max(r, 1 - eps), 1 + eps) * w * a)
        clipped += abs(r - 1) > eps
        if c is not None and a < 0:
            obj = max(obj, c * w * a)
        out.append(obj)
    n = len(out)
    return -sum(out) / n, clipped / n, trunc / n


@pytest.mark.parametrize("cap,c", [(1e9, None), (1.5, None), (2.0, 3.0)])
def test_decoupled_loss_matches_the_papers_objective(cap, c):
    logp, prox, adv = _loss_inputs()
    beh = prox + torch.tensor(rng.normal(size=len(prox)) * 1.0, dtype=torch.float64)  # a stale behavior policy
    info = algo.decoupled_loss(logp, prox, beh, adv, 0.2, cap, c)
    loss, cf, tf = _decoupled_reference(logp, prox, beh, adv, 0.2, cap, c)
    assert float(info.loss) == pytest.approx(loss, rel=1e-12)
    assert float(info.clip_frac) == pytest.approx(cf)
    assert float(info.is_trunc_frac) == pytest.approx(tf)
    assert (tf > 0) == (cap < 1e9)  # the truncation is exercised where it is set


def test_decoupled_loss_on_fresh_data_is_exactly_ppo():
    """The on-policy limit: the proximal policy is the behavior policy, the weight is exactly 1."""
    logp, old, adv = _loss_inputs()
    assert torch.equal(algo.decoupled_loss(logp, old, old, adv, 0.2, 5.0).loss, algo.ppo_clip_loss(logp, old, adv, 0.2).loss)
    assert torch.equal(algo.decoupled_loss(logp, old, old, adv, 0.2, 5.0, 3.0).loss,
                       algo.dual_clip_loss(logp, old, adv, 0.2, 3.0).loss)
    at_cap = algo.decoupled_loss(logp, old, old, adv, 0.2, 1.0)  # every weight exactly at the cap: none truncated
    assert float(at_cap.is_trunc_frac) == 0.0 and torch.equal(at_cap.loss, algo.ppo_clip_loss(logp, old, adv, 0.2).loss)


def test_decoupled_gradient_is_the_weighted_ratio_gradient_inside_the_clip_and_zero_outside():
    """d/d logp of -w * min(r A, clip(r) A) / n is -w r A / n where the unclipped term is the minimum, 0 where the
    clipped one is (written from the definition, not through autograd); no gradient reaches the weight."""
    logp, prox, adv = _loss_inputs()
    beh = prox + torch.tensor(rng.normal(size=len(prox)), dtype=torch.float64)
    x = logp.clone().requires_grad_(True)
    algo.decoupled_loss(x, prox, beh, adv, 0.2, 2.0).loss.backward()
    n = len(logp)
    want = []
    for lp, lx, lb, a in zip(logp.tolist(), prox.tolist(), beh.tolist(), adv.tolist()):
        r, w = math.exp(lp - lx), min(math.exp(lx - lb), 2.0)
        active = (a >= 0 and r < 1.2) or (a < 0 and r > 0.8)  # where r A <= clip(r) A and r is not clamped
        want.append(-w * r * a / n if active else 0.0)
    np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-10, atol=1e-15)


def test_effective_sample_fraction_is_kish_and_survives_huge_weights():
    lw = torch.tensor(rng.normal(size=300) * 2, dtype=torch.float64)
    w = np.exp(lw.numpy())
    assert algo.effective_sample_fraction(lw) == pytest.approx(w.sum() ** 2 / (len(w) * (w ** 2).sum()), rel=1e-10)
    assert algo.effective_sample_fraction(torch.zeros(50)) == pytest.approx(1.0)
    one = torch.full((10,), -1000.0)
    one[3] = 1000.0  # exp overflows in float64 unscaled
    assert algo.effective_sample_fraction(one) == pytest.approx(0.1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_host_scan_is_the_torch_loop_bit_for_bit(dtype):
    # GAE and V-trace's backward recursion runs as a numpy loop on the host (cheaper per step); tensors that need
    # gradients take the torch loop: the two give the same floats, so a learner's targets do not depend on which
    g = torch.Generator().manual_seed(3)
    T, N = 37, 11
    deltas = torch.randn(T, N, generator=g, dtype=dtype)
    coef = torch.rand(T, N, generator=g, dtype=dtype) * 0.99
    last = torch.randn(N, generator=g, dtype=dtype)
    host = algo.backward_scan(deltas, coef, last)
    loop = algo.backward_scan(deltas.clone().requires_grad_(), coef, last).detach()
    assert host.dtype == dtype and torch.equal(host, loop)
    ref = torch.zeros(T, N, dtype=torch.float64)  # and both are the recursion, written the slow way
    nxt = last.double()
    for t in reversed(range(T)):
        nxt = deltas[t].double() + coef[t].double() * nxt
        ref[t] = nxt
    assert torch.allclose(host.double(), ref, rtol=1e-5, atol=1e-5)
