"""The console: ``python train.py`` in a real pseudo-terminal (log lines above the live bar, never glued to it;
a footer naming the run dir on every exit path; the bar kept out of W&B's output.log), third-party noise kept
to the run's log file (MuJoCo's compiler warnings, also from actor processes and evaluate.py; Ray's start-up
warnings, with a "starting Ray" line in their place), and the footer built from a summary dict."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from laglab.console import footer

from terminal import run_in_terminal

ROOT = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
LOG_LINE = re.compile(r"\[\d{4}-\d\d-\d\d [\d:,]+\]\[")  # Hydra's log prefix: [2026-11-30 21:06:01,718][


def in_terminal(*args, on_output=None, timeout=300):
    """Run ``python train.py args`` (or another script: args[0] ending in .py) on a pseudo-terminal; returns
    (exit code, everything the terminal received). ``on_output(screen, proc)`` is called with the screen so far
    after each read."""
    cmd = list(args) if args and str(args[0]).endswith(".py") else ["train.py", *args]
    return run_in_terminal(cmd, on_output=(lambda screen, p, _: on_output(screen, p)) if on_output else None,
                           timeout=timeout)


def screen_lines(text: str):
    """What the terminal shows, line by line: each \\r or \\n starts a line, escape codes removed."""
    return [ANSI.sub("", x) for x in re.split(r"[\r\n]", text)]


@pytest.fixture(scope="module")
def cartpole(tmp_path_factory):
    out = tmp_path_factory.mktemp("cartpole")
    rc, text = in_terminal("total_env_steps=20000", "tracking.wandb.mode=offline", "tracking.console_every_s=0.5",
                           f"hydra.run.dir={out}")
    assert rc == 0, text[-3000:]
    return out, text


def test_log_lines_print_above_the_bar_never_into_it(cartpole):
    out, text = cartpole
    lines = screen_lines(text)
    assert any("━" in x and "20,000" in x for x in lines)  # the bar drew
    start = [x for x in lines if f"-> {out}" in x]
    assert start and all(LOG_LINE.match(x) and "━" not in x for x in start), start  # the run dir on a line of its own
    logged = [x for x in lines if "][laglab][" in x]
    assert len(logged) >= 3  # the start line, progress lines while the bar was drawn, the footer
    for x in logged:  # each log line starts a line of the terminal: none is glued to the bar
        assert LOG_LINE.match(x) and "━" not in x, x


def test_the_run_ends_with_a_footer_naming_the_run_dir(cartpole):
    out, text = cartpole
    tail = "\n".join(screen_lines(text)[-40:])
    assert "laglab: completed" in tail
    assert re.search(rf"run dir +{re.escape(str(out))}$", tail, re.M), tail
    s = json.loads((out / "summary.json").read_text())
    assert f"final {s['final_return_mean']:,.1f}, best {s['best_return_mean']:,.1f}" in tail
    assert f"wandb sync {out}/wandb/offline-run-" in tail
    assert f"python evaluate.py {out}" in tail and f"python -m analysis.report {out}" in tail
    last_bar = text.rfind("━")  # the bar was erased before the footer: no stale count or time left above it
    assert "\x1b[2K" in text[last_bar:text.index("laglab: completed")], repr(text[last_bar:last_bar + 300])


def test_the_bar_is_not_in_wandbs_output_log(tmp_path):
    # W&B starts in the background, and a short run can end before it is up: this run goes on until W&B is up
    # and two progress lines have been logged beside the bar since, so output.log has seen the bar drawn.
    out = tmp_path / "run"
    sent = []
    deadline = time.monotonic() + 120  # (a W&B that never comes up fails the test, it does not hang it)

    def stop_once_wandb_has_seen_the_bar(screen, p):
        up = screen.find("upload this run later with")
        seen = up >= 0 and len(re.findall(r"\]\[laglab\]\[INFO\] - .*steps .*sps ", screen[up:])) >= 2
        if not sent and (seen or time.monotonic() > deadline):
            p.send_signal(signal.SIGTERM)
            sent.append(seen)

    rc, text = in_terminal("total_env_steps=5000000", "tracking.wandb.mode=offline", "tracking.console_every_s=0.3",
                           f"hydra.run.dir={out}", on_output=stop_once_wandb_has_seen_the_bar)
    assert sent == [True], text[-3000:]
    assert "━" in text  # the terminal had the bar
    (log,) = (out / "wandb").glob("offline-run-*/files/output.log")
    captured = log.read_text()
    assert "steps " in captured and "sps " in captured  # W&B captured the log lines ...
    assert "\x1b[" not in captured and "━" not in captured  # ... and never the bar


def test_mujoco_warnings_go_to_the_log_file_not_the_terminal(tmp_path):
    pytest.importorskip("mujoco")
    out = tmp_path / "run"
    rc, text = in_terminal("env=halfcheetah", "total_env_steps=4096", "actors=2", "tracking.wandb.mode=disabled",
                           f"hydra.run.dir={out}")
    assert rc == 0, text[-3000:]
    assert "laglab: completed" in text
    assert "settotalmass" not in text  # actor processes compiled HalfCheetah too
    assert "settotalmass" in (out / "train.log").read_text()  # filtered to the run's log file, not lost
    p = subprocess.run([sys.executable, "evaluate.py", str(out), "--episodes", "1"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "settotalmass" not in p.stdout + p.stderr
    assert "settotalmass" in (out / "evaluate.log").read_text()


def test_ray_start_up_is_one_line_and_its_warnings_go_to_the_log_file(tmp_path):
    pytest.importorskip("ray")
    out = tmp_path / "run"
    rc, text = in_terminal("runner=ray", "actors=2", "total_env_steps=4096", "tracking.wandb.mode=disabled",
                           f"hydra.run.dir={out}")
    assert rc == 0, text[-3000:]
    lines = screen_lines(text)
    assert any(LOG_LINE.match(x) and x.endswith("laglab: starting Ray (2 actors)...") for x in lines), text[-3000:]
    assert not any("WARNING" in x and "][laglab][" not in x for x in lines), text[-3000:]  # none of Ray's own
    assert "authentication" not in text.lower()


def test_an_interrupted_run_ends_with_its_footer_too(tmp_path):
    out = tmp_path / "run"
    sent = []

    def stop_when_running(screen, p):  # once the run has logged its first progress line
        if not sent and "steps " in screen and "sps" in screen:
            p.send_signal(signal.SIGTERM)
            sent.append(True)

    rc, text = in_terminal("total_env_steps=5000000", "tracking.wandb.mode=disabled", "tracking.console_every_s=0",
                           f"hydra.run.dir={out}", on_output=stop_when_running)
    assert sent, text[-3000:]
    shown = "\n".join(screen_lines(text))  # (what follows the footer on this path is not the console's business)
    assert "laglab: interrupted" in shown and re.search(rf"run dir +{re.escape(str(out))}$", shown, re.M), shown
    assert json.loads((out / "summary.json").read_text())["status"] == "interrupted"


class _Gone:
    """A stream on a terminal that has closed: every write (or flush) fails as the kernel fails it."""

    def __init__(self, err=5):  # EIO
        self.err = err

    def write(self, s):
        raise OSError(self.err, os.strerror(self.err))

    def flush(self):
        raise OSError(self.err, os.strerror(self.err))

    def close(self):
        raise OSError(self.err, os.strerror(self.err))


def test_the_bar_outlives_its_terminal(monkeypatch):
    """After a hang-up the bar draws no more, and lines written above it are dropped, not raised into the run
    (which then could not write its summary); another error of the stream (a full disk) still raises."""
    import io

    from laglab.console import LiveBar
    bar = LiveBar(100)
    bar.term.close()
    bar.term = bar.console.file = _Gone()  # (rich renders through it too)
    out = io.StringIO()
    bar.update(10, "sps 1")  # the first draw finds the terminal gone
    assert bar.gone
    bar.write_above(out, "a line\n")
    assert out.getvalue() == "a line\n"  # a stream that works still gets its lines
    bar.write_above(_Gone(), "to the closed terminal\n")
    with pytest.raises(OSError, match="No space"):
        bar.write_above(_Gone(28), "to a full disk\n")  # ENOSPC
    bar.update(20, "sps 2")
    bar.close()  # erases the bar and closes its handle: nothing raises


# ---- the footer on summary dicts -------------------------------------------------------------------------
CHAOS_SUMMARY = {
    "status": "completed", "env_id": "CartPole-v1", "algo": "ppo", "runner": "thread", "actors": 4, "seed": 0,
    "env_steps": 199936, "total_env_steps": 200000, "updates": 188, "wall_time_s": 18.5, "sps": 10798.2,
    "final_return_mean": 500.0, "best_return_mean": 500.0, "return_window": 20, "episodes": 892,
    "lag": {"mean": 1.02, "p95": 2.0, "max": 2.0, "kl_behavior": 0.0075},
    "chaos": {"corrupted": {"nan": 34, "prob": 31, "schema": 30, "shape": 33},
              "corrupted_steps": {"nan": 1088, "prob": 992, "schema": 960, "shape": 1056}, "delayed": 135,
              "dropped_steps": 2016, "duplicated": 116, "hangs": 1, "kills": 4, "lost_held_steps": 0,
              "reordered": 111, "stalls": 3},
    "actor_restarts": 5,
    "transport": {"produced": 199936, "admitted": 192512, "in_flight": 0, "unaccounted": 0,
                  "dropped": {"actor_crash": 448, "lost_in_transit": 2016, "shutdown": 864},
                  "rejected": {"logp": 992, "non_finite": 1088, "schema": 960, "shape": 1056},
                  "duplicates_detected": 116},
    "checkpoint": "/runs/x/checkpoints/final.pt",
    "wandb": {"mode": "offline", "dir": "/runs/x/wandb/offline-run-1-abc/files", "id": "abc",
              "run_path": "/runs/x/wandb/offline-run-1-abc"},
}


def test_footer_of_a_chaos_run_shows_faults_injected_and_detected():
    text = footer(CHAOS_SUMMARY, "/runs/x")
    assert text.startswith("laglab: completed - CartPole-v1, ppo, runner=thread, 4 actor(s), seed 0")
    assert re.search(r"run dir +/runs/x$", text, re.M)
    assert "final 500.0, best 500.0 (mean return of the last 20 episodes" in text
    assert "10,798 sps" in text and "199,936 of 200,000 env steps" in text
    assert "version lag mean 1.02, p95 2, max 2; KL(behavior||current) 0.0075" in text
    assert "unaccounted 0" in text and "produced 199,936, admitted 192,512, in flight 0" in text
    assert "dropped 3,328 (actor_crash 448, lost_in_transit 2,016, shutdown 864)" in text
    assert "rejected 4,096 (logp 992, non_finite 1,088, schema 960, shape 1,056)" in text
    assert "2,016 env steps -> lost_in_transit 2,016" in text
    assert "116 fragments -> 116 duplicates detected" in text
    assert "4,096 env steps (nan 1,088, prob 992, schema 960, shape 1,056) -> rejected 4,096" in text
    assert "4 killed, 1 hung -> 5 restarts" in text and "3 learner stalls" in text
    assert "wandb sync /runs/x/wandb/offline-run-1-abc" in text
    assert "python evaluate.py /runs/x" in text and "python -m analysis.report /runs/x --out /runs/x/report" in text
    assert "python evaluate.py '/runs/my run'" in footer(CHAOS_SUMMARY, "/runs/my run")  # commands one can paste


def test_footer_without_chaos_or_wandb_and_of_a_failed_run():
    s = {k: v for k, v in CHAOS_SUMMARY.items() if k not in ("wandb", "checkpoint")}
    s["chaos"] = {k: ({} if isinstance(v, dict) else 0) for k, v in s["chaos"].items()}  # chaos=none: all zero
    text = footer(s, "/runs/y")
    assert "faults" not in text and "W&B       disabled" in text and "evaluate.py" not in text
    failed = {"status": "failed", "error": "RuntimeError: boom", "env_steps": 0, "updates": 0, "wall_time_s": 0.1,
              "sps": 0.0, "final_return_mean": float("nan"), "best_return_mean": float("nan")}
    text = footer(failed, "/runs/z")
    assert text.startswith("laglab: failed") and "RuntimeError: boom" in text
    assert re.search(r"run dir +/runs/z$", text, re.M) and "final n/a, best n/a" in text
    assert "books     not available" in text
