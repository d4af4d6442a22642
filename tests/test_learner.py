"""The learner on hand-made fragments: truncation folding, lag bookkeeping, normalizer in snapshots,
continuous actions, checkpoints."""
import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from laglab.actor import Actor
from laglab.config import Config, validate
from laglab.fragment import Fragment, FragmentId
from laglab.learner import Learner
from laglab.run import env_spec


def cfg_of(**over) -> Config:
    base = {"actors": 1, "total_env_steps": 10_000, "actor": {"envs_per_actor": 1, "rollout_len": 3},
            "learner": {"batch_size": 6, "minibatches": 2, "epochs": 1}}
    return validate(OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.create(base), OmegaConf.create(over)))


def make_frag(t0, rewards, term, trunc, final_obs=None, version=0, obs_dim=4, discrete=True, seed=0,
              disc_return=None):
    T = len(rewards)
    g = np.random.default_rng(seed + t0)
    fid = FragmentId(0, 1, 0, 0, t0, t0, t0 + T - 1, version)
    acts = np.zeros(T, np.int64) if discrete else g.normal(size=(T, 1)).astype(np.float32)
    k = int(np.sum(trunc))
    final = np.zeros((k, obs_dim), np.float32) if final_obs is None else np.asarray(final_obs, np.float32)
    return Fragment(fid, g.normal(size=(T, obs_dim)).astype(np.float32), acts, np.asarray(rewards, np.float32),
                    np.asarray(term, bool), np.asarray(trunc, bool), np.full(T, np.log(0.5), np.float32),
                    np.full(T, 99.0, np.float32),  # behavior values: never used by the learner
                    final, np.zeros(T, np.float32) if disc_return is None else np.asarray(disc_return, np.float32),
                    g.normal(size=obs_dim).astype(np.float32))


def hand_critic(learner, c, k=0.0):
    """V(s) = c + k * tanh(tanh(s[0])) (set by hand in the critic's weights), and a uniform policy (so the
    behavior log-probs log(0.5) are on-policy)."""
    with torch.no_grad():
        learner.model.pi[-1].weight.zero_()
        learner.model.pi[-1].bias.zero_()
        for layer in learner.model.v:
            if isinstance(layer, torch.nn.Linear):
                layer.weight.zero_()
                layer.bias.zero_()
        learner.model.v[0].weight[0, 0] = 1.0
        learner.model.v[2].weight[0, 0] = 1.0
        learner.model.v[-1].weight[0, 0] = k
        learner.model.v[-1].bias.fill_(c)


def constant_critic(learner, c):
    hand_critic(learner, c, 0.0)


@pytest.mark.parametrize("estimator", ["gae", "vtrace"])
def test_truncation_bootstraps_with_the_current_critic_on_the_final_observation(estimator):
    cfg = cfg_of(algo={"advantage": {"estimator": estimator, "gamma": 0.5, "lam": 1.0, "rho_bar": 100.0,
                                     "c_bar": 100.0}})
    learner = Learner(cfg, env_spec(cfg))
    hand_critic(learner, 2.0, 3.0)  # V(s) = 2 + 3 tanh(tanh(s0))
    v = lambda s0: 2.0 + 3.0 * np.tanh(np.tanh(s0))  # noqa: E731 - the same critic, by hand
    # steps: r=1 (continue), r=1 truncated (final obs s0 = 1.5), r=1 (new episode), then bootstrap V(last obs)
    f = make_frag(0, [1.0, 1.0, 1.0], [0, 0, 0], [0, 1, 0], final_obs=[[1.5, 0, 0, 0]])
    adv, ret = learner.advantages([f])
    obs0 = f.obs[:, 0]
    g2 = 1 + 0.5 * v(f.last_obs[0])
    g1 = 1 + 0.5 * v(1.5)  # cut after the truncation, bootstrapped from the final observation
    g0 = 1 + 0.5 * g1
    np.testing.assert_allclose(ret[:, 0].numpy(), [g0, g1, g2], rtol=1e-5)
    np.testing.assert_allclose(adv[:, 0].numpy(), [g0 - v(obs0[0]), g1 - v(obs0[1]), g2 - v(obs0[2])], rtol=1e-5,
                               atol=1e-6)
    g = make_frag(0, [1.0, 1.0, 1.0], [0, 1, 0], [0, 0, 0])  # terminated: no bootstrap
    _, ret = learner.advantages([g])
    np.testing.assert_allclose(ret[:, 0].numpy(), [1.5, 1.0, 1 + 0.5 * v(g.last_obs[0])], rtol=1e-5)


