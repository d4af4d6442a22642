"""How a run ends, on every path: Ctrl-C (once, twice, three times) in a terminal and in a sweep, a second
signal at the worst moments for the books, a final checkpoint that cannot be written, W&B without
credentials, resumes that cannot work, a queue bound smaller than one fragment, and strict JSON."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from laglab.config import Config, ConfigError, validate
from laglab.runners import supervisor
from laglab.run import CheckpointFailed, run

from terminal import run_in_terminal

ROOT = Path(__file__).resolve().parents[1]
TINY = ["tracking.wandb.mode=disabled", "tracking.console_every_s=0"]


def cfg_of(**over) -> Config:
    small = {"total_env_steps": 4096, "actor": {"envs_per_actor": 4, "rollout_len": 16},
             "learner": {"batch_size": 512, "minibatches": 2, "epochs": 2},
             "tracking": {"console_every_s": 1e9, "wandb": {"mode": "disabled"}}}
    return validate(OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.create(small), OmegaConf.create(over)))


@pytest.fixture(autouse=True)
def _no_stop_left_over():
    supervisor.reset_stop()
    yield
    supervisor.reset_stop()


def train(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, str(ROOT / "train.py"), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


def strict_json(path: Path):
    def refuse(c):
        raise ValueError(f"not JSON: {c}")
    return json.loads(path.read_text(), parse_constant=refuse)


# ---- Ctrl-C in a terminal -------------------------------------------------------------------------------
def ctrl_c(args, presses: int, after: str = "steps "):
    """Run train.py on its controlling pseudo-terminal (^C is a SIGINT to its foreground group, actor processes
    included); type ``presses`` ^C once ``after`` shows on the screen (the run is training). Returns (exit code,
    screen)."""
    typed = []

    def type_once(screen, p, type_keys):
        if not typed and after in screen:
            type_keys(b"\x03" * presses)
            typed.append(1)

    return run_in_terminal(["train.py", *args], on_output=type_once, controlling=True, timeout=120)


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_ends_a_run_with_its_summary_line_and_exit_130(tmp_path, presses):
    rc, screen = ctrl_c(["total_env_steps=50000000", "actors=2", *TINY, f"hydra.run.dir={tmp_path}"], presses)
    assert rc == 130, screen[-3000:]
    assert "Traceback" not in screen and "KeyboardInterrupt" not in screen, screen[-3000:]
    assert "laglab: interrupted - " in screen and "books     unaccounted 0" in screen  # the footer
    s = strict_json(tmp_path / "summary.json")
    assert s["status"] == "interrupted" and s["transport"]["unaccounted"] == 0 and s["transport"]["balanced"]


def test_ctrl_c_stops_a_sweep_with_exit_130(tmp_path):
    sweep = tmp_path / "sweep"
    rc, screen = ctrl_c(["-m", "seed=0,1", "total_env_steps=50000000", "actors=2", *TINY,
                         f"hydra.sweep.dir={sweep}"], 1)
    assert rc == 130, screen[-3000:]
    assert "Traceback" not in screen and "KeyboardInterrupt" not in screen, screen[-3000:]
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert len(jobs) == 1 and jobs[0].startswith("0_")  # the second job never started
    assert strict_json(sweep / jobs[0] / "summary.json")["status"] == "interrupted"


# ---- a second signal where the first used to break the books --------------------------------------------
def test_a_second_signal_between_taking_a_fragment_and_staging_it_keeps_the_books(tmp_path, monkeypatch):
    from laglab.transport import FragmentQueue

    get, taken = FragmentQueue.get, []

    def get_then_two_signals(self, timeout):
        item = get(self, timeout)
        if item is not None:
            taken.append(item)
            if len(taken) == 40:  # the fragment is out of the queue and not yet staged
                supervisor.request_stop(signal.SIGINT)
                supervisor.request_stop(signal.SIGINT)
        return item

    monkeypatch.setattr(FragmentQueue, "get", get_then_two_signals)
    with pytest.raises(KeyboardInterrupt):
        run(cfg_of(runner={"name": "thread"}, total_env_steps=1_000_000), tmp_path)
    s = strict_json(tmp_path / "summary.json")
    assert s["status"] == "interrupted"
    assert s["transport"]["unaccounted"] == 0 and s["transport"]["balanced"], s["transport"]


@pytest.mark.parametrize("runner", ["sync", "thread"])
def test_a_second_signal_inside_an_update_stops_before_the_next_one(tmp_path, monkeypatch, runner):
    from laglab.learner import Learner

    update = Learner.update

    def update_then_two_signals(self, *a, **kw):
        m = update(self, *a, **kw)
        if self.updates == 3:
            supervisor.request_stop(signal.SIGINT)
            supervisor.request_stop(signal.SIGINT)
        return m

    monkeypatch.setattr(Learner, "update", update_then_two_signals)
    with pytest.raises(KeyboardInterrupt):
        run(cfg_of(runner={"name": runner}, total_env_steps=1_000_000), tmp_path)
    s = strict_json(tmp_path / "summary.json")
    assert s["status"] == "interrupted" and s["updates"] == 3  # the update in progress finished; no other began
    assert len(pd.read_parquet(tmp_path / "metrics.parquet")) == 3  # ... and was booked and logged
    assert s["transport"]["unaccounted"] == 0 and s["transport"]["balanced"], s["transport"]


def test_a_third_signal_exits_at_once_and_says_so(monkeypatch, capfd):
    exits = []

    class Exited(Exception):
        pass

    def fake_exit(code):
        exits.append(code)
        raise Exited()

    monkeypatch.setattr(supervisor.os, "_exit", fake_exit)
    supervisor.request_stop(signal.SIGINT)
    supervisor.request_stop(signal.SIGINT)  # neither raises: the run acts on them at its own points
    assert exits == [] and supervisor.stop_requested() == 2
    with pytest.raises(Exited):
        supervisor.request_stop(signal.SIGINT)
    assert exits == [130] and "third stop signal" in capfd.readouterr().err


def test_sighup_counts_once_and_a_third_signal_on_a_closed_terminal_still_exits(monkeypatch):
    """One closed terminal can deliver SIGHUP twice: it is one stop request, so a later SIGTERM is a second, not
    the third that exits at once. A third signal whose message cannot be written (stderr on the closed terminal)
    still exits."""
    exits = []

    def closed_terminal(fd, data):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(supervisor.os, "_exit", exits.append)
    monkeypatch.setattr(supervisor.os, "write", closed_terminal)
    for _ in range(3):
        supervisor.request_stop(signal.SIGHUP)
    supervisor.request_stop(signal.SIGTERM)
    assert supervisor.stop_requested() == 2 and exits == []
    supervisor.request_stop(signal.SIGTERM)
    assert exits == [130]


def test_a_stop_cuts_a_learner_stall_short():
    # a chaos stall (the driver waits with this) of an hour must not outlast a stop: it returns at once
    supervisor.request_stop(signal.SIGTERM)
    supervisor.wait_unless_stopped(3600.0)


# ---- the final checkpoint ---------------------------------------------------------------------------------
def test_a_failing_final_checkpoint_still_leaves_the_summary_and_metrics(tmp_path):
    (tmp_path / "checkpoints").write_text("a file where the checkpoint dir should be")
    with pytest.raises(CheckpointFailed, match="final checkpoint"):
        run(cfg_of(runner={"name": "sync"}), tmp_path)
    s = strict_json(tmp_path / "summary.json")
    assert s["status"] == "completed" and s["updates"] == 8  # what happened to training
    assert "checkpoints" in s["checkpoint_error"] and "checkpoint" not in s
    assert len(pd.read_parquet(tmp_path / "metrics.parquet")) == 8


def test_train_py_says_the_checkpoint_failed_and_exits_1(tmp_path):
    (tmp_path / "checkpoints").write_text("")
    p = train("runner=sync", "total_env_steps=1024", "learner.batch_size=512", *TINY, f"hydra.run.dir={tmp_path}")
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert "laglab: training completed, but the final checkpoint could not be written" in p.stderr
    assert strict_json(tmp_path / "summary.json")["checkpoint_error"]


# ---- strict JSON ------------------------------------------------------------------------------------------
def test_summary_json_is_strict_json_when_no_episode_finished(tmp_path):
    # Pendulum's episodes last 200 steps; 512 steps over 4 envs finish none: the return is unknown (null)
    s = run(cfg_of(runner={"name": "sync"}, actors=1, total_env_steps=512, env={"id": "Pendulum-v1"}), tmp_path)
    assert s["final_return_mean"] != s["final_return_mean"]  # NaN in memory ...
    on_disk = strict_json(tmp_path / "summary.json")  # ... null on disk: strict parsers read it
    assert on_disk["final_return_mean"] is None and on_disk["best_return_mean"] is None


# ---- resume -----------------------------------------------------------------------------------------------
CARTPOLE = {"algo": {"advantage": {"gamma": 0.98}}}  # as conf/env/cartpole.yaml sets it (the checkpoint records it)


@pytest.fixture(scope="module")
def sweep_job_dir(tmp_path_factory):
    """A finished run in a dir named as a sweep job's dir is (``=`` and ``,`` in its name), 4096 steps."""
    d = tmp_path_factory.mktemp("multirun") / "0_algo=ppo,seed=0"
    run(cfg_of(runner={"name": "sync"}, **CARTPOLE), d)
    return d


