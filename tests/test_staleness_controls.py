"""What buys lag back (issue 19), in the learner and the driver: the decoupled objective's proximal policy
(start of the update | EWMA of the weights), the KL cap on stale fragments, the KL-adaptive learning rate."""
import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from laglab import algo
from laglab.config import Config, validate
from laglab.learner import Learner, prox_beta
from laglab.run import env_spec, run
from test_learner import cfg_of, hand_critic, make_frag


def _frags(k=0, version=0):
    return [make_frag(6 * k, [1, 0, 1], [0, 0, 0], [0, 0, 0], version=version, seed=k),
            make_frag(6 * k + 3, [0, 1, 1], [0, 0, 1], [0, 0, 0], version=version, seed=k)]


def _same_weights(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_decoupled_start_on_fresh_data_trains_exactly_as_ppo():
    """On-policy data (behavior = the learner's policy, uniform here): the proximal policy is the behavior policy,
    every weight is 1, and the decoupled update is PPO's, weight for weight."""
    learners = []
    for kind in ("clip", "decoupled"):
        cfg = cfg_of(algo={"loss": {"kind": kind}}, learner={"epochs": 2})
        torch.manual_seed(0)  # the same initial weights
        ln = Learner(cfg, env_spec(cfg))
        hand_critic(ln, 0.5)  # a uniform policy: the fragments' log(0.5) is on-policy exactly
        m = ln.update(_frags())
        learners.append((ln, m))
    (a, ma), (b, mb) = learners
    assert _same_weights(a.model, b.model)
    assert ma["losses/policy_loss"] == mb["losses/policy_loss"] and mb["losses/is_trunc_frac"] == 0.0
    assert ma["lag/is_ess"] == pytest.approx(1.0)


def test_decoupled_on_stale_data_differs_from_ppo_and_reports_truncation():
    out = {}
    for kind in ("clip", "decoupled"):
        cfg = cfg_of(algo={"loss": {"kind": kind, "is_cap": 1.05}})
        torch.manual_seed(0)
        ln = Learner(cfg, env_spec(cfg))
        with torch.no_grad():  # a policy far from the behavior's uniform one: pi/mu != 1
            ln.model.pi[-1].bias.copy_(torch.tensor([2.0, -2.0]))
        out[kind] = (ln, ln.update(_frags()))
    assert not _same_weights(out["clip"][0].model, out["decoupled"][0].model)
    m = out["decoupled"][1]
    assert 0.0 < m["losses/is_trunc_frac"] <= 1.0 and m["lag/is_ess"] < 1.0


def _ewma_reference(weights, beta):
    """The bias-corrected EWMA as an explicit weighted average: sum_j beta^(k-j) theta_j / sum_j beta^(k-j) over
    the initial weights theta_0 and the weights after each of the k steps."""
    k = len(weights) - 1
    c = np.array([beta ** (k - j) for j in range(k + 1)])
    return sum(ci * w for ci, w in zip(c, weights)) / c.sum()


def test_ewma_proximal_policy_is_the_weighted_average_of_every_step():
    cfg = cfg_of(algo={"loss": {"kind": "decoupled", "prox": "ewma", "prox_beta": 0.7}})
    ln = Learner(cfg, env_spec(cfg))
    g = torch.Generator().manual_seed(0)
    seen = [[p.detach().clone().double() for p in ln.params]]
    for _ in range(5):
        with torch.no_grad():
            for p in ln.params:
                p.add_(torch.randn(p.shape, generator=g))
        seen.append([p.detach().clone().double() for p in ln.params])
        ln._ewma_step()
    for i, q in enumerate(ln.prox_model.parameters()):
        want = _ewma_reference([s[i] for s in seen], 0.7)
        torch.testing.assert_close(q.double(), want, rtol=1e-5, atol=1e-5)


def test_ewma_update_trains_and_the_average_survives_a_checkpoint(tmp_path):
    cfg = cfg_of(algo={"loss": {"kind": "decoupled", "prox": "ewma"}}, learner={"epochs": 3})
    ln = Learner(cfg, env_spec(cfg))
    before = [p.detach().clone() for p in ln.prox_model.parameters()]
    ln.update(_frags())
    moved = [not torch.equal(a, b) for a, b in zip(before, ln.prox_model.parameters())]
    assert any(moved) and not _same_weights(ln.prox_model, ln.model)  # it follows the weights, behind them
    other = Learner(cfg, env_spec(cfg))
    other.load_checkpoint(ln.save_checkpoint(tmp_path / "ck.pt"))
    assert _same_weights(other.prox_model, ln.prox_model) and other._ewma_total == ln._ewma_total


def test_auto_prox_beta_matches_the_mean_age_of_ppos_proximal_policy():
    cfg = cfg_of(algo={"loss": {"kind": "decoupled", "prox": "ewma"}}, learner={"epochs": 10, "minibatches": 2})
    b = prox_beta(cfg)  # K = 20 steps per update: PPO's start-of-update policy is on average 9.5 steps old
    assert b == pytest.approx(19 / 21) and b / (1 - b) == pytest.approx(9.5)


def test_kl_adaptive_follows_sample_factorys_rule_within_the_bounds():
    cfg = cfg_of(learner={"lr": 1e-3, "lr_schedule": "kl_adaptive", "kl_target": 0.01, "lr_min": 5e-4,
                          "lr_max": 2e-3})
    ln = Learner(cfg, env_spec(cfg))
    lr = lambda: ln.opt.param_groups[0]["lr"]  # noqa: E731
    ln._adapt_lr(0.03)  # > 2 x target: / 1.5
    assert lr() == pytest.approx(1e-3 / 1.5)
    ln._adapt_lr(0.015)  # within [target / 2, 2 x target]: unchanged
    assert lr() == pytest.approx(1e-3 / 1.5)
    ln._adapt_lr(0.03)
    assert lr() == pytest.approx(5e-4)  # floored at lr_min
    for _ in range(5):
        ln._adapt_lr(0.001)  # < target / 2: x 1.5, capped at lr_max
    assert lr() == pytest.approx(2e-3)



def test_kl_adaptive_adapts_once_per_update_on_how_far_the_update_moved_the_policy():
    """The KL the rule reads is KL(start || end) of the whole update, measured after it (not a minibatch's
    pre-step forward pass, which reads 0 on the first minibatch): written here from the weights before and after."""
    cfg = cfg_of(learner={"lr": 1e-3, "lr_schedule": "kl_adaptive", "kl_target": 1e-9, "epochs": 3})
    ln = Learner(cfg, env_spec(cfg))
    frags = _frags()
    b = ln._batch(frags)
    with torch.no_grad():
        start = ln.model.logp_entropy(b.obs, b.actions)[0]
    m = ln.update(frags)
    with torch.no_grad():
        end = ln.model.logp_entropy(b.obs, b.actions)[0]
    assert m["learner/update_kl"] == pytest.approx(float(algo.approx_kl_k3(end, start)), rel=1e-6)
    assert m["learner/update_kl"] > 2e-9 and ln.opt.param_groups[0]["lr"] == pytest.approx(1e-3 / 1.5)  # once
    cfg = cfg_of(learner={"lr": 1e-3, "lr_schedule": "kl_adaptive", "kl_target": 10.0, "epochs": 3})
    ln = Learner(cfg, env_spec(cfg))
    ln.update(_frags())
    assert ln.opt.param_groups[0]["lr"] == pytest.approx(1.5e-3)  # far under target: up, once


def test_fragment_kl_is_the_k3_estimate_under_the_current_policy():
    cfg = cfg_of()
    ln = Learner(cfg, env_spec(cfg))
    f = _frags()[0]
    hand_critic(ln, 0.0)  # uniform: the fragment's log(0.5) is on-policy
    assert ln.fragment_kl(f) == pytest.approx(0.0, abs=1e-7)
    with torch.no_grad():
        ln.model.pi[-1].bias.copy_(torch.tensor([1.0, -1.0]))
    p0 = torch.softmax(torch.tensor([1.0, -1.0]), 0)[0].item()  # every action of the fragment is 0
    r = p0 / 0.5
    assert ln.fragment_kl(f) == pytest.approx((r - 1) - np.log(r), rel=1e-5)


def _small(**over) -> Config:
    base = {"total_env_steps": 12288, "runner": {"name": "sync"}, "actor": {"envs_per_actor": 4, "rollout_len": 16},
            "learner": {"batch_size": 512, "minibatches": 2, "epochs": 2},
            "tracking": {"console_every_s": 1e9, "wandb": {"mode": "disabled"}}}
    return validate(OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.create(base), OmegaConf.create(over)))


