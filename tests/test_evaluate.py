"""evaluate.py: a saved policy is scored as written in the checkpoint (checked against an evaluation written
the slow way with the torch model), mismatched checkpoints are refused, video is recorded or its absence
explained."""
import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from laglab.config import ConfigError
from laglab.evaluate import evaluate
from laglab.policy import ActorCritic

ROOT = Path(__file__).resolve().parents[1]


def train(run_dir: Path, *overrides: str) -> Path:
    cmd = [sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={run_dir}", "tracking.wandb.mode=disabled",
           "tracking.progress=false", "tracking.console_every_s=1e9", "runner=sync", *overrides]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    return run_dir


@pytest.fixture(scope="module")
def cartpole(tmp_path_factory):
    return train(tmp_path_factory.mktemp("cartpole"), "total_env_steps=30000", "env.normalize_obs=true")


@pytest.fixture(scope="module")
def pendulum(tmp_path_factory):
    return train(tmp_path_factory.mktemp("pendulum"), "env=pendulum", "total_env_steps=8192",
                 "learner.epochs=2", "learner.minibatches=4")


def slow_scores(run_dir: Path, env_id: str, episodes: int, seed: int, hidden=(64, 64)):
    """The same evaluation written independently: the torch model from the checkpoint, normalization by hand,
    argmax or mean (clipped) actions, gymnasium directly."""
    state = torch.load(run_dir / "checkpoints" / "final.pt", weights_only=True)
    env = gym.make(env_id)
    discrete = isinstance(env.action_space, gym.spaces.Discrete)
    n = env.action_space.n if discrete else env.action_space.shape[0]
    from laglab.envs import EnvSpec
    spec = EnvSpec(env.observation_space.shape, discrete, n,
                   None if discrete else env.action_space.low, None if discrete else env.action_space.high)
    model = ActorCritic(spec, hidden)
    model.load_state_dict(state["model"])
    mean, var = state["obs_norm_mean"].numpy(), state["obs_norm_var"].numpy()
    out = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        total, done = 0.0, False
        while not done:
            x = np.clip((obs - mean) / np.sqrt(var + 1e-8), -10, 10).astype(np.float32)
            with torch.no_grad():
                logits = model.pi(torch.from_numpy(x)[None])[0].numpy()
            a = int(logits.argmax()) if discrete else np.clip(logits, env.action_space.low, env.action_space.high)
            obs, r, term, trunc, _ = env.step(a)
            total += float(r)
            done = term or trunc
        out.append(total)
    return out


def test_a_cartpole_checkpoint_scores_as_the_slow_reference_and_writes_eval_json(cartpole):
    out = evaluate(cartpole, episodes=4, seed=123)
    ref = slow_scores(cartpole, "CartPole-v1", 4, 123)
    assert out["returns"] == ref
    assert out["return_mean"] == pytest.approx(np.mean(ref)) and out["return_std"] == pytest.approx(np.std(ref))
    assert out["return_mean"] > 30  # trained: a uniform policy averages ~22
    saved = json.loads((cartpole / "eval.json").read_text())
    assert saved["checkpoint"].endswith("final.pt") and saved["mode"] == "deterministic" and saved["episodes"] == 4
    assert saved["trained_env_steps"] >= 30000 - 1024 and saved["policy_version"] > 0
    again = evaluate(cartpole, episodes=4, seed=123)
    assert again["returns"] == out["returns"]  # reproducible
    history = [json.loads(x) for x in (cartpole / "evals.jsonl").read_text().splitlines()]
    assert [h["returns"] for h in history[-2:]] == [ref, ref]  # every evaluation is kept, in order
    sampled = evaluate(cartpole, episodes=4, seed=123, mode="sample")
    assert sampled["mode"] == "sample" and sampled["episodes"] == 4


def test_a_pendulum_checkpoint_scores_as_the_slow_reference(pendulum):
    out = evaluate(pendulum, episodes=2, seed=7)
    ref = slow_scores(pendulum, "Pendulum-v1", 2, 7)
    np.testing.assert_allclose(out["returns"], ref, rtol=1e-4)
    assert all(length == 200 for length in out["lengths"])


def test_a_checkpoint_of_another_env_or_network_is_refused(cartpole, pendulum):
    with pytest.raises(ConfigError, match=r"evaluate=.*env\.id: checkpoint 'Pendulum-v1', this run 'CartPole-v1'"):
        evaluate(cartpole, episodes=1, checkpoint=str(pendulum / "checkpoints" / "final.pt"))
    with pytest.raises(ConfigError, match=r"policy\.hidden_sizes"):
        evaluate(cartpole, episodes=1, overrides=["policy.hidden_sizes=[32]"])
    with pytest.raises(ConfigError, match="no .hydra/config.yaml"):
        evaluate(cartpole / "checkpoints", episodes=1)


def test_the_command_line_prints_the_score_and_refuses_bad_input_with_exit_code_2(cartpole, tmp_path):
    p = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), str(cartpole), "episodes=2", "--seed", "5"],
                       cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "2 episodes, deterministic: return" in p.stdout
    assert json.loads((cartpole / "eval.json").read_text())["returns"] == slow_scores(cartpole, "CartPole-v1", 2, 5)
    p = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), str(tmp_path)], cwd=ROOT, capture_output=True,
                       text=True)
    assert p.returncode == 2 and "laglab: invalid run dir" in p.stderr and "Traceback" not in p.stderr


def test_video_is_recorded_or_what_is_missing_is_named(cartpole, monkeypatch):
    out = evaluate(cartpole, episodes=2, video=cartpole / "videos" / "t")
    assert out["videos"] == ["eval-episode-0.mp4", "eval-episode-1.mp4"]
    assert all((cartpole / "videos" / "t" / v).stat().st_size > 1000 for v in out["videos"])
    # the command line names the folder by the checkpoint it played (final.pt here), the mode and the seed
    p = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), str(cartpole), "--video", "--episodes", "1"],
                       cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert (cartpole / "videos" / "final-deterministic-1000000" / "eval-episode-0.mp4").is_file(), p.stdout
    monkeypatch.setitem(sys.modules, "moviepy", None)  # as if it were not installed
    with pytest.raises(ConfigError, match=r"moviepy.*\[video\]"):
        evaluate(cartpole, episodes=1, video=cartpole / "videos" / "u")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU run evaluated on a machine without one")
def test_a_run_trained_on_a_gpu_is_evaluated_on_a_cpu_machine(cartpole, tmp_path):
    # its saved config names learner.device=cuda and its checkpoint's tensors say cuda:0, as a GPU run's do
    import shutil

    from test_learner_device import saved_as_if_on

    run = tmp_path / "gpu_run"
    shutil.copytree(cartpole, run)
    cfg = (run / ".hydra" / "config.yaml").read_text()
    assert "device: auto" in cfg
    (run / ".hydra" / "config.yaml").write_text(cfg.replace("device: auto", "device: cuda"))
    state = torch.load(cartpole / "checkpoints" / "final.pt", weights_only=True)
    with saved_as_if_on("cuda:0"):
        torch.save(state, run / "checkpoints" / "final.pt")
    with pytest.raises(RuntimeError, match="CUDA"):
        torch.load(run / "checkpoints" / "final.pt", weights_only=True)
    out = evaluate(run, episodes=3, seed=123)
    assert out["returns"] == evaluate(cartpole, episodes=3, seed=123)["returns"]
    p = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), str(run), "--episodes", "2"], capture_output=True,
                       text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
