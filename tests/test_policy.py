import numpy as np
import pytest
import torch

from laglab.algo import LOG_STD_MAX, LOG_STD_MIN
from laglab.envs import EnvSpec
from laglab.inference import FUSE_MAX_ROWS, FUSE_MAX_WIDTH
from laglab.policy import ActorCritic, InferencePolicy, Snapshot

DISCRETE = EnvSpec((4,), True, 3)
CONTINUOUS = EnvSpec((5,), False, 2, np.full(2, -1.0, np.float32), np.full(2, 1.0, np.float32))


def _obs(spec, n=64, seed=0):
    return np.random.default_rng(seed).normal(size=(n,) + spec.obs_shape).astype(np.float32) * 2


@pytest.mark.parametrize("spec", [DISCRETE, CONTINUOUS])
@pytest.mark.parametrize("activation", ["tanh", "relu", "elu"])
@pytest.mark.parametrize("hidden", [(32, 16), (24, 24, 64), (96, 40)])
def test_inference_policy_agrees_with_torch_model(spec, activation, hidden):
    """Both ways the actors evaluate the two MLPs: as one network (up to FUSE_MAX_WIDTH) and as two."""
    torch.manual_seed(0)
    model = ActorCritic(spec, hidden, activation, log_std_init=-0.5)
    snap = Snapshot.make(3, model, np.zeros(spec.obs_shape), np.ones(spec.obs_shape))
    pol = InferencePolicy(snap, spec, activation)
    assert (pol.fused is None) == (max(hidden) > FUSE_MAX_WIDTH)
    fused, mlp = [], pol._mlp
    pol._mlp = lambda layers, x: fused.append(layers is pol.fused) or mlp(layers, x)
    _agrees(model, pol, spec, activation, _obs(spec, FUSE_MAX_ROWS))  # fused where narrow enough
    assert fused == ([False, False] if pol.fused is None else [True])
    _agrees(model, pol, spec, activation, _obs(spec, FUSE_MAX_ROWS + 1))  # past FUSE_MAX_ROWS: the two networks
    assert fused[-2:] == [False, False]


