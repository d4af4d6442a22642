"""laglab.npstep: the numpy minibatch step computes what torch's autograd computes from laglab.algo's losses — the
gradient of every parameter, loss by loss and head by head — and what laglab.optim's Adam and clip_grad_norm do
with it; a learner on either backend ends an update with the same weights."""
from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from laglab import algo
from laglab.config import ConfigError
from laglab.envs import EnvSpec
from laglab.inference import LOG_STD_MAX
from laglab.npstep import NumpyStep, supported
from laglab.optim import Adam, clip_grad_norm
from laglab.policy import ActorCritic, RecurrentActorCritic

N = 48


def loss_cfg(**kw):
    base = dict(kind="clip", clip_eps=0.2, dual_clip_c=3.0, is_cap=2.0, vf_coef=0.5, ent_coef=0.0,
                max_grad_norm=0.5, norm_adv=True)
    base.update(kw)
    return SimpleNamespace(**base)


def make(discrete: bool, activation: str = "tanh", seed: int = 0, masked: bool = False):
    torch.manual_seed(seed)
    spec = EnvSpec(obs_shape=(5,), discrete=discrete, n_actions=4 if discrete else 3, masked=masked)
    model = ActorCritic(spec, (16, 8), activation, log_std_init=-0.3)
    return model


def sample(out, discrete: bool, masked: bool, g):
    """(actions drawn from the head's output ``out`` [n, A], the legal-action masks or None): 4 categorical actions,
    masked ones with at least one legal action per row, or a Gaussian around ``out``."""
    n, mask = len(out), None
    if not discrete:
        return out + torch.randn(n, 3, generator=g) * 0.7, None
    if masked:
        mask = torch.rand(n, 4, generator=g) < 0.6
        mask[torch.arange(n), torch.randint(0, 4, (n,), generator=g)] = True
        out = out.masked_fill(~mask, -1e9)
    return torch.multinomial(torch.softmax(out, -1), 1, generator=g)[:, 0], mask


def rows(model, seed: int, masked: bool, stale: float):
    """A minibatch: obs, actions drawn from the policy, masks, advantages, returns, and behavior / start /
    proximal log-probs (``stale`` moves the behavior policy's log-probs away from the current ones)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, 5, generator=g)
    with torch.no_grad():
        a, mask = sample(model.pi(x), model.discrete, masked, g)
        logp = model.logp_entropy(x, a, mask)[0]
    adv = torch.randn(N, generator=g) * 2.0
    ret = torch.randn(N, generator=g)
    old = logp + stale * torch.randn(N, generator=g)
    start = logp.clone()  # the update's start: r = 1 exactly for the on-policy case (every clip/min is a tie)
    if stale:  # (later in an update: the policy has moved from its start, so approx_kl is not 0)
        start = logp + 0.1 * stale * torch.randn(N, generator=g)
    prox = logp + 0.5 * stale * torch.randn(N, generator=g)
    return x, a, mask, adv, ret, old, start, prox


def torch_grads(model, data, lc, kind: str):
    """The torch path's loss (as Learner._torch_steps computes it) and its autograd gradients."""
    x, a, mask, adv, ret, old, start, prox = data
    logp, ent = model.logp_entropy(x, a, mask)
    v = model.value(x)
    ad = (adv - adv.mean()) / (adv.std() + 1e-8) if lc.norm_adv else adv
    dual_c = lc.dual_clip_c if kind.endswith("dual_clip") else None
    if kind.startswith("decoupled"):
        info = algo.decoupled_loss(logp, prox, old, ad, lc.clip_eps, lc.is_cap, dual_c)
    elif dual_c is not None:
        info = algo.dual_clip_loss(logp, old, ad, lc.clip_eps, dual_c)
    else:
        info = algo.ppo_clip_loss(logp, old, ad, lc.clip_eps)
    v_loss = 0.5 * ((v - ret) ** 2).mean()
    loss = info.loss - lc.ent_coef * ent.mean() + lc.vf_coef * v_loss
    model.zero_grad(set_to_none=True)
    loss.backward()
    return info, [p.grad.clone() for p in model.parameters()]


