"""Tracking: what an offline W&B run holds (read back with `wandb leet inspect --json`), agreement with the
parquet store, disabled mode, multirun groups, and runs that are killed mid-way."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from laglab.tracking import resolve_wandb_mode

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["total_env_steps=8192", "learner.batch_size=512", "learner.minibatches=2", "learner.epochs=2",
         "actor.envs_per_actor=4", "actor.rollout_len=16", "actors=2"]


def train(*args, check=True, **kw):
    p = subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=300, **kw)
    if check:
        assert p.returncode == 0, p.stderr[-3000:]
    return p


def inspect(run_dir: Path):
    (wb,) = list((run_dir / "wandb").glob("offline-run-*"))
    out = subprocess.run(["wandb", "leet", "inspect", "--json", str(wb)], capture_output=True, text=True, check=True)
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("offline")
    train(*SMALL, "tracking.wandb.mode=offline", "tracking.log_interval_s=0", "tracking.hist_every=2",
          f"hydra.run.dir={d}")
    return d


def test_offline_history_has_every_group_with_env_steps_as_x_axis(offline_run):
    records = inspect(offline_run)
    metric = [r["metric"] for r in records if r["type"] == "metric"]
    assert {"name": "env_steps", "options": {"defined": True}} in metric
    assert any(m.get("glob_name") == "*" and m.get("step_metric") == "env_steps" for m in metric)
    run = next(r["run"] for r in records if r["type"] == "run")
    assert run["job_type"] == "ppo"
    assert run["config"]["update"]["learner"]["batch_size"] == 512  # the resolved config
    rows = [r["history"]["item"] for r in records if r["type"] == "history"]
    keys = set().union(*rows)
    for k in ["env_steps", "update", "charts/episodic_return_mean", "charts/episodic_return", "charts/episode_length",
              "charts/sps", "charts/lr", "losses/policy_loss", "losses/value_loss", "losses/entropy",
              "losses/approx_kl", "losses/clip_frac", "losses/dual_clip_frac", "losses/explained_variance",
              "lag/min", "lag/mean", "lag/max", "lag/kept_frac", "lag/kl_behavior", "transport/queue_depth",
              "transport/queue_bytes", "transport/admitted", "transport/dropped", "transport/rejected",
              "learner/wait_s", "learner/compute_s", "learner/updates_per_s",
              "actor/0/sps", "actor/1/episodes", "actor/0/version", "actor/1/lag", "actor/0/env_s",
              "actor/0/infer_s", "actor/0/throttle_s", "actor/0/blocked_s"]:
        assert k in keys, k
    hist_rows = [r for r in rows if "lag/version_lag._type" in r]
    assert hist_rows and all(r["lag/version_lag._type"] == "histogram" for r in hist_rows)
    assert any("transport/age_s._type" in r for r in rows)
    assert len(hist_rows) == 8  # 16 updates, every 2nd


def test_wandb_scalars_agree_with_metrics_parquet(offline_run):
    rows = [r["history"]["item"] for r in inspect(offline_run) if r["type"] == "history" and "update" in r["history"]["item"]]
    df = pd.read_parquet(offline_run / "metrics.parquet").set_index("update")
    assert len(rows) == len(df) == 16  # log_interval_s=0: one W&B row per update
    for r in rows:
        p = df.loc[r["update"]]
        assert r["env_steps"] == p["env_steps"]
        for k in ["losses/policy_loss", "losses/approx_kl", "lag/mean", "transport/queue_depth", "charts/sps"]:
            assert r[k] == pytest.approx(p[k], rel=1e-6, abs=1e-9), k
    hist = pd.read_parquet(offline_run / "histograms.parquet")
    assert set(hist["metric"]) == {"lag/version_lag", "transport/age_s", "transport/coverage"}
    cov = hist[hist["metric"] == "transport/coverage"].iloc[-1]["values"]
    assert len(cov) == 8 and sum(cov) == df.iloc[-1]["transport/admitted"]  # 2 actors x 4 envs
    actors = pd.read_parquet(offline_run / "actors.parquet")
    assert set(actors["actor"]) == {0, 1} and len(actors) == 32
    s = json.loads((offline_run / "summary.json").read_text())
    assert s["wandb"]["mode"] == "offline" and s["status"] == "completed"


def test_disabled_writes_no_wandb_files(tmp_path):
    train(*SMALL, "tracking.wandb.mode=disabled", f"hydra.run.dir={tmp_path}")
    assert not (tmp_path / "wandb").exists()
    assert (tmp_path / "metrics.parquet").exists() and "wandb" not in json.loads((tmp_path / "summary.json").read_text())


def test_auto_mode_is_offline_without_credentials_and_online_with(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "empty-netrc"))
    (tmp_path / "empty-netrc").write_text("")
    assert resolve_wandb_mode("auto") == "offline"
    (tmp_path / "empty-netrc").write_text("machine api.wandb.ai login user password abc\n")
    assert resolve_wandb_mode("auto") == "online"
    (tmp_path / "empty-netrc").write_text("")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert resolve_wandb_mode("auto") == "online"
    assert resolve_wandb_mode("disabled") == "disabled"


def test_multirun_is_one_group_and_finishes_every_run(tmp_path):
    sweep = tmp_path / "sweep"
    train("-m", *SMALL, "total_env_steps=1024", "seed=0,1", "tracking.wandb.mode=offline",
          f"hydra.sweep.dir={sweep}")
    runs = sorted(p for p in sweep.iterdir() if (p / "summary.json").exists())
    assert len(runs) == 2
    for r in runs:
        records = inspect(r)
        run = next(x["run"] for x in records if x["type"] == "run")
        assert run["run_group"] == str(sweep)
        assert any(x["type"] == "exit" for x in records)  # each W&B run was finished


def test_a_killed_run_leaves_readable_metrics_and_an_interrupted_summary(tmp_path):
    p = subprocess.Popen([sys.executable, "train.py", "total_env_steps=5000000", "tracking.flush_every_s=0",
                          "tracking.wandb.mode=disabled", f"hydra.run.dir={tmp_path}"], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "metrics.parquet").exists():  # wait for a condition, not for a guess
            assert p.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        p.send_signal(signal.SIGTERM)
        p.wait(60)
    finally:
        p.kill()
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == "interrupted" and s["env_steps"] < 5_000_000
    assert len(pd.read_parquet(tmp_path / "metrics.parquet")) >= 1
    assert (tmp_path / "checkpoints" / "final.pt").exists()


def test_best_return_is_never_below_final_when_the_last_episodes_are_the_best(tmp_path):
    """One definition: final = mean of the last return_window episodes at the end; best = the maximum of that
    same rolling mean over the run, evaluated after every episode. Episodes that finish after the last logged
    update (here the run's best) count for both."""
    from laglab.actor import Episode
    from laglab.config import TrackingConfig
    from laglab.tracking import Tracker

    cfg = TrackingConfig(return_window=4, progress=False)
    cfg.wandb.mode = "disabled"
    t = Tracker(tmp_path, cfg, total_env_steps=100)
    steps = 0
    for ret in [10, 20, 30, 40, 50, 60, 70, 80]:
        steps += 10
        t.add_episodes([Episode(0, 0, float(ret), 10)], steps)
        if ret % 20 == 0:
            t.log_update({}, steps)
    t.add_episodes([Episode(0, 0, 200.0, 10), Episode(0, 1, 300.0, 10)], steps)  # after the last update
    s = t.finish({"status": "completed"})
    assert s["final_return_mean"] == pytest.approx((70 + 80 + 200 + 300) / 4)
    assert s["best_return_mean"] >= s["final_return_mean"]
    assert s["best_return_mean"] == s["final_return_mean"]
    assert json.loads((tmp_path / "summary.json").read_text())["return_window"] == 4


def test_a_run_that_ends_while_wandb_is_still_starting_names_its_wandb_run(tmp_path):
    """An offline W&B starts in the background; a run that ends before it is up (a short run, an early failure,
    Ctrl-C) waits for it, so summary.json and the footer still name the run and the rows logged meanwhile."""
    from laglab.config import TrackingConfig, WandbConfig
    from laglab.tracking import Tracker

    t = Tracker(tmp_path, TrackingConfig(wandb=WandbConfig(mode="offline"), log_interval_s=0), 100, {}, "ppo",
                None, wandb_background=True)
    assert not t.wandb.wait(0)  # still starting: what is logged now waits for it
    t.log_update({"losses/policy_loss": 0.5}, env_steps=64)
    s = t.finish({"status": "completed"})
    assert "error" not in s["wandb"] and Path(s["wandb"]["run_path"]).is_dir(), s["wandb"]
    rows = [r["history"]["item"] for r in inspect(tmp_path) if r["type"] == "history"]
    assert any(r.get("losses/policy_loss") == 0.5 and r.get("env_steps") == 64 for r in rows), rows


def test_a_background_wandb_start_waits_for_the_actors_to_be_started(tmp_path, monkeypatch):
    """W&B's offline init holds the GIL the learner's thread needs to start the actors: it begins only once they are
    started, once the run waits for W&B (its end), or after tracking.BACKGROUND_AFTER_S."""
    import dataclasses

    from laglab import timeline, tracking
    from laglab.config import TrackingConfig

    cfg = TrackingConfig()
    cfg = dataclasses.replace(cfg, wandb=dataclasses.replace(cfg.wandb, mode="offline"))
    began = []
    monkeypatch.setattr(tracking.WandbSink, "_start", lambda self: began.append(timeline.get("actors_started")))
    monkeypatch.setattr(tracking, "BACKGROUND_AFTER_S", 60.0)
    timeline.reset()
    try:
        sink = tracking.WandbSink(cfg, tmp_path, {}, "train", None, background=True)
        assert not sink._ready.wait(0.5) and began == []  # (the stub returns at once: only the wait holds it)
        timeline.mark("actors_started")
        assert sink.wait(30) and began == [timeline.get("actors_started")]
        timeline.reset()  # a run that ends before its actors start: waiting for W&B (its finish) starts it at once
        late = tracking.WandbSink(cfg, tmp_path, {}, "train", None, background=True)
        assert late.wait(30) and began[-1] is None
        monkeypatch.setattr(tracking, "BACKGROUND_AFTER_S", 0.05)  # nothing marks it, nothing waits: it starts
        timeline.reset()
        later = tracking.WandbSink(cfg, tmp_path, {}, "train", None, background=True)
        assert later._ready.wait(30) and began[-1] is None
    finally:
        timeline.reset()


def test_calls_parquet_keeps_the_first_calls_and_counts_the_rest(tmp_path, monkeypatch):
    # a Ray run's calls.parquet is bounded (CALLS_MAX_ROWS): the first calls kept, in columns, the rest counted in
    # summary.json; it is rewritten only when it grew (a crashed run keeps what was flushed)
    import laglab.tracking as T
    from laglab.config import TrackingConfig

    monkeypatch.setattr(T, "CALLS_MAX_ROWS", 3)
    cfg = TrackingConfig(progress=False)
    cfg.wandb.mode = "disabled"
    t = T.Tracker(tmp_path, cfg, total_env_steps=100)
    row = dict(actor=1, incarnation=2, version=3, board_version=3, asked=0.1, answered=0.2, stepping=0.3, ended=0.4,
               received=0.5)
    t.add_call(row)
    t.flush()
    first = (tmp_path / "calls.parquet").stat().st_mtime_ns
    t.flush()  # (nothing new: not rewritten)
    assert (tmp_path / "calls.parquet").stat().st_mtime_ns == first
    for i in range(4):
        t.add_call({**row, "actor": 10 + i})
    s = t.finish({"status": "completed"})
    calls = pd.read_parquet(tmp_path / "calls.parquet")
    assert calls["actor"].tolist() == [1, 10, 11] and calls["board_version"].dtype == "int64"
    assert calls[["asked", "received"]].iloc[0].tolist() == [0.1, 0.5]
    assert s["calls"] == {"kept": 3, "unkept": 2}