def test_max_kl_behavior_drops_stale_fragments_into_the_books(tmp_path):
    s = run(_small(actor={"fixed_lag": 4}, learner={"max_kl_behavior": 1e-3}), tmp_path / "capped")
    t = s["transport"]
    assert t["balanced"] and t["dropped"].get("kl", 0) > 0  # booked under its own reason, books exact
    df = pd.read_parquet(tmp_path / "capped" / "metrics.parquet")
    assert 0 < df["transport/dropped/kl"].iloc[-1] <= t["dropped"]["kl"]  # W&B's counter (to the last update)
    assert (df["lag/kl_behavior"] <= 1e-3 + 1e-9).all()  # what was trained on is within the cap ...
    assert df["lag/kl_offered_max"].max() > 1e-3  # ... of what was offered


def test_a_cap_nothing_reaches_changes_nothing(tmp_path):
    a = run(_small(actor={"fixed_lag": 2}), tmp_path / "a")
    b = run(_small(actor={"fixed_lag": 2}, learner={"max_kl_behavior": 1e6}), tmp_path / "b")
    assert "kl" not in b["transport"]["dropped"] and b["transport"]["kl_forced_publications"] == 0
    cols = ["losses/policy_loss", "episodic_return_mean", "lag/kl_behavior"]
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "a" / "metrics.parquet")[cols],
                                  pd.read_parquet(tmp_path / "b" / "metrics.parquet")[cols])


