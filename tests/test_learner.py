"""The learner on hand-made fragments: truncation folding, lag bookkeeping, normalizer in snapshots,
continuous actions, checkpoints."""
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from laglab.config import Config, validate
from laglab.fragment import Fragment, FragmentId
from laglab.learner import Learner
from laglab.run import env_spec


def cfg_of(**over) -> Config:
    base = {"actors": 1, "total_env_steps": 10_000, "actor": {"envs_per_actor": 1, "rollout_len": 3},
            "learner": {"batch_size": 6, "minibatches": 2, "epochs": 1}}
    return validate(OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.create(base), OmegaConf.create(over)))


def make_frag(t0, rewards, term, trunc, trunc_values, version=0, obs_dim=4, discrete=True, seed=0):
    T = len(rewards)
    g = np.random.default_rng(seed + t0)
    fid = FragmentId(0, 1, 0, 0, t0, t0, t0 + T - 1, version)
    acts = np.zeros(T, np.int64) if discrete else g.normal(size=(T, 1)).astype(np.float32)
    return Fragment(fid, g.normal(size=(T, obs_dim)).astype(np.float32), acts, np.asarray(rewards, np.float32),
                    np.asarray(term, bool), np.asarray(trunc, bool), np.full(T, np.log(0.5), np.float32),
                    np.zeros(T, np.float32), np.asarray(trunc_values, np.float32),
                    g.normal(size=obs_dim).astype(np.float32))


def constant_critic(learner, c):
    """V(s) = c everywhere, and a uniform policy (so behavior log-probs log(0.5) are on-policy)."""
    with torch.no_grad():
        learner.model.pi[-1].weight.zero_()
        learner.model.pi[-1].bias.zero_()
        learner.model.v[-1].weight.zero_()
        learner.model.v[-1].bias.fill_(c)


@pytest.mark.parametrize("estimator", ["gae", "vtrace"])
def test_truncation_bootstraps_with_final_value_and_termination_does_not(estimator):
    cfg = cfg_of(algo={"advantage": {"estimator": estimator, "gamma": 0.5, "lam": 1.0, "rho_bar": 100.0,
                                     "c_bar": 100.0}})
    learner = Learner(cfg, env_spec(cfg))
    constant_critic(learner, 2.0)  # V(s) = 2 everywhere
    # steps: r=1 (continue), r=1 truncated with V(final)=10, r=1 (new episode), bootstrap V(last)=2
    f = make_frag(0, [1.0, 1.0, 1.0], [0, 0, 0], [0, 1, 0], [0.0, 10.0, 0.0])
    adv, ret = learner.advantages([f])
    # by hand, gamma = 0.5: G2 = 1 + 0.5*2 = 2; G1 = 1 + 0.5*10 = 6 (cut after the truncation); G0 = 1 + 0.5*6 = 4
    np.testing.assert_allclose(ret[:, 0].numpy(), [4.0, 6.0, 2.0], rtol=1e-6)
    np.testing.assert_allclose(adv[:, 0].numpy(), [2.0, 4.0, 0.0], rtol=1e-6)
    g = make_frag(0, [1.0, 1.0, 1.0], [0, 1, 0], [0, 0, 0], [0.0, 0.0, 0.0])  # terminated: no bootstrap
    _, ret = learner.advantages([g])
    np.testing.assert_allclose(ret[:, 0].numpy(), [1.5, 1.0, 2.0], rtol=1e-6)


def test_update_bumps_version_reports_lag_and_ships_normalizer():
    cfg = cfg_of(env={"normalize_obs": True})
    learner = Learner(cfg, env_spec(cfg))
    learner.version = 5
    frags = [make_frag(0, [1, 1, 1], [0, 0, 0], [0, 0, 0], [0, 0, 0], version=3),
             make_frag(3, [1, 1, 1], [0, 0, 1], [0, 0, 0], [0, 0, 0], version=5)]
    for f in frags:
        learner.take(f)
    m = learner.update(frags, env_steps=6)
    assert learner.version == 6 and learner.updates == 1
    assert (m["lag/min"], m["lag/max"], m["lag/mean"]) == (0.0, 2.0, 1.0)
    obs = np.concatenate([f.obs for f in frags])
    snap = learner.snapshot()
    np.testing.assert_allclose(snap.obs_mean, obs.mean(0), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(snap.obs_var, obs.var(0), rtol=1e-2, atol=1e-3)
    assert snap.version == 6 and snap.consumed == {1: 6}  # keyed by incarnation
    for k in ("losses/policy_loss", "losses/value_loss", "losses/approx_kl", "lag/kl_behavior"):
        assert np.isfinite(m[k])


def test_continuous_update_and_checkpoint_round_trip(tmp_path):
    cfg = cfg_of(env={"id": "Pendulum-v1"}, algo={"advantage": {"estimator": "vtrace"},
                                                  "loss": {"kind": "dual_clip"}})
    spec = env_spec(cfg)
    learner = Learner(cfg, spec)
    frags = [make_frag(3 * i, [-1, -2, -3], [0, 0, 0], [0, 0, 0], [0, 0, 0], obs_dim=3, discrete=False, seed=i)
             for i in range(2)]
    learner.update(frags, env_steps=6)
    path = learner.save_checkpoint(tmp_path / "ck.pt")
    other = Learner(cfg, spec)
    other.load_checkpoint(path)
    assert other.version == learner.version == 1
    for (k, a), (_, b) in zip(learner.model.state_dict().items(), other.model.state_dict().items()):
        assert torch.equal(a, b), k
    assert not list(tmp_path.glob("*.tmp"))  # written atomically