def test_resume_refuses_a_budget_already_trained(sweep_job_dir, tmp_path):
    for budget in (2048, 4096):
        with pytest.raises(ConfigError, match="total_env_steps=.*more than the 4,096 env steps"):
            run(cfg_of(runner={"name": "sync"}, resume=str(sweep_job_dir), total_env_steps=budget, **CARTPOLE),
                tmp_path / "x")
    assert not (tmp_path / "x").exists()  # refused before anything was made
    p = train("runner=sync", f"resume={sweep_job_dir}", "total_env_steps=2048", *TINY,
              f"hydra.run.dir={tmp_path / 'y'}")
    assert p.returncode == 2 and "Traceback" not in p.stderr and not (tmp_path / "y").exists(), p.stderr[-3000:]
    assert p.stderr.count("\n") == 1 and "total_env_steps=2048" in p.stderr


def test_resume_of_a_dir_that_does_not_exist_says_so(tmp_path):
    p = train(f"resume={tmp_path / 'nope'}", *TINY, f"hydra.run.dir={tmp_path / 'run'}")
    assert p.returncode == 2 and "no such directory" in p.stderr and not (tmp_path / "run").exists(), p.stderr


def test_resume_takes_a_sweep_job_dir_as_written(sweep_job_dir, tmp_path):
    out = tmp_path / "resumed"
    p = train("runner=sync", f"resume={sweep_job_dir}", "total_env_steps=6144", "learner.batch_size=512", *TINY,
              f"hydra.run.dir={out}")
    assert p.returncode == 0, p.stderr[-3000:]
    s = strict_json(out / "summary.json")
    assert s["status"] == "completed" and s["resumed_from"] == str(sweep_job_dir) and s["start_env_steps"] == 4096