def torch_figures(model, data, lc, info):
    """The figures Learner._torch_steps reports for this minibatch."""
    x, a, mask, adv, ret, old, start, prox = data
    with torch.no_grad():
        logp, ent = model.logp_entropy(x, a, mask)
        out = {"policy_loss": float(info.loss.detach()), "clip_frac": float(info.clip_frac),
               "dual_clip_frac": float(info.dual_clip_frac),
               "value_loss": float(0.5 * ((model.value(x) - ret) ** 2).mean()), "entropy": float(ent.mean()),
               "approx_kl": float(algo.approx_kl_k3(logp, start))}
    if info.is_trunc_frac is not None:
        out["is_trunc_frac"] = float(info.is_trunc_frac)
    return out


def np_grads(model, data, lc, kind: str):
    x, a, mask, adv, ret, old, start, prox = data
    step = NumpyStep(model, Adam(list(model.parameters()), lr=1e-3), "tanh" if model.pi[1].__class__.__name__ ==
                     "Tanh" else model.pi[1].__class__.__name__.lower())
    step.load()
    figures = step.gradient(x.numpy(), a.numpy(), None if mask is None else mask.numpy(), adv.numpy(), ret.numpy(),
                            old.numpy(), start.numpy(), lc, kind, prox.numpy() if kind.startswith("decoupled") else None)
    return figures, [torch.from_numpy(v.copy()) for v in step.G.views]


def assert_close(got, want, what):
    for i, (g, w) in enumerate(zip(got, want)):
        scale = float(w.abs().max()) + 1e-6
        err = float((g - w).abs().max())
        assert err <= 2e-5 * scale + 1e-7, f"{what}: parameter {i} {tuple(w.shape)} differs by {err:.3g} (max {scale:.3g})"