def test_kl_past_the_cap_forces_a_publication_between_broadcasts(tmp_path):
    cfg = dict(learner={"broadcast_every": 4, "max_kl_behavior": 1e-4}, total_env_steps=16384)
    s = run(_small(**cfg), tmp_path / "forced")
    assert s["transport"]["kl_forced_publications"] > 0
    df = pd.read_parquet(tmp_path / "forced" / "metrics.parquet")
    # with publications forced, data is never as old as broadcast_every alone would let it get
    never = run(_small(learner={"broadcast_every": 4}, total_env_steps=16384), tmp_path / "plain")
    plain = pd.read_parquet(tmp_path / "plain" / "metrics.parquet")
    assert df["lag/mean"].mean() < plain["lag/mean"].mean() and never["transport"]["balanced"]


# ---- the actor side: forced refresh (actor.refresh_lag) and minimum sync interval (actor.sync_min_lag) ----------
from laglab.accounting import Budget, Ledger  # noqa: E402
from laglab.actor import Actor  # noqa: E402
from laglab.chaos import ChaosCounts  # noqa: E402
from laglab.runners.worker import Incarnation  # noqa: E402
import threading  # noqa: E402


def _actor_cfg(**actor) -> Config:
    base = {"actors": 1, "total_env_steps": 4096, "actor": {"envs_per_actor": 3, "rollout_len": 16, **actor},
            "learner": {"batch_size": 48, "minibatches": 2},
            "tracking": {"console_every_s": 1e9, "wandb": {"mode": "disabled"}}}
    return validate(OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.create(base)))


def _snap(cfg, version):
    ln = Learner(cfg, env_spec(cfg))
    ln.version = version
    return ln.snapshot()


def _newest_after(k, before, after):
    """A scripted newest(): ``before`` for the first k questions, ``after`` from then on."""
    calls = []

    def newest():
        calls.append(1)
        return before if len(calls) <= k else after
    return newest