# ---- transport.max_bytes ------------------------------------------------------------------------------------
def test_a_queue_bound_smaller_than_one_fragment_is_refused(tmp_path):
    from laglab.checks import env_spec, fragment_bytes

    c = cfg_of(runner={"name": "thread"})
    need = fragment_bytes(env_spec(c), 16, 16)
    with pytest.raises(ConfigError, match=rf"transport\.max_bytes={need - 1}; allowed: >= {need}"):
        run(cfg_of(runner={"name": "thread"}, transport={"max_bytes": need - 1}), tmp_path / "small")
    s = run(cfg_of(runner={"name": "thread"}, transport={"max_bytes": need}), tmp_path / "fits")  # the bound is tight
    assert s["updates"] == 8 and "too_large" not in s["transport"]["rejected"]
    p = train("transport.max_bytes=1000", *TINY, f"hydra.run.dir={tmp_path / 'run'}")
    assert p.returncode == 2 and "transport.max_bytes=1000; allowed: >= " in p.stderr
    assert not (tmp_path / "run").exists()


# ---- W&B --------------------------------------------------------------------------------------------------
def no_credentials(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    return dict(env, HOME=str(tmp_path), NETRC=str(tmp_path / "no-netrc"))


def test_wandb_online_without_credentials_is_one_line_and_exit_2(tmp_path):
    p = train("tracking.wandb.mode=online", f"hydra.run.dir={tmp_path / 'run'}", env=no_credentials(tmp_path))
    assert p.returncode == 2, p.stderr[-3000:]
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    assert "tracking.wandb.mode=online" in p.stderr and "wandb login" in p.stderr
    assert not (tmp_path / "run").exists()


def test_wandb_auto_without_credentials_says_it_is_offline_and_how_to_upload(tmp_path):
    out = tmp_path / "run"
    p = train("runner=sync", "total_env_steps=1024", "learner.batch_size=512", "tracking.console_every_s=0",
              f"hydra.run.dir={out}", env=no_credentials(tmp_path))
    assert p.returncode == 0, p.stderr[-3000:]
    text = p.stdout + p.stderr
    line = next(ln for ln in text.splitlines() if "W&B is offline" in ln)
    assert "no W&B credentials" in line
    synced = Path(line.split("wandb sync ")[1].strip())
    assert synced.is_dir() and synced.name.startswith("offline-run-") and synced.parent == out / "wandb"
    assert strict_json(out / "summary.json")["wandb_mode"] == "offline"


@pytest.mark.parametrize("module,name", [("analysis.doctor", "doctor"), ("analysis.report", "analysis")])
def test_ctrl_c_in_the_analysis_commands_is_a_line_not_a_traceback(module, name):
    # a real SIGINT, delivered while the command's main runs (reading a big sweep takes seconds)
    # (Python's own SIGINT handler first: a shell that starts the suite in the background (`cmd &`) hands its
    # children SIGINT ignored, and Python keeps an inherited ignore)
    code = (f"import os, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); import {module} as m; "
            "m.main = lambda *a: (os.kill(os.getpid(), signal.SIGINT), __import__('time').sleep(5)); sys.exit(m._cli())")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 130 and "Traceback" not in p.stderr and f"{name}: interrupted" in p.stderr, p.stderr
