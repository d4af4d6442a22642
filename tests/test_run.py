"""Whole runs, small: run dir contents, accounting, determinism of the sync baseline, staleness controls."""
import json
import os
import subprocess
import sys

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from laglab.config import Config, validate
from laglab.run import run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

REQUIRED_COLUMNS = ["env_steps", "wall_time", "episodic_return_mean", "losses/policy_loss", "losses/value_loss",
                    "losses/entropy", "losses/approx_kl", "losses/clip_frac", "losses/dual_clip_frac",
                    "lag/min", "lag/mean", "lag/max", "transport/queue_depth"]
REQUIRED_SUMMARY = ["env_steps", "updates", "final_return_mean", "best_return_mean", "sps", "wall_time_s", "algo",
                    "actors", "seed"]


def cfg_of(**over) -> Config:
    small = {"total_env_steps": 8192, "actor": {"envs_per_actor": 4, "rollout_len": 16},
             "learner": {"batch_size": 512, "minibatches": 2, "epochs": 2},
             "tracking": {"console_every_s": 1e9, "wandb": {"mode": "disabled"}}}
    return validate(OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.create(small), OmegaConf.create(over)))


def test_train_py_writes_a_complete_run_dir(tmp_path):
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "train.py", "total_env_steps=4096", "learner.batch_size=512",
                        "algo=vtrace_dual_clip", "actors=2", f"hydra.run.dir={out}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert (out / ".hydra" / "config.yaml").exists()
    assert (out / "checkpoints" / "final.pt").exists()
    df = pd.read_parquet(out / "metrics.parquet")
    assert set(REQUIRED_COLUMNS) <= set(df.columns)
    assert len(df) == 8 and df["env_steps"].is_monotonic_increasing and df["wall_time"].is_monotonic_increasing
    s = json.loads((out / "summary.json").read_text())
    assert set(REQUIRED_SUMMARY) <= set(s)
    assert s["status"] == "completed" and s["algo"] == "vtrace_dual_clip" and s["actors"] == 2 and s["updates"] == 8
    assert s["env_steps"] <= 4096
    state = torch.load(out / "checkpoints" / "final.pt", weights_only=True)  # no pickle of arbitrary objects
    assert state["version"] == 8


@pytest.mark.parametrize("runner", ["thread", "sync"])
def test_every_transition_is_accounted_for(tmp_path, runner):
    s = run(cfg_of(runner={"name": runner}), tmp_path)
    t = s["transport"]
    assert t["produced"] == s["env_steps"] > 0
    assert t["produced"] == t["admitted"] + sum(t["dropped"].values()) + sum(t["rejected"].values()) + t["in_flight"]
    assert t["balanced"]
    assert t["admitted"] == s["updates"] * 512


def test_sync_runner_is_on_policy_and_deterministic(tmp_path):
    a = run(cfg_of(runner={"name": "sync"}, seed=3), tmp_path / "a")
    b = run(cfg_of(runner={"name": "sync"}, seed=3), tmp_path / "b")
    da, db = pd.read_parquet(tmp_path / "a" / "metrics.parquet"), pd.read_parquet(tmp_path / "b" / "metrics.parquet")
    assert (da["lag/max"] == 0).all()
    cols = ["losses/policy_loss", "losses/value_loss", "losses/approx_kl", "episodic_return_mean"]
    pd.testing.assert_frame_equal(da[cols], db[cols])
    c = run(cfg_of(runner={"name": "sync"}, seed=4), tmp_path / "c")
    assert not da["losses/value_loss"].equals(pd.read_parquet(tmp_path / "c" / "metrics.parquet")["losses/value_loss"])
    assert a["final_return_mean"] == b["final_return_mean"] and c["env_steps"] == a["env_steps"]


def test_max_policy_lag_zero_trains_only_on_fresh_data(tmp_path):
    s = run(cfg_of(learner={"max_policy_lag": 0}, total_env_steps=16384), tmp_path)
    df = pd.read_parquet(tmp_path / "metrics.parquet")
    assert (df["lag/max"] == 0).all()
    assert s["transport"]["balanced"]
    assert s["transport"]["dropped"].get("lag", 0) > 0  # four free-running actors do produce stale data
    assert (df["lag/kept_frac"] <= 1).all() and df["lag/kept_frac"].min() < 1