KINDS = ["clip", "dual_clip", "decoupled", "decoupled_dual_clip"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("discrete,masked", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("stale", [0.0, 1.5])
def test_gradients_match_autograd(kind, discrete, masked, stale):
    model = make(discrete, masked=masked)
    lc = loss_cfg(kind=kind, ent_coef=0.01)
    data = rows(model, 1, masked, stale)
    info, want = torch_grads(model, data, lc, kind)
    figures, got = np_grads(model, data, lc, kind)
    assert_close(got, want, f"{kind} discrete={discrete} masked={masked} stale={stale}")
    want_figures = torch_figures(model, data, lc, info)
    assert set(figures) == set(want_figures)
    for k, w in want_figures.items():  # every figure the learner reports, as the torch step computes it
        assert math.isclose(figures[k], w, rel_tol=1e-4, abs_tol=1e-6), (k, figures[k], w)
    if stale and kind == "dual_clip":  # (the case exercises the bound)
        assert figures["dual_clip_frac"] > 0
    if stale:
        assert figures["clip_frac"] > 0


@pytest.mark.parametrize("activation", ["tanh", "relu", "elu"])
@pytest.mark.parametrize("discrete", [False, True])
def test_activations_and_options(activation, discrete):
    model = make(discrete, activation, seed=3)
    lc = loss_cfg(ent_coef=0.05, norm_adv=False, vf_coef=0.7)
    data = rows(model, 4, False, 0.4)
    _, want = torch_grads(model, data, lc, "clip")
    _, got = np_grads(model, data, lc, "clip")
    assert_close(got, want, f"{activation} discrete={discrete}")


def test_clamped_log_std_gets_no_gradient():
    model = make(False)
    with torch.no_grad():
        model.log_std[0] = LOG_STD_MAX + 1.0  # outside the clamp: no gradient, as torch.clamp's
        model.log_std[1] = LOG_STD_MAX  # on the bound: gradient, as torch.clamp's
    lc = loss_cfg(ent_coef=0.1)
    data = rows(model, 2, False, 0.3)
    _, want = torch_grads(model, data, lc, "clip")
    _, got = np_grads(model, data, lc, "clip")
    i = [n for n, _ in model.named_parameters()].index("log_std")
    assert float(want[i][0]) == 0.0 and float(want[i][1]) != 0.0
    assert_close(got, want, "log_std at its clamp")


def both_step(grads, twin, opt_t, step):
    """The same gradients through clip_grad_norm + laglab.optim.Adam (``twin``) and NumpyStep.apply (``step``)."""
    for p, gr in zip(twin.parameters(), grads):
        p.grad = gr.clone()
    clip_grad_norm(list(twin.parameters()), 0.5)
    opt_t.step()
    for v, gr in zip(step.G.views, grads):
        v[...] = gr.numpy()
    group = opt_t.param_groups[0]
    step.apply(0.5, group["lr"], group["betas"], group["eps"])


def test_clip_and_adam_match_laglab_optim():
    """Three steps from the same gradients: clip_grad_norm + laglab.optim.Adam on torch tensors vs NumpyStep.apply."""
    model = make(False)
    twin = make(False)
    twin.load_state_dict(model.state_dict())
    opt_t = Adam(list(twin.parameters()), lr=3e-3, eps=1e-5)
    step = NumpyStep(model, Adam(list(model.parameters()), lr=3e-3, eps=1e-5), "tanh")
    step.load()
    g = torch.Generator().manual_seed(5)
    for k in range(3):
        both_step([torch.randn(p.shape, generator=g) * (10.0 if k == 1 else 0.01) for p in twin.parameters()],
                  twin, opt_t, step)
    step.store()
    assert_close([p.detach() for p in model.parameters()], [p.detach() for p in twin.parameters()], "weights")
    assert_close(step.opt.exp_avg_sq, opt_t.exp_avg_sq, "Adam's second moments")
    assert step.opt.steps == opt_t.steps == [3] * len(opt_t.steps)
    assert float(step.opt.step_t[0]) == 3.0


def make_recurrent(kind: str, discrete: bool, masked: bool = False, seed: int = 0, scale: float = 0.3):
    """A small recurrent policy with its weights moved off their init (non-zero biases: a misplaced term shows)."""
    torch.manual_seed(seed)
    spec = EnvSpec(obs_shape=(5,), discrete=discrete, n_actions=4 if discrete else 3, masked=masked)
    model = RecurrentActorCritic(spec, (16, 12), "tanh", -0.3, kind, 8)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn_like(p))
    return model


def sequences(model, seed: int, masked: bool, stale: float, burn_in: int, T: int = 12, n: int = 5):
    """A recurrent minibatch as the learner builds one: ``n`` sequences of ``T`` steps with episode ends, their initial
    states, the steps the loss keeps (burn-in: columns 0 and 2 are cut at ``burn_in``; column 1 leaves out the steps
    through an episode end within its burn-in, uncut, as :meth:`Learner._burn_in` does) and the kept rows' data."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(T, n, 5, generator=g)
    dones = torch.rand(T, n, generator=g) < 0.2
    dones[T - 1, 3] = True  # (an episode end at the last step)
    init = 0.5 * torch.randn((n,) + model.state_shape, generator=g)
    keep = torch.ones(T, n, dtype=torch.bool)
    cut = torch.zeros(n, dtype=torch.bool)
    if burn_in:
        cut[[0, 2]] = True
        dones[:burn_in, [0, 2]] = False
        dones[:burn_in, 1] = False
        dones[1, 1] = True
        keep[:burn_in, [0, 2]] = False
        keep[:2, 1] = False
    with torch.no_grad():
        h = model.outputs(obs, init, dones, burn_in, cut)[keep]
        k = len(h)
        a, mask = sample(model.pi_head(h), model.discrete, masked, g)
        logp = model.logp_entropy_of(h, a, mask)[0]
    adv, ret = torch.randn(k, generator=g) * 2.0, torch.randn(k, generator=g)
    old = logp + stale * torch.randn(k, generator=g)
    start = logp + 0.1 * stale * torch.randn(k, generator=g) if stale else logp.clone()
    return obs, init, dones, keep, cut, a, mask, adv, ret, old, start


def recurrent_torch_grads(model, data, burn_in, lc, kind):
    """The torch path's recurrent minibatch loss (outputs -> heads -> loss, as Learner._minibatches and _torch_steps
    compute it) and its autograd gradients."""
    obs, init, dones, keep, cut, a, mask, adv, ret, old, start = data
    h = model.outputs(obs, init, dones, burn_in, cut)[keep]
    logp, ent = model.logp_entropy_of(h, a, mask)
    v = model.value_of(h)
    ad = (adv - adv.mean()) / (adv.std() + 1e-8) if lc.norm_adv and len(adv) > 1 else adv
    dual_c = lc.dual_clip_c if kind.endswith("dual_clip") else None
    if kind.startswith("decoupled"):
        info = algo.decoupled_loss(logp, start, old, ad, lc.clip_eps, lc.is_cap, dual_c)
    elif dual_c is not None:
        info = algo.dual_clip_loss(logp, old, ad, lc.clip_eps, dual_c)
    else:
        info = algo.ppo_clip_loss(logp, old, ad, lc.clip_eps)
    loss = info.loss - lc.ent_coef * ent.mean() + lc.vf_coef * 0.5 * ((v - ret) ** 2).mean()
    model.zero_grad(set_to_none=True)
    loss.backward()
    return float(info.loss.detach()), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("core", ["gru", "lstm"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("discrete,masked", [(False, False), (True, True)])
@pytest.mark.parametrize("burn_in", [0, 4, 11])  # (11: the last of 12 steps)
def test_recurrent_gradients_match_autograd_through_the_unroll(core, kind, discrete, masked, burn_in):
    """The recurrent step (numpy encoder and heads; a GRU core in numpy, an LSTM's in torch's fused kernel with its
    sequences as lanes with reset steps) against autograd through RecurrentActorCritic.outputs (itself checked against a step-by-step
    reference in test_recurrent_policy): every parameter's gradient, with episode ends, burn-in cuts and masks."""
    model = make_recurrent(core, discrete, masked)
    lc = loss_cfg(kind=kind, ent_coef=0.01)
    data = sequences(model, 1, masked, 1.0, burn_in)
    assert data[2].sum() >= (5 if burn_in < 11 else 3)  # (episode ends inside the sequences: resets are exercised)
    pl, want = recurrent_torch_grads(model, data, burn_in, lc, kind)
    step = NumpyStep(model, Adam(list(model.parameters()), lr=1e-3), "tanh")
    step.load()
    obs, init, dones, keep, cut, a, mask, adv, ret, old, start = (None if t is None else t.numpy() for t in data)
    figures = step.recurrent_gradient(obs, init, dones, keep, cut, burn_in, a, mask, adv, ret, old, start, lc, kind)
    assert_close([torch.from_numpy(v.copy()) for v in step.G.views], want, f"{core} {kind} burn_in={burn_in}")
    assert math.isclose(figures["policy_loss"], pl, rel_tol=1e-4, abs_tol=1e-6)
    assert figures["clip_frac"] > 0 or burn_in == 11  # (the clip is exercised; at 11 only a few rows are kept)