def test_update_bumps_version_reports_lag_and_ships_normalizer():
    cfg = cfg_of(env={"normalize_obs": True})
    learner = Learner(cfg, env_spec(cfg))
    learner.version = 5
    frags = [make_frag(0, [1, 1, 1], [0, 0, 0], [0, 0, 0], version=3),
             make_frag(3, [1, 1, 1], [0, 0, 1], [0, 0, 0], version=5)]
    for f in frags:
        learner.take(f)
    m = learner.update(frags)
    assert learner.version == 6 and learner.updates == 1
    assert (m["lag/min"], m["lag/max"], m["lag/mean"]) == (0.0, 2.0, 1.0)
    obs = np.concatenate([f.obs for f in frags])
    np.testing.assert_array_equal(learner.obs_mean, np.zeros(4))  # the update normalized with the old statistics
    snap = learner.publish_snapshot()  # publication freezes the new ones
    np.testing.assert_allclose(snap.obs_mean, obs.mean(0), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(snap.obs_var, obs.var(0), rtol=1e-2, atol=1e-3)
    np.testing.assert_array_equal(learner.obs_mean, snap.obs_mean)  # ... and the learner now uses exactly those
    assert snap.version == 6 and snap.consumed == {1: 6}  # keyed by incarnation
    for k in ("losses/policy_loss", "losses/value_loss", "losses/approx_kl", "lag/kl_behavior"):
        assert np.isfinite(m[k])


def test_reward_scale_is_the_learners_and_survives_a_checkpoint(tmp_path):
    cfg = cfg_of(env={"normalize_reward": True, "reward_clip": 100.0}, algo={"advantage": {"gamma": 1.0, "lam": 1.0}})
    spec = env_spec(cfg)
    learner = Learner(cfg, spec)
    constant_critic(learner, 0.0)
    returns = [[1.0, 3.0, 2.0], [4.0, 0.5, 6.0]]
    frags = [make_frag(3 * i, [1.0, 1.0, 1.0], [0, 0, 0], [0, 0, 0], disc_return=r) for i, r in enumerate(returns)]
    var = np.var(np.concatenate(returns))  # the batch's discounted returns (the running stats start empty)
    adv, ret = learner.advantages(frags)
    np.testing.assert_allclose(ret[:, 1].numpy(), [3.0, 2.0, 1.0], rtol=1e-6)  # before: nothing scaled yet
    learner.update(frags)
    assert learner.rew_rms.var == pytest.approx(var, rel=1e-3)
    assert learner.snapshot().reward_var == pytest.approx(var, rel=1e-3)
    scaled = 1.0 / np.sqrt(var + 1e-8)
    hand_critic(learner, 0.0)
    _, ret = learner.advantages(frags)
    np.testing.assert_allclose(ret[-1, 1].numpy(), scaled, rtol=1e-4)  # rewards divided by the return's std
    other = Learner(cfg, spec)
    other.load_checkpoint(learner.save_checkpoint(tmp_path / "ck.pt"))
    assert other.rew_rms.var == learner.rew_rms.var and other.rew_rms.count == learner.rew_rms.count


def test_learning_rate_anneals_on_trained_steps_to_zero_at_the_budget():
    cfg = cfg_of(total_env_steps=24, learner={"lr": 0.01})
    learner = Learner(cfg, env_spec(cfg))
    lrs = []
    for k in range(4):  # 4 batches of 6 = the budget
        frags = [make_frag(6 * k, [1, 1, 1], [0, 0, 0], [0, 0, 0]), make_frag(6 * k + 3, [1, 1, 1], [0, 0, 0],
                                                                               [0, 0, 0])]
        lrs.append(learner.update(frags)["charts/lr"])  # progress: trained transitions (the driver passes fates)
    np.testing.assert_allclose(lrs, [0.01, 0.0075, 0.005, 0.0025], rtol=1e-6)
    assert learner.trained_steps == 24  # one more update would train at lr 0: the budget is trained


def test_continuous_update_and_checkpoint_round_trip(tmp_path):
    cfg = cfg_of(env={"id": "Pendulum-v1"}, algo={"advantage": {"estimator": "vtrace"},
                                                  "loss": {"kind": "dual_clip"}})
    spec = env_spec(cfg)
    learner = Learner(cfg, spec)
    frags = [make_frag(3 * i, [-1, -2, -3], [0, 0, 0], [0, 0, 0], obs_dim=3, discrete=False, seed=i)
             for i in range(2)]
    learner.update(frags)
    path = learner.save_checkpoint(tmp_path / "ck.pt")
    other = Learner(cfg, spec)
    other.load_checkpoint(path)
    assert other.version == learner.version == 1
    for (k, a), (_, b) in zip(learner.model.state_dict().items(), other.model.state_dict().items()):
        assert torch.equal(a, b), k
    assert not list(tmp_path.glob("*.tmp"))  # written atomically


def _slow_targets(learner, frags, estimator):
    """GAE or V-trace targets fragment by fragment, the slow way, from the paper's recursions: a truncated step's
    reward gets gamma * V(its final observation), every done cuts the discount, the last step bootstraps from
    V(last obs). (The fragments are one rollout's: different env instances, so none continues another.)"""
    a = learner.cfg.algo.advantage
    V = lambda o: learner.model.value(torch.from_numpy(np.array(o, np.float32).reshape(1, -1)))[0].item()  # noqa: E731
    out_adv, out_ret = [], []
    for f in frags:
        T = len(f.rewards)
        finals = iter(f.trunc_obs)
        r = [float(f.rewards[t]) + (a.gamma * V(next(finals)) if f.truncated[t] else 0.0) for t in range(T)]
        v = [V(f.obs[t]) for t in range(T)] + [V(f.last_obs)]
        disc = [0.0 if (f.terminated[t] or f.truncated[t]) else a.gamma for t in range(T)]
        obs_t = torch.from_numpy(np.array(f.obs))
        cur = learner.model.logp_entropy(obs_t, torch.from_numpy(np.array(f.actions)))[0].tolist()
        adv, ret = [0.0] * T, [0.0] * T
        if estimator == "gae":
            nxt = 0.0
            for t in reversed(range(T)):
                nxt = r[t] + disc[t] * v[t + 1] - v[t] + disc[t] * a.lam * nxt
                adv[t], ret[t] = nxt, nxt + v[t]
        else:
            acc, vs = 0.0, [0.0] * T + [v[T]]
            for t in reversed(range(T)):
                ratio = math.exp(cur[t] - float(f.logp[t]))
                acc = min(a.rho_bar, ratio) * (r[t] + disc[t] * v[t + 1] - v[t]) + disc[t] * a.lam * min(a.c_bar, ratio) * acc
                vs[t] = acc + v[t]
            for t in range(T):
                adv[t], ret[t] = r[t] + disc[t] * vs[t + 1] - v[t], vs[t]
        out_adv.append(adv)
        out_ret.append(ret)
    return np.array(out_adv).T, np.array(out_ret).T  # [T, N]


@pytest.mark.parametrize("estimator", ["gae", "vtrace"])
def test_targets_with_truncations_and_stale_data_match_the_slow_recursions(estimator):
    from laglab.tagged import TAGGED_ID

    cfg = cfg_of(env={"id": TAGGED_ID, "kwargs": {"horizon": 3}},
                 algo={"advantage": {"estimator": estimator, "gamma": 0.9, "lam": 0.8, "rho_bar": 1.0, "c_bar": 0.9}},
                 actor={"envs_per_actor": 4, "rollout_len": 16}, learner={"batch_size": 64})
    spec = env_spec(cfg)
    learner = Learner(cfg, spec)
    actor = Actor(cfg, 0, 1)
    actor.load(learner.snapshot())
    frags = actor.collect().fragments
    assert sum(int(f.truncated.sum()) for f in frags) >= 4  # (horizon 3: several truncations per fragment)
    torch.manual_seed(5)
    with torch.no_grad():  # the learner has moved on: the data is stale (ratios != 1), values are not constant
        for p in learner.model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    adv, ret, _, _ = learner._targets(learner._batch(frags))
    want_adv, want_ret = _slow_targets(learner, frags, estimator)
    np.testing.assert_allclose(adv.numpy(), want_adv, atol=1e-4)
    np.testing.assert_allclose(ret.numpy(), want_ret, atol=1e-4)


def test_a_feed_forward_epoch_takes_each_row_once_with_its_own_data():
    # each minibatch's rows of the per-transition tensors belong to the observations it was evaluated on: the
    # log-probs, entropies and values it yields are those of its rows, and an epoch covers B // mb * mb rows once
    batch = 12
    cfg = cfg_of(actor={"envs_per_actor": 2, "rollout_len": 6}, learner={"batch_size": batch, "minibatches": 4, "epochs": 1})
    learner = Learner(cfg, env_spec(cfg))
    frags = [make_frag(0, [1.0] * (batch // 2), [False] * (batch // 2), [False] * (batch // 2), seed=s)
             for s in (0, 7)]
    b = learner._batch(frags)
    B = b.T * b.N
    pos = {"pos": torch.arange(B), "twice": torch.arange(B) * 2.0}
    seen = []
    for rows, logp, ent, v, prox in learner._minibatches(b, None, None, False, None, None, pos):
        idx = rows["pos"]
        assert torch.equal(rows["twice"], idx * 2.0) and prox is None
        with torch.no_grad():
            ref_logp, ref_ent = learner.model.logp_entropy(b.obs[idx], b.actions[idx])
            assert torch.equal(logp, ref_logp) and torch.equal(ent, ref_ent)
            assert torch.equal(v, learner.model.value(b.obs[idx]))
        seen += idx.tolist()
    mb = B // cfg.learner.minibatches
    assert len(seen) == len(set(seen)) == mb * cfg.learner.minibatches
