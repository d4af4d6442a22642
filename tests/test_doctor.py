"""The run doctor: each rule on a run laglab produced with a config that provokes it, and a healthy run that gets a
clean bill. A rule that does not fire on its provoking run fails here."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.doctor import diagnose, main

ROOT = Path(__file__).resolve().parents[1]
QUIET = ["tracking.wandb.mode=disabled", "tracking.console_every_s=1e9", "tracking.progress=false"]
PROVOKE = {
    # the default config on the deterministic runner (the process runner's default run can collapse late on
    # some seeds, which the doctor rightly reports)
    "healthy": ["runner=sync"],
    "kl_behavior": ["runner=sync", "actor.fixed_lag=8", "learner.lr=0.004", "total_env_steps=50000"],
    "loss_explosion": ["runner=sync", "learner.lr=0.5", "learner.lr_schedule=constant", "total_env_steps=20000"],
    "late_jitter": ["runner=sync", "total_env_steps=100000"],  # seed 0 reaches 500, then falls to ~140
    "value_instability": ["runner=sync", "algo.loss.vf_coef=0", "total_env_steps=40000"],
    "lagging_worker": ["env=latency", "env.latency_ms=[1,1,1,20]", "actors=4", "total_env_steps=16384"],
    "parameter_wait": ["policy.hidden_sizes=[512,512]", "actor.rollout_len=4", "actor.envs_per_actor=1",
                       "learner.batch_size=64", "learner.minibatches=1", "learner.epochs=1", "total_env_steps=3000"],
    "queue_age": ["chaos.stall_every_updates=1", "chaos.stall_s=0.4", "total_env_steps=20000"],
    "throughput": ["actors=1", "chaos.hang_every_steps=25000", "runner.heartbeat_timeout_s=3",
                   "total_env_steps=60000"],
    "failed": ["runner=thread", "actors=1", "chaos.kill_every_steps=300", "runner.actors_max_restarts=0"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("doctor")
    for name, ovs in PROVOKE.items():
        p = subprocess.run([sys.executable, "train.py", *ovs, *QUIET, f"hydra.run.dir={root / name}"], cwd=ROOT,
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == (1 if name == "failed" else 0), (name, p.stderr[-2000:])
    return root


def _sev(res):
    return {f["rule"]: f["severity"] for f in res["findings"]}


def test_a_healthy_run_gets_a_clean_bill(runs):
    res = diagnose(runs / "healthy")
    assert res["status"] == "completed" and res["notes"] == []
    # every rule but throughput reads what the run computed; throughput reads its wall clock, which other work on
    # the machine moves (a test must not depend on it): it may watch, never act
    sev = _sev(res)
    assert sev.pop("throughput") in ("ok", "watch")
    assert set(sev.values()) == {"ok"}, [f for f in res["findings"] if f["severity"] != "ok"]
    assert res["tuning_step"]["step"] in (3, 4)


@pytest.mark.parametrize("rule", [k for k in PROVOKE if k not in ("healthy", "failed")])
def test_each_rule_fires_on_the_run_that_provokes_it(runs, rule):
    res = diagnose(runs / rule)
    f = next(f for f in res["findings"] if f["rule"] == rule)
    assert f["severity"] in ("watch", "act"), f
    assert f["overrides"], f  # something to paste
    for o in f["overrides"]:  # each override is a key=value train.py accepts
        assert "=" in o and " " not in o
    assert any(ch.isdigit() for ch in f["evidence"])  # the numbers behind it


def test_all_suggested_overrides_compose_with_each_run_own(runs):
    # pasted together after the run's own command line, every suggestion of every rule must pass laglab's checks
    from laglab.sim import compose

    for name, own in PROVOKE.items():
        res = diagnose(runs / name)
        merged = {o.split("=", 1)[0]: o for o in own}
        for f in res["findings"]:
            for o in f["overrides"]:
                assert "=" in o and " " not in o, o
                merged[o.split("=", 1)[0]] = o
        compose(list(merged.values()))  # raises on a key, type or combination laglab refuses


def test_stale_data_puts_the_run_at_step_one(runs):
    assert diagnose(runs / "kl_behavior")["tuning_step"]["step"] == 1
    assert diagnose(runs / "queue_age")["tuning_step"]["step"] == 1


def test_books_that_do_not_close_are_reported(runs, tmp_path):
    # no config makes laglab's books fail to close (that is what they are for): a summary edited as a broken
    # transport would write it
    d = tmp_path / "tampered"
    shutil.copytree(runs / "healthy", d)
    s = json.loads((d / "summary.json").read_text())
    s["transport"]["unaccounted"] = 96
    s["transport"]["worst_unaccounted_at_update"] = 128
    (d / "summary.json").write_text(json.dumps(s))
    f = next(f for f in diagnose(d)["findings"] if f["rule"] == "books")
    assert f["severity"] == "act" and "unaccounted 96" in f["evidence"] and "worst at any update 128" in f["evidence"]
    assert _sev(diagnose(runs / "healthy"))["books"] == "ok"


def test_a_failed_run_without_updates_still_shows_its_books(runs, capsys):
    res = diagnose(runs / "failed")
    assert res["status"] == "failed" and any("failed" in n for n in res["notes"])
    assert any("no updates" in n for n in res["notes"]) and res["tuning_step"] is None
    books = next(f for f in res["findings"] if f["rule"] == "books")
    assert "produced" in books["evidence"] and books["severity"] == "ok"
    assert main([str(runs / "failed")]) == 0
    assert "failed" in capsys.readouterr().out


def test_json_and_markdown_outputs(runs, tmp_path, capsys):
    assert main([str(runs / "kl_behavior"), "--json", "--md", str(tmp_path / "d.md")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"findings", "tuning_step", "status", "run"}
    for f in out["findings"]:
        assert set(f) >= {"rule", "severity", "evidence", "overrides"} and f["severity"] in ("ok", "watch", "act")
    assert "| kl_behavior | act |" in (tmp_path / "d.md").read_text()
    assert main([str(runs), "--json"]) == 0  # a dir of runs: one entry per run
    many = json.loads(capsys.readouterr().out)
    assert len(many["runs"]) == len(PROVOKE)
    assert main([str(runs)]) == 0
    assert "runs" in capsys.readouterr().out


def test_bad_input_is_a_message(tmp_path, capsys):
    assert main([str(tmp_path / "missing")]) == 2
    assert "no such run or sweep dir" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == 2
    assert "no run dirs under it" in capsys.readouterr().err
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "summary.json").write_text('{"status": "comp')
    assert main([str(tmp_path / "cut")]) == 0  # reported as unreadable, not a traceback
    assert "cut off" in capsys.readouterr().out