def gru_reference(x, h0, dones, cut, cut_at, dout, cell):
    """torch's GRUCell stepped one step at a time in float64 with autograd: the state zeroed after each episode end,
    and for the ``cut`` sequences taken as a constant at step ``cut_at`` (detached). Returns (outputs, dx, and the
    cell's parameter gradients in nn.GRU's order)."""
    x = torch.from_numpy(x.astype(np.float64)).requires_grad_()
    h = torch.from_numpy(h0.astype(np.float64))
    outs = []
    for t in range(x.shape[0]):
        if cut is not None and t == cut_at and cut.any():
            h = torch.where(torch.from_numpy(cut).view(-1, 1), h.detach(), h)
        h = cell(x[t], h)
        outs.append(h)
        h = h * torch.from_numpy((~dones[t]).astype(np.float64)).view(-1, 1)
    out = torch.stack(outs)
    (out * torch.from_numpy(dout.astype(np.float64))).sum().backward()
    return out.detach().numpy(), x.grad.numpy(), [p.grad.numpy() for p in cell.parameters()]


@pytest.mark.parametrize("T,n,cut_at,cut_cols,scale", [
    (9, 4, 0, [], 1.0),  # no burn-in
    (9, 4, 3, [0, 2], 1.0),
    (9, 4, 8, [1, 3], 1.0),  # cut at the last step (burn_in = rollout_len - 1)
    (9, 4, 1, [0, 1, 2, 3], 1.0),
    (1, 3, 0, [], 1.0),  # one step
    (7, 1, 2, [0], 1.0),  # one sequence
    (9, 4, 3, [0], 8.0),  # gate pre-activations in the tens
])
def test_the_numpy_gru_matches_a_step_by_step_autograd_reference(T, n, cut_at, cut_cols, scale):
    """gru_forward / gru_backward against torch's GRUCell stepped by hand (float64 autograd): the outputs, dL/dx and
    every weight's gradient, with episode ends at the first step, mid-sequence, just before ``cut_at`` in a column that
    is not cut and at the last step, and the burn-in cut anywhere from step 1 to the last."""
    from laglab.npstep import gru_backward, gru_forward

    E, H = 5, 6
    rng = np.random.default_rng(T * 100 + n * 10 + cut_at)
    torch.manual_seed(T + n + cut_at)
    cell = torch.nn.GRUCell(E, H).double()
    with torch.no_grad():
        for p in cell.parameters():
            p.mul_(scale).add_(0.2 * torch.randn_like(p))
    x = rng.standard_normal((T, n, E)).astype(np.float32)
    h0 = (0.7 * rng.standard_normal((n, H))).astype(np.float32)
    dout = rng.standard_normal((T, n, H)).astype(np.float32)
    cut = np.zeros(n, bool)
    cut[cut_cols] = True
    dones = rng.random((T, n)) < 0.25
    dones[0, -1] = True  # (an episode end at the first step)
    dones[T - 1, 0] = True
    if cut.any():
        dones[:cut_at, cut] = False  # (a cut sequence has no episode end in its burn-in, as Learner._burn_in builds)
        if not cut.all() and cut_at > 0:
            dones[cut_at - 1, np.flatnonzero(~cut)[0]] = True
    want_out, want_dx, want_w = gru_reference(x, h0, dones, cut if cut.any() else None, cut_at, dout, cell)
    w = [p.detach().float().numpy() for p in cell.parameters()]  # (weight_ih, weight_hh, bias_ih, bias_hh)
    out, tape = gru_forward(x, h0, (~dones).astype(np.float32), *w)
    dx, *grads = gru_backward(tape, dout, cut if cut.any() else None, cut_at)
    tol = dict(rtol=1e-4, atol=1e-5 * scale)
    np.testing.assert_allclose(out, want_out, **tol)
    np.testing.assert_allclose(dx.reshape(T, n, E), want_dx, **tol)
    for name, g, want in zip(("weight_ih", "weight_hh", "bias_ih", "bias_hh"), grads, want_w):
        np.testing.assert_allclose(g, want, err_msg=name, **tol)


