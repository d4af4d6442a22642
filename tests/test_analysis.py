"""analysis/: statistics against hand-computed values, and a small real sweep through load -> measures ->
statistics -> figures -> HTML, opened in a headless browser as a person would."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.measures import auc, first_reach  # noqa: E402
from analysis.stats import bootstrap_ci, iqm, mean, probability_of_improvement  # noqa: E402


def test_iqm_is_the_mean_of_the_middle_half():
    assert iqm([1, 2, 3, 4, 5, 6, 7, 8]) == 4.5  # middle four: 3, 4, 5, 6
    assert iqm([100, 1, 2, 3]) == 2.5  # 1 of 4 trimmed at each end: the outlier does not count
    assert iqm([3.0, float("nan"), 3.0]) == 3.0 and np.isnan(iqm([]))


def test_bootstrap_ci_matches_the_exact_bootstrap_distribution():
    # mean of 4 draws from [1, 1, 1, 5]: the number of 5s is Binomial(4, 1/4), so the mean is 1, 2, 3, 4, 5 with
    # probabilities .316, .422, .211, .047, .004: its 2.5th and 97.5th percentiles are 1 and 4
    assert bootstrap_ci([1, 1, 1, 5], mean, reps=20000) == (1.0, 4.0)
    assert bootstrap_ci([7.0] * 5) == (7.0, 7.0)
    # stratified by task: each resample keeps two runs of each task, so the mean cannot move
    assert bootstrap_ci([0, 0, 10, 10], mean, strata=["a", "a", "b", "b"], reps=2000) == (5.0, 5.0)
    lo, hi = bootstrap_ci([0, 0, 10, 10], mean, reps=2000)
    assert lo < 5 < hi


def test_probability_of_improvement_counts_pairs():
    # pairs (x, y): x=3 beats both 2s, x=2 ties both: (2 + 0.5 * 2) / 6
    assert probability_of_improvement([1, 2, 3], [2, 2]) == 0.5
    assert probability_of_improvement([5, 6], [1, 2]) == 1.0 and probability_of_improvement([1], [1]) == 0.5


def test_auc_is_the_mean_return_per_env_step():
    assert auc(np.array([0, 10, 20]), np.array([0.0, 10.0, 10.0])) == 7.5  # (50 + 100) / 20
    assert auc(np.array([0, 10, 20]), np.array([np.nan, 0.0, 10.0])) == 5.0  # before any episode: left out
    df = pd.DataFrame({"env_steps": [1, 2, 3], "wall_time": [0.5, 1.0, 1.5], "episodic_return_mean": [1, 9, 3]})
    assert first_reach(df, 5) == {"steps_to_threshold": 2.0, "time_to_threshold": 1.0}
    assert np.isnan(first_reach(df, 10)["steps_to_threshold"])


def test_kl_behavior_is_never_negative_even_from_runs_logged_with_float_noise(tmp_path):
    from analysis.measures import run_measures

    pd.DataFrame({"update": [1, 2], "env_steps": [10, 20], "wall_time": [0.1, 0.2],
                  "episodic_return_mean": [1.0, 2.0], "lag/mean": [0.0, 0.0], "lag/max": [0.0, 0.0],
                  "lag/kl_behavior": [-2.96e-09, -1e-10]}).to_parquet(tmp_path / "metrics.parquet")
    assert run_measures(str(tmp_path), "CartPole-v1")["kl_behavior"] == 0.0


# ---- a small real sweep -----------------------------------------------------------------------------------
def _train(*args):
    p = subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep")
    _train("-m", "env=tagged", "runner=sync", "actors=2", "total_env_steps=6144", "learner.batch_size=512",
           "algo=ppo,vtrace", "seed=0,1", "tracking.wandb.mode=disabled", f"hydra.sweep.dir={d / 'multirun'}")
    return d


def _report(*args):
    return subprocess.run([sys.executable, "-m", "analysis.report", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_a_sweep_becomes_tables_figures_and_a_report(sweep, tmp_path):
    out = tmp_path / "report"
    p = _report(sweep / "multirun", "--out", out)
    assert p.returncode == 0, p.stderr
    runs = pd.read_csv(out / "runs.csv")
    assert len(runs) == 4 and runs["used"].all() and (runs["status"] == "completed").all()
    assert runs["provenance.git_commit"].notna().all() and runs["auc"].notna().all()
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary["cfg.algo.name"]) == ["ppo", "vtrace"] and (summary["runs"] == 2).all()
    for m in ("auc", "final_return", "sps", "lag_mean"):
        assert (summary[f"{m}_ci_low"] <= summary[f"{m}_iqm"]).all() and (summary[f"{m}_iqm"] <= summary[f"{m}_ci_high"]).all()
    # the group IQM of two runs is their mean, computed here from runs.csv
    for algo, g in runs.groupby("cfg.algo.name"):
        assert summary.set_index("cfg.algo.name").loc[algo, "auc_iqm"] == pytest.approx(g["auc"].mean())
    html = (out / "report.html").read_text()
    assert html.count('src="data:image/png;base64,') >= 4 and "cfg.algo.name" in html
    assert "python -m analysis.report" in (out / "report.md").read_text()
    assert len(list((out / "figures").glob("*.png"))) >= 4


def test_failed_runs_are_listed_but_left_out_and_mixed_envs_are_refused(sweep, tmp_path):
    runs = sorted(p.parent for p in (sweep / "multirun").rglob("summary.json"))
    failed = tmp_path / "failed_copy"
    shutil.copytree(runs[0], failed)
    s = json.loads((failed / "summary.json").read_text())
    s["status"] = "failed"
    (failed / "summary.json").write_text(json.dumps(s))
    p = _report(sweep / "multirun", failed, "--out", tmp_path / "r1")
    assert p.returncode == 0, p.stderr
    t = pd.read_csv(tmp_path / "r1" / "runs.csv")
    assert len(t) == 5 and t.loc[t["status"] == "failed", "used"].tolist() == [False]
    other = tmp_path / "cartpole"
    _train("runner=sync", "total_env_steps=2048", "tracking.wandb.mode=disabled", f"hydra.run.dir={other}")
    p = _report(sweep / "multirun", other, "--out", tmp_path / "r2")
    assert p.returncode == 2 and "different env ids" in p.stderr and "--allow-mixed" in p.stderr
    assert _report(sweep / "multirun", other, "--out", tmp_path / "r3", "--allow-mixed").returncode == 0
    p = _report(tmp_path / "nothing_here", "--out", tmp_path / "r4")
    assert p.returncode == 2 and "no such run or sweep dir" in p.stderr


def _chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(not _chromium() and not os.environ.get("CI"), reason="headless Chromium not installed")
def test_the_html_report_renders_in_a_browser_with_its_figures(sweep, tmp_path):
    out = tmp_path / "report"
    assert _report(sweep / "multirun", "--out", out).returncode == 0
    shot = tmp_path / "shot.png"
    dump = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                           f"file://{out / 'report.html'}"], capture_output=True, text=True, timeout=120)
    assert dump.returncode == 0 and dump.stdout.count("<img") >= 4 and "laglab report" in dump.stdout
    subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
                    "--window-size=1200,2400", f"file://{out / 'report.html'}"], capture_output=True, timeout=120)
    from PIL import Image

    img = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert img.shape[0] >= 1000 and img.std() > 10  # a page with content (text, tables and plots), not blank


# ---- queue lab ---------------------------------------------------------------------------------------------
def test_fluid_queue_grows_and_drains_as_predicted():
    from analysis.queue_lab import age_at_departure, backlog, drain_time

    t = np.arange(0, 6)
    assert backlog(t, 4, 3, 4).tolist() == [4, 5, 6, 7, 8, 9]  # arrival 4 / service 3 from 4: +1 per unit time
    assert backlog(t, 2, 3, 4).tolist() == [4, 3, 2, 1, 0, 0] and drain_time(2, 3, 4) == 4  # drains in four
    assert backlog(t, 4, 3, 4, capacity=6).tolist() == [4, 5, 6, 6, 6, 6]  # at capacity the policy takes the rest
    # by hand: growing, the item leaving at t=4 is arrival number 8 (12 served - 4 initial), which came at t=2,
    # when 6 were ahead of it: 6 / 3 = 2; draining, the one leaving at t=2 came at t=1 behind 3: 3 / 3 = 1
    assert age_at_departure(np.array([1.0, 4.0]), 4, 3, 4).tolist() == [1.0, 2.0]
    assert age_at_departure(np.array([2.0, 5.0]), 2, 3, 4).tolist() == [1.0, 0.0]


def test_queue_lab_reads_a_stalled_run(tmp_path):
    from analysis.queue_lab import run_check

    _train("env=tagged", "runner=thread", "actors=2", "total_env_steps=8192", "learner.batch_size=512",
           "chaos=faults", "chaos.kill_every_steps=null", "chaos.stall_every_updates=4", "chaos.stall_s=0.3",
           "transport.capacity=16", "tracking.wandb.mode=disabled", f"hydra.run.dir={tmp_path}")
    r = run_check(tmp_path)
    assert r["stalls"] >= 3 and r["arrival_rate"] > 0 and r["service_rate"] > r["arrival_rate"] * 0.1
    assert r["measured_mean_depth"] > 0 and r["littles_law_depth"] > 0 and np.isfinite(r["ratio"])
    assert r["max_depth"] <= 16


def test_a_sweep_through_the_submitit_launcher_runs_jobs_in_parallel_processes(tmp_path):
    # Hydra's submitit launcher (local executor here; submitit_slurm on a cluster), with actor processes inside
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    _train("-m", "hydra/launcher=submitit_local", "env=tagged", "runner=process", "actors=2", "total_env_steps=2048",
           "learner.batch_size=512", "seed=0,1", "tracking.wandb.mode=disabled", f"hydra.sweep.dir={tmp_path / 's'}")
    runs = sorted(p.parent for p in (tmp_path / "s").rglob("summary.json"))
    assert len(runs) == 2
    for r in runs:
        s = json.loads((r / "summary.json").read_text())
        assert s["status"] == "completed" and s["runner"] == "process" and s["transport"]["balanced"]
    assert (tmp_path / "s" / ".submitit").is_dir()  # the jobs went through submitit
    assert _report(tmp_path / "s", "--out", tmp_path / "r").returncode == 0