def _agrees(model, pol, spec, activation, obs):
    a, logp, v, mean, log_std, _ = pol.act(obs, np.random.default_rng(1))
    with torch.no_grad():
        t_logp, _ = model.logp_entropy(torch.from_numpy(obs), torch.from_numpy(a))
        t_v = model.value(torch.from_numpy(obs))
    np.testing.assert_allclose(logp, t_logp.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(v, t_v.numpy(), rtol=1e-4, atol=1e-5)
    if spec.discrete:
        assert a.dtype == np.int64 and set(np.unique(a)) <= {0, 1, 2}
    else:
        assert a.shape == (len(obs), 2) and mean.shape == (len(obs), 2)
        with torch.no_grad():
            np.testing.assert_allclose(mean, model.pi(torch.from_numpy(obs)).numpy(), rtol=1e-4, atol=1e-5)


def test_discrete_sampling_follows_the_policy_distribution():
    torch.manual_seed(0)
    model = ActorCritic(DISCRETE, (8,), "tanh")
    with torch.no_grad():
        model.pi[-1].bias.copy_(torch.tensor([0.0, 1.0, 2.0]))
    pol = InferencePolicy(Snapshot.make(0, model, np.zeros(4), np.ones(4)), DISCRETE)
    obs = np.zeros((20000, 4), np.float32)
    a, logp, *_ = pol.act(obs, np.random.default_rng(0))
    p = np.exp([0.0, 1.0, 2.0]) / np.exp([0.0, 1.0, 2.0]).sum()
    freq = np.bincount(a, minlength=3) / len(a)
    np.testing.assert_allclose(freq, p, atol=0.015)
    np.testing.assert_allclose(np.exp(logp), p[a], rtol=1e-5)


def test_log_std_is_clamped_everywhere():
    model = ActorCritic(CONTINUOUS, (8,), "tanh")
    with torch.no_grad():
        model.log_std.copy_(torch.tensor([-50.0, 10.0]))
    assert model.clamped_log_std().tolist() == [LOG_STD_MIN, LOG_STD_MAX]
    pol = InferencePolicy(Snapshot.make(0, model, np.zeros(5), np.ones(5)), CONTINUOUS)
    log_std = pol.act(_obs(CONTINUOUS, 4), np.random.default_rng(0))[4]
    np.testing.assert_array_equal(log_std[0], [LOG_STD_MIN, LOG_STD_MAX])


def test_snapshot_is_immutable_and_independent_of_the_model():
    model = ActorCritic(DISCRETE, (8,), "tanh")
    snap = Snapshot.make(1, model, np.zeros(4), np.ones(4), {0: 10})
    before = {k: v.copy() for k, v in snap.weights.items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # the learner keeps training after publication
    for k, v in snap.weights.items():
        np.testing.assert_array_equal(v, before[k])
    with pytest.raises(ValueError):
        next(iter(snap.weights.values()))[...] = 0.0  # read-only arrays
    with pytest.raises(TypeError):
        snap.weights["pi.0.weight"] = None  # read-only mapping
    with pytest.raises(ValueError):
        snap.obs_mean[0] = 1.0
    with pytest.raises(Exception):
        snap.version = 2  # frozen dataclass


def test_snapshot_round_trips_into_a_model():
    a, b = ActorCritic(CONTINUOUS, (8,), "tanh"), ActorCritic(CONTINUOUS, (8,), "tanh")
    Snapshot.make(0, a, np.zeros(5), np.ones(5)).load_into(b)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_host_tanh_is_tanh_with_its_gradient(dtype):
    """The CPU tanh (numpy's, written into a tensor torch allocates) against torch.tanh: values within an ulp,
    gradients (through a strided input) the same function, and gradcheck; without ``host``, torch's own."""
    from laglab.policy import Tanh, _HostTanh

    g = torch.Generator().manual_seed(0)
    x = (torch.randn(300, 80, generator=g, dtype=dtype) * 3)[:, ::2]  # (not contiguous)
    x.requires_grad_(True)
    w = torch.randn(x.shape, generator=g, dtype=dtype)
    y = Tanh(host=True)(x)
    assert y.dtype == dtype and y.shape == x.shape and type(y.grad_fn).__name__ == "_HostTanhBackward"
    ref = torch.tanh(x)
    tol = 2 * torch.finfo(dtype).eps
    assert float((y - ref).abs().max()) <= tol
    (gx,) = torch.autograd.grad((y * w).sum(), x)
    (gr,) = torch.autograd.grad((ref * w).sum(), x)
    assert float((gx - gr).abs().max()) <= 4 * tol * float(w.abs().max())
    xd = torch.randn(5, 3, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(_HostTanh.apply, (xd,))
    with torch.no_grad():
        assert float((Tanh(host=True)(x) - ref).abs().max()) <= tol
    assert torch.equal(Tanh()(x), ref)


def test_the_learners_tanh_is_chosen_per_run_and_a_row_does_not_depend_on_its_batch():
    # numpy's tanh where a minibatch's narrowest layer holds >= Tanh.HOST_MIN values (CartPole's default: 256 x 64),
    # torch's below (HalfCheetah's 64 x 64), one choice for the whole model: the full-batch pass of the update and
    # its minibatches then compute every row bit for bit alike
    from laglab.learner import build_model, host_tanh
    from laglab.policy import Tanh
    from laglab.preflight import compose

    cart, cheetah = compose([]), compose(["env=pendulum"])
    assert host_tanh(cart) and not host_tanh(cheetah)
    assert not host_tanh(compose(["policy.activation=relu"]))
    for cfg, host in ((cart, True), (cheetah, False)):
        model = build_model(cfg, DISCRETE)
        assert {m.host for m in model.modules() if isinstance(m, Tanh)} == {host}
    torch.manual_seed(0)
    model = build_model(cart, DISCRETE)
    obs = torch.from_numpy(_obs(DISCRETE, n=2048))
    with torch.no_grad():
        full = model.value(obs)
        part = model.value(obs[:64])
    assert torch.equal(full[:64], part)


def test_a_non_finite_value_weight_never_reaches_the_policy_head():
    """The fused network's zero blocks would turn an inf in the value MLP into NaN logits: with a non-finite weight
    the two MLPs run apart, so actions and log-probs stay the policy's own."""
    torch.manual_seed(0)
    model = ActorCritic(DISCRETE, (16, 16), "tanh")
    with torch.no_grad():
        model.v[0].weight[0, 0] = float("inf")
    pol = InferencePolicy(Snapshot.make(0, model, np.zeros(4), np.ones(4)), DISCRETE)
    assert pol.fused is None
    obs = _obs(DISCRETE, 8)
    a, logp, v, *_ = pol.act(obs, np.random.default_rng(0))
    assert np.isfinite(logp).all()
    with torch.no_grad():
        np.testing.assert_allclose(logp, model.logp_entropy(torch.from_numpy(obs), torch.from_numpy(a))[0].numpy(),
                                   rtol=1e-4, atol=1e-5)