def test_an_lstm_reset_step_zeroes_the_state_exactly_however_large_the_weights():
    """The reset input (RESET_WEIGHT) must dominate every other pre-activation: with the core's weights scaled up 30x
    (gate pre-activations past 50) the lanes' gradients still equal autograd's through separate pieces."""
    model = make_recurrent("lstm", True, seed=2)
    with torch.no_grad():
        for p in model.core.parameters():
            p.mul_(30.0)
    lc = loss_cfg(kind="clip")
    data = sequences(model, 3, False, 0.5, 0)
    with torch.no_grad():
        pre = model.enc(data[0].reshape(-1, 5)) @ model.core.weight_ih_l0.T + model.core.bias_ih_l0
    assert float(pre.abs().max()) > 50
    _, want = recurrent_torch_grads(model, data, 0, lc, "clip")
    step = NumpyStep(model, Adam(list(model.parameters()), lr=1e-3), "tanh")
    step.load()
    obs, init, dones, keep, cut, a, mask, adv, ret, old, start = (None if t is None else t.numpy() for t in data)
    step.recurrent_gradient(obs, init, dones, keep, cut, 0, a, mask, adv, ret, old, start, lc, "clip")
    assert_close([torch.from_numpy(v.copy()) for v in step.G.views], want, "large weights")


