"""Score a saved policy: a run's checkpoint (weights and the observation statistics the policy acted with)
played for N episodes with the deterministic policy (argmax / Gaussian mean) or the sampling one, on the
run's own env config. ``evaluate.py`` at the repo root is the command line."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
from omegaconf import OmegaConf

from .config import Config, ConfigError, lead_batches, upgrade_saved, validate
from .envs import EnvSpec, action_mask, make_env, normalize
from .inference import InferencePolicy, Snapshot

MODES = ("deterministic", "sample")


def run_config(run_dir: Path, overrides: Sequence[str] = ()) -> Config:
    """The resolved config a run was made with (``.hydra/config.yaml``), with ``key=value`` overrides."""
    path = Path(run_dir) / ".hydra" / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"invalid run dir: {run_dir} has no .hydra/config.yaml (is it a laglab run dir?)")
    OmegaConf.register_new_resolver("lead_batches", lead_batches, replace=True)  # as train.py does
    cfg = upgrade_saved(OmegaConf.load(path))
    if overrides:
        bad = [o for o in overrides if "=" not in o]
        if bad:
            raise ConfigError(f"invalid override {bad[0]!r}: expected key=value")
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
    if OmegaConf.select(cfg, "runner.name") == "ray":
        cfg.runner.name = "thread"  # evaluation runs no runner (and needs no Ray installed)
    if OmegaConf.select(cfg, "learner") is not None:
        cfg.learner.device = "cpu"  # nor a learner: a run trained on a GPU is evaluated on any machine
    return validate(cfg)


def find_checkpoint(run_dir: Path, which: str = "auto") -> Path:
    """``auto``: checkpoints/final.pt, else checkpoints/latest.pt; ``final`` / ``latest``; or a path."""
    ck = Path(run_dir) / "checkpoints"
    if which in ("auto", "final", "latest"):
        names = ["final.pt", "latest.pt"] if which == "auto" else [f"{which}.pt"]
        for n in names:
            if (ck / n).is_file():
                return ck / n
        raise ConfigError(f"invalid run dir: no checkpoint in {ck} (looked for {', '.join(names)}); a run saves "
                          "final.pt at its end (learner.checkpoint=true) and latest.pt every "
                          "learner.checkpoint_every updates")
    path = Path(which)
    if not path.is_file():
        raise ConfigError(f"invalid checkpoint: {path} does not exist")
    return path


def load_policy(path: Path, cfg: Config, spec: EnvSpec) -> tuple:
    """(InferencePolicy, Snapshot, checkpoint state). A checkpoint made for another env, network, normalizer
    setting or algorithm than ``cfg`` is refused (:class:`ConfigError` naming what differs)."""
    from .learner import build_model, read_checkpoint

    # the time limit is the evaluation's to choose (the policy does not see it)
    state = read_checkpoint(path, cfg, spec, purpose="evaluate", free=("env.max_episode_steps",))
    model = build_model(cfg, spec)
    model.load_state_dict(state["model"])
    snap = Snapshot.make(int(state["version"]), model, state["obs_norm_mean"].numpy(),
                         state["obs_norm_var"].numpy(), reward_var=float(state["reward_var"]))
    return InferencePolicy(snap, spec, cfg.policy.activation, cfg.policy.recurrent), snap, state


@dataclass
class Scores:
    returns: List[float] = field(default_factory=list)
    lengths: List[int] = field(default_factory=list)

    def summary(self) -> Dict[str, Any]:
        r = np.asarray(self.returns, np.float64)
        return {"return_mean": float(r.mean()), "return_std": float(r.std()), "return_min": float(r.min()),
                "return_max": float(r.max()), "length_mean": float(np.mean(self.lengths)),
                "episodes": len(self.returns), "returns": [float(x) for x in r], "lengths": list(map(int, self.lengths))}


def play(cfg: Config, policy: InferencePolicy, snap: Snapshot, episodes: int, mode: str = "deterministic",
         seed: int = 1_000_000, env=None) -> Scores:
    """Play ``episodes`` whole episodes one after another (episode i reset with ``seed + i``); returns are the
    env's raw rewards, as training reports them."""
    if mode not in MODES:
        raise ConfigError(f"invalid mode {mode!r}; allowed: {', '.join(MODES)}")
    if episodes < 1:
        raise ConfigError(f"invalid episodes={episodes}: at least 1")
    own = env is None
    env = make_env(cfg.env) if own else env
    spec = policy.spec
    rng = np.random.default_rng(seed)
    out = Scores()
    try:
        for i in range(episodes):
            obs, info = env.reset(seed=seed + i)
            ret, length, done = 0.0, 0, False
            h = None if policy.state_shape is None else np.zeros((1,) + policy.state_shape, np.float32)
            while not done:
                x = np.asarray(obs, np.float32)[None]
                if cfg.env.normalize_obs:
                    x = normalize(x, snap.obs_mean, snap.obs_var, cfg.env.obs_clip)
                mask = action_mask(info, spec.n_actions, cfg.env.id)[None] if spec.masked else None
                if mode == "deterministic":
                    a, h = policy.mode(x, mask, h)
                else:
                    a, h = (lambda r: (r[0], r[-1]))(policy.act(x, rng, mask, h))
                a = a[0]
                if not spec.discrete:
                    a = np.clip(a, spec.action_low, spec.action_high)
                obs, r, terminated, truncated, info = env.step(a.item() if spec.discrete else a)
                ret += float(r)
                length += 1
                done = terminated or truncated
            out.returns.append(ret)
            out.lengths.append(length)
    finally:
        if own:
            env.close()
    return out