def test_a_rollout_whose_snapshot_goes_stale_is_discarded_and_the_envs_go_on_from_there():
    cfg = _actor_cfg(refresh_lag=1)
    actor = Actor(cfg, 0, 1)
    actor.load(_snap(cfg, 0))
    ro = actor.collect(newest=_newest_after(5, 1, 2))  # at step 5 the newest is 2 versions ahead: > refresh_lag
    assert ro.fragments == [] and ro.discarded == ro.steps == 5 * 3
    assert actor.stats.refreshes == 1 and actor.stats.discarded_steps == 15 and actor.stats.steps == 15
    assert ro.skipped == ((0, 15), (1, 15), (2, 15))  # the streams' counters pass a whole rollout: aligned
    actor.load(_snap(cfg, 2))
    nxt = actor.collect(newest=lambda: 2)
    assert [f.id.t_start for f in nxt.fragments] == [16, 16, 16]
    assert all(f.id.behavior_version == 2 for f in nxt.fragments)
    # the env went on from where the discarded rollout stopped: 5 steps, so its episode clock says so
    assert all(f.id.episode_t0 == 5 for f in nxt.fragments if f.id.episode_id == 0)
    lagging = actor.collect(newest=lambda: 3)  # one version behind is within refresh_lag: kept
    assert len(lagging.fragments) == 3 and lagging.discarded == 0


def test_without_refresh_lag_nothing_is_discarded_however_stale():
    cfg = _actor_cfg()
    actor = Actor(cfg, 0, 1)
    actor.load(_snap(cfg, 0))
    assert len(actor.collect(newest=lambda: 100).fragments) == 3


def test_sync_min_lag_keeps_the_snapshot_until_the_newest_is_more_than_k_ahead():
    cfg = _actor_cfg(sync_min_lag=2, refresh_lag=4)
    actor = Actor(cfg, 0, 1)
    assert actor.wants(0)  # nothing loaded yet
    actor.load(_snap(cfg, 0))
    assert [actor.wants(v) for v in (0, 1, 2, 3)] == [False, False, False, True]
    assert _actor_cfg().actor.sync_min_lag == 0 and Actor(_actor_cfg(), 0, 1).wants(0)


def test_a_discarded_rollout_is_produced_and_dropped_for_refresh_in_the_books():
    cfg = _actor_cfg(refresh_lag=0)
    ledger = Ledger(16, 3, 64)
    budget = Budget(cfg.total_env_steps)
    inc = Incarnation(cfg, 0, ledger, ChaosCounts(), threading.Lock())
    sink = type("T", (), {"add_episodes": lambda self, eps, used: None})()
    assert inc.produce(_snap(cfg, 0), budget, sink, endpoint=None, wait_hung=lambda: None,
                       newest=_newest_after(3, 0, 1))
    assert ledger.produced == 9 and ledger.dropped["refresh"] == 9 and ledger.in_hand == 0
    assert budget.used == 9  # the rest of the rollout's reservation went back
    assert inc.in_hand == [] and inc.stats.refreshes == 1
    # each stream passes the skipped range: neither lost (sent - arrived) nor claimable by a later arrival
    assert ledger.lost(0) == 0 and all(s.sent == 16 for s in ledger.streams.values()) and len(ledger.streams) == 3


def _latency(runner, **over):
    base = {"actors": 2, "total_env_steps": 8192, "env": {"id": "laglab/Latency-v0", "latency_ms": [0.5]},
            "actor": {"envs_per_actor": 4, "rollout_len": 16, "refresh_lag": 0},
            "learner": {"batch_size": 256, "minibatches": 2, "epochs": 1},
            "runner": {"name": runner}, "tracking": {"console_every_s": 1e9, "wandb": {"mode": "disabled"}}}
    return validate(OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.create(base), OmegaConf.create(over)))