def test_after_an_lstm_reset_step_the_state_is_exactly_zero_at_pre_activations_near_1e3():
    """The state after a reset step is bit for bit zero, and the steps after it are bit for bit those of a sequence
    started from zero — with gate pre-activations near 1e3 (a reset weight of -100 would leave it non-zero)."""
    from laglab.npstep import RESET_WEIGHT

    torch.manual_seed(4)
    E, H = 6, 8
    core = torch.nn.LSTM(E + 1, H)
    with torch.no_grad():
        core.weight_ih_l0.mul_(600.0)
        core.weight_hh_l0.mul_(600.0)
        core.weight_ih_l0[:, E] = 0.0
        core.weight_ih_l0[:2 * H, E] = RESET_WEIGHT
    x = torch.randn(7, 3, E + 1)
    x[:, :, E] = 0.0
    x[3] = 0.0
    x[3, :, E] = 1.0  # step 3: a reset
    with torch.no_grad():
        pre = x[:3, :, :E] @ core.weight_ih_l0[:, :E].T + core.bias_ih_l0
        assert float(pre.abs().max()) > 500
        h0 = (3.0 * torch.randn(1, 3, H), 3.0 * torch.randn(1, 3, H))
        out, _ = core(x, h0)
        _, (h3, c3) = core(x[:4], h0)
        fresh, _ = core(x[4:], (torch.zeros(1, 3, H), torch.zeros(1, 3, H)))
    assert torch.equal(h3, torch.zeros_like(h3)) and torch.equal(c3, torch.zeros_like(c3))
    assert torch.equal(out[4:], fresh)


def test_lanes_lay_each_sequence_out_with_a_reset_step_after_each_episode_end():
    from laglab.npstep import lanes

    dones = np.zeros((6, 3), bool)
    dones[1, 0] = dones[3, 0] = True  # sequence 0: ends at steps 1 and 3 -> resets at lane positions 2 and 5
    dones[5, 1] = True  # sequence 1: an end at the last step needs no reset
    dones[0, 2] = True  # sequence 2 starts at step 2 (burn-in cut): an end before its start is not laid out
    live, lane, (r_lane, r_col), L = lanes(dones, np.array([0, 0, 2]))
    np.testing.assert_array_equal(lane[:, 0], [0, 1, 3, 4, 6, 7])
    np.testing.assert_array_equal(lane[:, 1], [0, 1, 2, 3, 4, 5])
    np.testing.assert_array_equal(live[:, 2], [False, False, True, True, True, True])
    np.testing.assert_array_equal(lane[2:, 2], [0, 1, 2, 3])
    assert sorted(zip(r_col.tolist(), r_lane.tolist())) == [(0, 2), (0, 5)] and L == 8


def test_supported_names_what_it_cannot_run():
    spec = EnvSpec(obs_shape=(4,), discrete=True, n_actions=2)
    assert supported(ActorCritic(spec), torch.device("cpu"), "tanh") is None
    assert supported(RecurrentActorCritic(spec), torch.device("cpu"), "tanh") is None
    assert "ewma" in supported(RecurrentActorCritic(spec), torch.device("cpu"), "tanh", ewma=True)
    assert supported(ActorCritic(spec), torch.device("cpu"), "tanh", ewma=True) is None
    assert "cuda" in supported(ActorCritic(spec), torch.device("cuda"), "tanh")
    assert "activation" in supported(ActorCritic(spec), torch.device("cpu"), "gelu")


def _learner(overrides, device: str = "cpu"):
    from laglab.checks import env_spec
    from laglab.learner import Learner
    from laglab.preflight import compose

    cfg = compose(overrides + ["tracking.wandb.mode=disabled", f"learner.device={device}"])
    return cfg, Learner(cfg, env_spec(cfg))


def _frags(cfg, learner, n, skip: int = 0):
    """``n`` fragments of one actor, after its first ``skip``."""
    from laglab.actor import Actor

    actor = Actor(cfg, 0, 1)
    actor.load(learner.snapshot())
    frags = []
    while len(frags) < n + skip:
        frags += actor.collect().fragments
    actor.close()
    return frags[skip:skip + n]