def video_env(cfg: Config, folder: Path):
    """The run's env, rendered to rgb arrays and recorded episode by episode into ``folder``; a clear
    :class:`ConfigError` when recording cannot work here (no renderer, no video writer)."""
    import gymnasium as gym

    try:
        import moviepy  # noqa: F401 - gymnasium's RecordVideo writes with it
    except ImportError as e:
        raise ConfigError("cannot record video: the video writer is missing (moviepy); "
                          "pip install -e '.[video]'") from e
    env = make_env(cfg.env, render_mode="rgb_array")
    try:
        env.reset(seed=0)
        frame = env.render()
    except Exception as e:  # noqa: BLE001 - each env fails in its own way without a renderer
        env.close()
        hint = ("MuJoCo renders with OpenGL: set MUJOCO_GL=egl (GPU) or MUJOCO_GL=osmesa (CPU, needs libosmesa)"
                if "mujoco" in type(e).__module__.lower() or "GL" in str(e) else
                "classic-control envs render with pygame: pip install -e '.[video]'")
        raise ConfigError(f"cannot record video of {cfg.env.id}: its renderer failed ({type(e).__name__}: {e}). "
                          f"{hint}") from e
    if frame is None or np.asarray(frame).ndim != 3:
        env.close()
        raise ConfigError(f"cannot record video of {cfg.env.id}: it does not render rgb frames")
    if folder.is_dir():  # this folder is this evaluation's (checkpoint, mode, seed): replace its videos
        for old in folder.glob("eval-episode-*.mp4"):
            old.unlink()
        if not any(folder.iterdir()):
            folder.rmdir()  # (RecordVideo warns about any folder that exists)
    return gym.wrappers.RecordVideo(env, str(folder), episode_trigger=lambda _: True, name_prefix="eval",
                                    disable_logger=True)


def evaluate(run_dir: Path, episodes: int = 10, mode: str = "deterministic", checkpoint: str = "auto",
             seed: int = 1_000_000, video: Optional[Path] = None, overrides: Sequence[str] = ()) -> Dict[str, Any]:
    """Evaluate a run dir's checkpoint; returns the result and writes it as ``eval.json`` in the run dir (the
    newest evaluation) and as a line of ``evals.jsonl`` (all of them)."""
    from .checks import env_spec
    from .tracking import write_json_atomic

    run_dir = Path(run_dir)
    cfg = run_config(run_dir, overrides)
    spec = env_spec(cfg)
    path = find_checkpoint(run_dir, checkpoint)
    policy, snap, state = load_policy(path, cfg, spec)
    env = video_env(cfg, Path(video)) if video is not None else None
    t0 = time.perf_counter()
    try:
        scores = play(cfg, policy, snap, episodes, mode, seed, env)
    finally:
        if env is not None:
            env.close()
    out = {"env_id": cfg.env.id, "checkpoint": str(path), "mode": mode, "seed": seed,
           "policy_version": int(state["version"]), "trained_env_steps": int(state.get("env_steps", 0)),
           **scores.summary(), "wall_s": time.perf_counter() - t0,
           "video_dir": None if video is None else str(video), "overrides": list(overrides)}
    if video is not None:
        out["videos"] = sorted(p.name for p in Path(video).glob("*.mp4"))
    write_json_atomic(run_dir / "eval.json", out)  # the newest evaluation
    with open(run_dir / "evals.jsonl", "a") as f:  # and every one, in order
        f.write(json.dumps(out) + "\n")
    return out