def test_max_lead_steps_bounds_the_lag(tmp_path):
    # each actor may run at most one rollout (64 steps) ahead of what the learner consumed of its data,
    # so a batch of 512 = 4 actors x 2 rollouts is never more than one version old
    s = run(cfg_of(actor={"max_lead_steps": 128}), tmp_path)
    df = pd.read_parquet(tmp_path / "metrics.parquet")
    assert df["lag/max"].max() <= 1
    assert sum(a["throttle_s"] for a in s["actors_stats"].values()) > 0
    run(cfg_of(), tmp_path / "free")
    assert pd.read_parquet(tmp_path / "free" / "metrics.parquet")["lag/max"].max() >= df["lag/max"].max()


@pytest.mark.parametrize("env,runner", [("pendulum", "thread"), ("pendulum", "sync"), ("hopper", "thread")])
def test_continuous_presets_run_end_to_end(tmp_path, env, runner):
    if env == "hopper":
        pytest.importorskip("mujoco")
    from hydra import compose, initialize_config_dir

    from laglab.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=os.path.join(ROOT, "conf"), version_base="1.3"):
        c = validate(compose(config_name="config", overrides=[
            f"env={env}", f"runner={runner}", "algo=vtrace_dual_clip", "actors=2", "total_env_steps=4096",
            "learner.batch_size=1024", "learner.minibatches=4", "learner.epochs=2", "tracking.console_every_s=1e9"]))
    s = run(c, tmp_path)
    assert s["updates"] == 4 and s["transport"]["balanced"]
    df = pd.read_parquet(tmp_path / "metrics.parquet")
    assert df[["losses/policy_loss", "losses/value_loss", "losses/entropy"]].notna().all().all()
    state = torch.load(tmp_path / "checkpoints" / "final.pt", weights_only=True)
    assert state["obs_count"] == pytest.approx(4 * 1024, abs=1)  # the normalizer saw every trained transition
    assert state["reward_count"] == pytest.approx(4 * 1024, abs=1)  # ... and so did the reward scale


def test_sync_runner_takes_any_actor_count_and_keeps_every_batch_on_one_version(tmp_path):
    # 8 actors x 4 envs x 16 steps = 512 steps a round, batch 256: half the actors fill one batch;
    # 3 actors (192 a round) do not divide the batch: a batch takes whole rollouts of some envs of an actor
    for actors in (8, 3):
        s = run(cfg_of(runner={"name": "sync"}, actors=actors, learner={"batch_size": 256}), tmp_path / str(actors))
        df = pd.read_parquet(tmp_path / str(actors) / "metrics.parquet")
        assert (df["lag/max"] == 0).all() and (df["lag/kl_behavior"].abs() < 1e-5).all()
        assert s["updates"] == 8192 // 256 and s["transport"]["balanced"]
        cov = s["transport"]["coverage"]  # round robin: every env instance of every actor contributed
        assert len(cov) == actors * 4 and max(cov.values()) - min(cov.values()) <= 16 * 2


def test_sync_plan_visits_env_instances_round_robin():
    from laglab.runners.sync import plan

    assert plan(0, 6, 2, 4) == ([(0, [0, 1, 2, 3]), (1, [0, 1])], 6)
    assert plan(6, 4, 2, 4) == ([(1, [2, 3]), (0, [0, 1])], 2)
    assert plan(1, 9, 1, 4) == ([(0, [1, 2, 3, 0]), (0, [1, 2, 3, 0]), (0, [1])], 2)  # an env once per rollout


def test_max_policy_lag_of_broadcast_every_minus_one_trains_on_every_snapshot(tmp_path):
    s = run(cfg_of(learner={"broadcast_every": 3, "max_policy_lag": 2}), tmp_path)
    df = pd.read_parquet(tmp_path / "metrics.parquet")
    assert s["updates"] >= 8 and df["lag/max"].max() <= 2 and s["transport"]["balanced"]