@pytest.mark.parametrize("overrides", [
    ["env=cartpole", "learner.batch_size=256", "actor.rollout_len=32", "actor.envs_per_actor=8"],
    ["env=pendulum", "algo=decoupled_ewma", "learner.batch_size=256", "actor.rollout_len=32",
     "actor.envs_per_actor=8", "learner.epochs=2"],
    # recurrent: chains of fragments (4 per env), truncations (21-step episodes), burn-in of the heads (the first
    # rollout skipped: they start mid-episode)
    *([f"policy.recurrent={core}", "policy.hidden=16", "env=cartpole_pomdp", "env.max_episode_steps=21",
       "learner.batch_size=256", "actor.rollout_len=16", "actor.envs_per_actor=4", "learner.minibatches=2",
       "learner.burn_in=4", *extra] for core, extra in (("lstm", []), ("gru", ["algo=vtrace"]),
                                                        ("lstm", ["algo=decoupled"]))),
    ["policy.recurrent=lstm", "policy.hidden=16", "env=pendulum", "learner.batch_size=256", "actor.rollout_len=32",
     "actor.envs_per_actor=8", "learner.minibatches=4", "learner.epochs=2"],
    # masks: in the targets pass's log-probs and in every step
    *([f"policy.recurrent={core}", "policy.hidden=16", "env=masked_pick", "learner.batch_size=256",
       "actor.rollout_len=16", "actor.envs_per_actor=4", "learner.minibatches=2", *extra]
      for core, extra in (("lstm", []), ("gru", ["algo=vtrace"]))),
])
def test_a_learner_ends_an_update_with_the_same_weights_on_either_backend(overrides):
    cfg, ref = _learner(overrides + ["learner.backend=torch"])
    recurrent = cfg.policy.recurrent != "none"
    frags = _frags(cfg, ref, cfg.learner.batch_size // cfg.actor.rollout_len, skip=4 if recurrent else 0)
    if recurrent:  # the cases are hit: joined chains, truncations, burn-in
        from laglab.fragment import successors

        if cfg.env.id == "laglab/CartPolePOMDP-v0":
            assert (successors(frags) >= 0).any() and sum(int(f.truncated.sum()) for f in frags)
        if cfg.env.id == "laglab/MaskedPick-v0":
            assert frags[0].masks is not None and not frags[0].masks.all()
    _, fast = _learner(overrides + ["learner.backend=numpy"])
    fast.model.load_state_dict(ref.model.state_dict())
    if ref.prox_model is not None:
        fast.prox_model.load_state_dict(ref.prox_model.state_dict())
    assert (ref.backend, fast.backend) == ("torch", "numpy")
    for _ in range(2):
        m_ref, m_fast = ref.update(frags), fast.update(frags)
        for k in ("losses/policy_loss", "losses/value_loss", "losses/approx_kl", "losses/clip_frac"):
            assert m_fast[k] == pytest.approx(m_ref[k], rel=1e-3, abs=1e-6), k
    assert_close([p.detach() for p in fast.model.parameters()], [p.detach() for p in ref.model.parameters()],
                 "weights after two updates")
    if ref.prox_model is not None:
        assert_close(list(fast.prox_model.parameters()), list(ref.prox_model.parameters()), "the EWMA policy")
    assert fast.opt.steps == ref.opt.steps
    assert fast.opt.state_dict()["state"][0]["step"] == ref.opt.state_dict()["state"][0]["step"]


def test_backend_choice_and_refusals():
    _, learner = _learner(["env=cartpole"])
    assert learner.backend == "numpy"  # auto, feed-forward on the CPU
    _, learner = _learner(["env=cartpole_pomdp", "policy.recurrent=gru"])
    assert learner.backend == "numpy"
    _, learner = _learner(["env=cartpole_pomdp", "policy.recurrent=lstm", "algo=decoupled_ewma"])
    assert learner.backend == "torch"  # (the EWMA policy's unroll is torch's)
    _, learner = _learner(["env=cartpole", "runner.torch_threads=2"])  # (threads: torch's; numpy's step uses one)
    assert learner.backend == "torch"
    _, learner = _learner(["env=cartpole", "runner.torch_threads=2", "learner.backend=numpy"])
    assert learner.backend == "numpy"
    with pytest.raises(ConfigError, match="learner.backend"):
        _learner(["env=cartpole_pomdp", "policy.recurrent=gru", "algo=decoupled_ewma", "learner.backend=numpy"])
    from laglab.preflight import compose  # the config's own rule (before any learner): EWMA only where it is used

    with pytest.raises(ConfigError, match="learner.backend"):
        compose(["env=cartpole_pomdp", "policy.recurrent=lstm", "algo=decoupled_ewma", "learner.backend=numpy"])
    assert compose(["env=cartpole_pomdp", "policy.recurrent=lstm", "algo.loss.prox=ewma",
                    "learner.backend=numpy"]).learner.backend == "numpy"  # (clip PPO: no proximal policy)
    with pytest.raises(ConfigError, match="learner.backend"):
        _learner(["env=cartpole", "learner.backend=jax"])


@pytest.mark.parametrize("smaller", [True, False])
def test_tie_shares_are_torchs(smaller):
    """min/max's gradient share on ties, strict wins and losses, against torch.minimum / torch.maximum's autograd."""
    from laglab.npstep import _pick_grad

    a = torch.tensor([1.0, 2.0, 3.0, -1.5, 0.0], requires_grad=True)
    b = torch.tensor([1.0, 3.0, 2.0, -1.5, 0.5])
    (torch.minimum(a, b) if smaller else torch.maximum(a, b)).sum().backward()
    got = _pick_grad(a.detach().numpy(), b.numpy(), smaller)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, a.grad.numpy())