@pytest.mark.parametrize("runner", ["thread", "process", "ray"])
def test_forced_refresh_on_a_runner_keeps_exact_books_and_reports_per_actor(tmp_path, runner):
    if runner == "ray":
        pytest.importorskip("ray")
        import conftest
        conftest.ray_up()
    s = run(_latency(runner), tmp_path)
    t = s["transport"]
    assert t["balanced"] and t["worst_unaccounted_at_update"] == 0
    # two actors of 32 ms rollouts and a learner publishing every 4 rollouts: publications land mid-rollout
    assert t["dropped"].get("refresh", 0) > 0
    actors = pd.read_parquet(tmp_path / "actors.parquet")
    last = actors.sort_values("update").groupby("actor").tail(1)
    assert last["refreshes"].sum() > 0 and (last["snapshot_s"] > 0).all()
    assert last["discarded_steps"].sum() <= t["dropped"]["refresh"]  # (the last rows are read at an update)


def test_the_throttle_counts_timesteps_as_the_credit_watermark_does():
    """A discarded rollout advances the streams by a whole rollout; the credit the learner gives is the watermark
    (t_end + 1) x envs, so the actor's side of the lead counts the skipped timesteps too (else every discard would
    loosen max_lead_steps for good)."""
    cfg = _actor_cfg(refresh_lag=0)
    actor = Actor(cfg, 0, 1)
    actor.load(_snap(cfg, 0))
    ro = actor.collect(newest=_newest_after(5, 0, 1))
    assert ro.padding == (16 - 5) * 3
    actor.load(_snap(cfg, 1))
    full = actor.collect(newest=lambda: 1)
    watermark = (full.fragments[0].id.t_end + 1) * 3  # what learner.take credits once these arrive
    assert ro.steps + ro.padding + full.steps == watermark


def test_under_a_fixed_lag_the_kl_cap_syncs_the_actors_instead_of_starving_the_learner(tmp_path):
    s = run(_small(actor={"fixed_lag": 2}, learner={"lr": 0.01, "max_kl_behavior": 2e-3}), tmp_path)
    t = s["transport"]
    assert t["balanced"] and t["kl_forced_publications"] > 0
    assert t["admitted"] > 0.5 * t["produced"]  # it trains: capped data is replaced by fresh data
    df = pd.read_parquet(tmp_path / "metrics.parquet")
    assert df["lag/mean"].mean() < 2  # the lag is reset on a sync and grows back towards 2


def test_a_saved_config_of_an_older_laglab_is_read_in_todays_keys(tmp_path):
    from laglab.config import upgrade_saved
    from laglab.evaluate import run_config
    old = OmegaConf.to_container(OmegaConf.structured(Config), resolve=True, enum_to_str=True)
    old["learner"].pop("lr_schedule")
    old["learner"]["anneal_lr"] = False
    (tmp_path / ".hydra").mkdir()
    OmegaConf.save(OmegaConf.create(old), tmp_path / ".hydra" / "config.yaml")
    assert run_config(tmp_path).learner.lr_schedule.value == "constant"  # evaluate.py reads old runs
    assert upgrade_saved(OmegaConf.create({"learner": {"anneal_lr": True}})).learner.lr_schedule == "linear"


def test_a_diverged_update_is_said_once_and_kept_for_the_summary(caplog):
    cfg = cfg_of()
    ln = Learner(cfg, env_spec(cfg))
    ln.update(_frags())
    assert ln.diverged_at is None
    with torch.no_grad():
        ln.model.pi[0].weight[0, 0] = float("nan")  # what a step too large leaves behind
    with caplog.at_level("WARNING", logger="laglab"):
        ln.update(_frags(1))
        ln.update(_frags(2))
    assert ln.diverged_at == 2
    assert sum("non-finite loss" in r.getMessage() for r in caplog.records) == 1  # said once, not per update


def test_the_summary_says_whether_the_policy_diverged(tmp_path):
    s = run(_small(), tmp_path)
    assert "diverged_at_update" in s and s["diverged_at_update"] is None


def test_a_ray_actor_looks_at_the_board_several_times_a_rollout():
    """A look takes the answer to the previous look's question: a 16-step rollout looked at only at steps 0 and 8
    saw publications only in the round trip after its start (the Ray case above then saw no refresh at all)."""
    from laglab.runners.ray_actor import stale_check_every

    for T in (1, 3, 16, 64, 256, 4096):
        every = stale_check_every(T)
        looks = len(range(0, T, every))
        assert looks >= min(T, 4) and every <= 8
