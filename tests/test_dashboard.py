"""Dashboards as code: every panel reads a metric a real (offline) run logged — read back from its W&B log with
`wandb leet inspect`, so a renamed metric fails here, not in a user's dashboard — and the workspace and report are
built offline."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("wandb_workspaces")
from laglab import dashboard  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("wb") / "run"
    p = subprocess.run([sys.executable, "train.py", "actors=2", "total_env_steps=16384", "tracking.wandb.mode=offline",
                        "tracking.log_interval_s=0", "tracking.hist_every=1",
                        # drops (lag) and rejections (corrupted fragments), so the by-reason panels have keys to read:
                        # 2 actors train on lag-1 data in every run; lag 2, which a cap of 1 needed, a CI run once lacked
                        "learner.max_policy_lag=0", "chaos.corrupt_p=0.05", f"hydra.run.dir={d}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return d


def history_keys(run_dir: Path) -> set:
    wb = next((run_dir / "wandb").glob("offline-run-*"))
    p = subprocess.run(["wandb", "leet", "inspect", "--json", str(wb)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    keys = set()
    for line in p.stdout.splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("type") == "history":
            keys |= set(rec["history"]["item"])
    assert keys, "no history records read back"
    return keys


def test_every_panel_reads_a_metric_the_run_logged(offline_run):
    keys = history_keys(offline_run)
    exact, regexes = dashboard.keys_used()
    # (a histogram is logged as <key>._type / .bins / .values)
    missing = [k for k in exact if k not in keys and f"{k}._type" not in keys]
    assert not missing, f"panels read metrics no run logs: {missing}"
    for rx in regexes:
        assert any(re.fullmatch(rx, k) for k in keys), f"no logged metric matches {rx}"
    for p in (p for ps in dashboard.SECTIONS.values() for p in ps):
        assert p.x in keys  # env_steps, _runtime


def test_workspace_and_report_build_offline(tmp_path):
    view = dashboard.to_json(dashboard.workspace("me", "laglab", "multirun/x", ["algo.name"]))
    sections = view["spec"]["section"]["panelBankConfig"]["sections"]
    assert [s["name"] for s in sections] == list(dashboard.SECTIONS)
    n_panels = sum(len(s["panels"]) for s in sections)
    assert n_panels == sum(len(v) for v in dashboard.SECTIONS.values())
    runset = view["spec"]["section"]["runSets"][0]
    assert runset["filters"]["filters"][0]["key"]["name"] == "group"  # the sweep's W&B group ...
    assert runset["filters"]["filters"][0]["value"] == "multirun/x"
    assert [g["name"] for g in runset["grouping"]] == ["algo.value.name"]  # ... grouped by its swept key
    rep = dashboard.to_json(dashboard.report("me", "laglab", "multirun/x", ["algo.name"], "| a |\n|---|\n| 1 |",
                                             offline=True))
    grids = [b for b in rep["spec"]["blocks"] if b.get("type") == "panel-grid"]
    assert len(grids) == len(dashboard.SECTIONS)
    for g in grids:  # the report's runs are grouped by the swept key too, as the workspace's (a config key)
        groupings = [r["grouping"] for r in g["metadata"]["runSets"]]
        assert groupings and all(gr == runset["grouping"] for gr in groupings), groupings


def test_command_line_dry_run_and_a_clear_error_without_an_account(tmp_path):
    p = subprocess.run([sys.executable, "-m", "laglab.dashboard", "--entity", "me", "--project", "laglab",
                        "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "workspace" in json.loads(p.stdout)
    env = {"WANDB_API_KEY": "", "WANDB_MODE": "offline", "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, "-m", "laglab.dashboard", "--entity", "me", "--project", "laglab"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 1 and "needs a W&B account" in p.stderr and "Traceback" not in p.stderr
    p = subprocess.run([sys.executable, "-m", "laglab.dashboard", "--entity", "me", "--project", "laglab",
                        "--runs", str(tmp_path / "nothing"), "--dry-run"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 2 and "no run dirs" in p.stderr


def test_a_sweeps_swept_keys_group_it_but_not_the_seed(tmp_path):
    for i, (algo, seed) in enumerate([("ppo", 0), ("vtrace", 0), ("ppo", 1)]):
        d = tmp_path / str(i) / ".hydra"
        d.mkdir(parents=True)
        (d / "overrides.yaml").write_text(f"- algo={algo}\n- seed={seed}\n- env=cartpole\n- hydra.x=1\n")
    assert dashboard.swept_keys(tmp_path) == ["algo"]
    # with the resolved config next to the overrides, a config group is grouped by what names it
    (tmp_path / "0" / ".hydra" / "config.yaml").write_text("algo:\n  name: ppo\nenv:\n  id: CartPole-v1\n")
    assert dashboard.swept_keys(tmp_path) == ["algo.name"]


def test_a_key_set_on_some_runs_only_is_swept(tmp_path):
    # the KL cap on some runs of a study (the others run its default, null): without grouping by it, capped and
    # uncapped PPO at the same lag and step size would be one line
    for i, extra in enumerate(["- learner.max_kl_behavior=0.02\n", "", ""]):
        d = tmp_path / str(i) / ".hydra"
        d.mkdir(parents=True)
        (d / "overrides.yaml").write_text(f"- seed={i}\n- actor.fixed_lag=8\n" + extra)
    assert dashboard.swept_keys(tmp_path) == ["learner.max_kl_behavior"]