def test_adam_with_parameters_at_different_step_counts():
    """A parameter that once had no gradient has its own step count (torch.optim.Adam's, laglab.optim's): each
    parameter's bias correction uses its own."""
    model, twin = make(False), make(False)
    twin.load_state_dict(model.state_dict())
    opt_t = Adam(list(twin.parameters()), lr=3e-3)
    opt_n = Adam(list(model.parameters()), lr=3e-3)
    g = torch.Generator().manual_seed(7)
    first = [torch.randn(p.shape, generator=g) for p in twin.parameters()]
    for p, gr in zip(twin.parameters(), first):  # a step in which parameter 0 has no gradient
        p.grad = None if p is next(twin.parameters()) else gr.clone()
    opt_t.step()
    for p, gr in zip(model.parameters(), first):
        p.grad = None if p is next(model.parameters()) else gr.clone()
    opt_n.step()
    assert opt_n.steps[0] == 0 and opt_n.steps[1] == 1
    step = NumpyStep(model, opt_n, "tanh")
    step.load()
    both_step([torch.randn(p.shape, generator=g) for p in twin.parameters()], twin, opt_t, step)
    step.store()
    assert opt_n.steps == opt_t.steps and opt_n.steps[0] == 1 and opt_n.steps[1] == 2
    assert_close([p.detach() for p in model.parameters()], [p.detach() for p in twin.parameters()], "weights")


@pytest.mark.parametrize("overrides,method", [
    (["env=pendulum", "algo=decoupled_ewma"], "step"),
    (["env=pendulum", "policy.recurrent=lstm", "policy.hidden=16", "learner.minibatches=4"], "recurrent_step"),
])
def test_an_interrupted_numpy_update_leaves_the_model_and_the_ewma_as_before(monkeypatch, overrides, method):
    cfg, learner = _learner(overrides + ["learner.batch_size=256", "actor.rollout_len=32", "actor.envs_per_actor=8",
                                         "learner.epochs=2"])
    assert learner.backend == "numpy"
    frags = _frags(cfg, learner, 8)
    before = [p.detach().clone() for p in learner.model.parameters()]
    total = learner._ewma_total
    calls = []
    real = getattr(learner._np, method)

    def interrupted(*a, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(learner._np, method, interrupted)
    with pytest.raises(KeyboardInterrupt):
        learner.update(frags)
    assert learner.version == 0 and learner._ewma_total == total
    for p, q in zip(learner.model.parameters(), before):
        assert torch.equal(p.detach(), q)


def test_numpy_backend_runs_on_the_cpu_whatever_device_auto_finds(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # (a machine with a GPU)

    _, learner = _learner(["env=cartpole", "learner.backend=numpy"], device="auto")
    assert learner.device.type == "cpu" and learner.backend == "numpy"