@pytest.mark.parametrize("env", ["pendulum", "halfcheetah"])
def test_sync_run_with_normalization_is_exactly_on_policy_at_every_update(tmp_path, env):
    # the learner normalizes with the statistics the data was collected with, so pi/mu = 1 before any step
    if env == "halfcheetah":
        pytest.importorskip("mujoco")
    from hydra import compose, initialize_config_dir

    from laglab.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=os.path.join(ROOT, "conf"), version_base="1.3"):
        c = validate(compose(config_name="config", overrides=[
            f"env={env}", "runner=sync", "actors=2", "total_env_steps=8192", "learner.batch_size=1024",
            "learner.epochs=2", "policy.log_std_init=-2.0", "tracking.console_every_s=1e9",
            "tracking.wandb.mode=disabled"]))
    run(c, tmp_path)
    df = pd.read_parquet(tmp_path / "metrics.parquet")
    assert len(df) == 8
    assert (df["lag/kl_behavior"].abs() < 1e-4).all(), df["lag/kl_behavior"].tolist()
    state = torch.load(tmp_path / "checkpoints" / "final.pt", weights_only=True)
    assert state["obs_count"] == pytest.approx(8 * 1024, abs=1)  # statistics from every trained transition


def test_a_resumed_run_continues_incarnations_and_refuses_a_checkpoint_that_does_not_fit(tmp_path):
    from laglab.config import ConfigError
    from laglab.run import check_resume, env_spec

    a = run(cfg_of(runner={"name": "sync"}, actors=2), tmp_path / "a")
    first_b = torch.load(tmp_path / "a" / "checkpoints" / "final.pt", weights_only=True)["next_incarnation"]
    assert first_b == 3  # incarnations 1 and 2 were used
    b = run(cfg_of(runner={"name": "sync"}, actors=2, resume=str(tmp_path / "a"), total_env_steps=16384),
            tmp_path / "b")
    assert sorted(int(k.split("/")[0]) for k in b["transport"]["coverage"]) == [0] * 4 + [1] * 4
    assert b["transport"]["balanced"] and b["start_env_steps"] == a["env_steps"]
    assert torch.load(tmp_path / "b" / "checkpoints" / "final.pt", weights_only=True)["next_incarnation"] == 5
    for over, key in [({"env": {"id": "Acrobot-v1"}}, "env.id"), ({"policy": {"hidden_sizes": [32]}},
                                                                   "policy.hidden_sizes"),
                      ({"algo": {"name": "vtrace"}}, "algo.name")]:
        bad = cfg_of(resume=str(tmp_path / "a"), **over)
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            check_resume(bad, env_spec(bad))
    p = subprocess.run([sys.executable, "train.py", f"resume={tmp_path / 'a'}", "env.id=Acrobot-v1",
                        f"hydra.run.dir={tmp_path / 'c'}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "does not fit this run" in p.stderr and "env.id" in p.stderr


@pytest.mark.parametrize("runner", ["sync", "thread", "process"])
def test_fixed_lag_produces_the_lag_it_claims(tmp_path, runner):
    # sync: exactly k once k versions exist; async runners: never fresher than k (k + their own queueing lag)
    s = run(cfg_of(runner={"name": runner}, actor={"fixed_lag": 2}, learner={"batch_size": 256},
                   total_env_steps=8192), tmp_path)
    df = pd.read_parquet(tmp_path / "metrics.parquet")
    assert s["transport"]["balanced"] and len(df) == 32
    later = df.iloc[2:]
    if runner == "sync":
        assert df["lag/max"].tolist()[:2] == [0, 1] and (later["lag/min"] == 2).all() and (later["lag/max"] == 2).all()
    else:
        assert (later["lag/min"] >= 2).all()


@pytest.mark.parametrize("preset,expect", [(None, "1"), ("2", "2")])
def test_train_py_gives_numpys_blas_one_thread_unless_the_user_chose(preset, expect):
    # (set at train.py's import, before numpy loads: the sync runner's recurrent cell ran 2.6x slower on two BLAS
    # threads)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if preset is not None:
        env["OPENBLAS_NUM_THREADS"] = preset
    # numpy's OpenBLAS starts its threads when numpy loads: count the process's threads after a product
    code = ("import runpy, os; runpy.run_path('train.py', run_name='imported'); import numpy as np; "
            "np.ones((256, 256)) @ np.ones((256, 256)); "
            "print(os.environ.get('OPENBLAS_NUM_THREADS'), len(os.listdir('/proc/self/task')))")
    p = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    var, threads = p.stdout.split()
    assert var == expect, p.stdout
    if preset is None:  # one thread in all: numpy loaded after the setting (on two cores OpenBLAS would start two)
        assert threads == "1", p.stdout
