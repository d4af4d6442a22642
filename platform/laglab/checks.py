"""Pre-start checks: what a run is refused for once the env is known, before anything is created (no run dir,
no thread, no process). :func:`validate` in ``config`` checks the config alone; these need the env's spaces,
the resumed checkpoint, the machine or the W&B credentials. Each failure is a :class:`ConfigError` naming
the key and what is allowed."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from .config import Config, ConfigError, RunnerKind
from .envs import EnvSpec, make_env
from .fragment import Fragment, FragmentId
from .recurrent import policy_state_shape


def env_spec(cfg: Config) -> EnvSpec:
    env = make_env(cfg.env)
    try:  # one reset of a throwaway env: whether it names its legal actions (info["action_mask"])
        info = env.reset(seed=0)[1]  # (continuous actions: a mask there is refused, not dropped)
        return EnvSpec.of(env, info, cfg.env.action_mask)
    finally:
        env.close()


def resume_checkpoint(run_dir: str) -> Path:
    """The newest checkpoint of a run dir: checkpoints/final.pt if the run ended, else latest.pt."""
    d = Path(run_dir)
    if not d.is_dir():
        raise ConfigError(f"invalid config: resume={run_dir!r}: {'not a directory' if d.exists() else 'no such directory'}; "
                          "allowed: a run dir (with checkpoints/final.pt or checkpoints/latest.pt)")
    for name in ("final.pt", "latest.pt"):
        if (d / "checkpoints" / name).exists():
            return d / "checkpoints" / name
    raise ConfigError(f"invalid config: resume={run_dir!r} has no checkpoints/final.pt or checkpoints/latest.pt "
                      "(set learner.checkpoint_every to write checkpoints during a run)")


def check_resume(cfg: Config, spec: EnvSpec) -> None:
    """Refuse a resume whose checkpoint was made for another env, algorithm or network (naming what differs),
    or whose budget is already spent: ``total_env_steps`` counts the resumed steps too."""
    if not cfg.resume:
        return
    from .learner import read_checkpoint  # torch: only when resuming

    ck = resume_checkpoint(cfg.resume)
    trained = int(read_checkpoint(ck, cfg, spec)["env_steps"])
    if cfg.total_env_steps <= trained:
        raise ConfigError(f"invalid config: total_env_steps={cfg.total_env_steps}; allowed: more than the "
                          f"{trained:,} env steps {ck} has already trained (the budget counts them: "
                          f"total_env_steps={trained + cfg.total_env_steps} trains {cfg.total_env_steps:,} more)")


def fragment_bytes(spec: EnvSpec, rollout_len: int, truncations: int, state_shape: Optional[tuple] = None) -> int:
    """The size the transport charges for one fragment of this env (``Fragment.nbytes``) with ``truncations``
    final observations (``state_shape``: a recurrent policy's, whose first and final states travel too)."""
    T, obs = rollout_len, tuple(spec.obs_shape)
    f32 = lambda *shape: np.zeros(shape, np.float32)  # noqa: E731
    flags = np.zeros(T, bool)
    actions = np.zeros(T, np.int64) if spec.discrete else f32(T, spec.n_actions)
    gauss = None if spec.discrete else f32(T, spec.n_actions)
    masks = np.zeros((T, spec.n_actions), bool) if spec.masked else None
    state = None if state_shape is None else f32(*state_shape)
    frag = Fragment(FragmentId(0, 0, 0, 0, 0, 0, T - 1, 0), f32(T, *obs), actions, f32(T), flags, flags, f32(T),
                    f32(T), f32(truncations, *obs), f32(T), f32(*obs), gauss, gauss, masks, state, state)
    return frag.nbytes


def check_transport(cfg: Config, spec: EnvSpec) -> None:
    """A queue bound smaller than one fragment would refuse every fragment (``too_large``): nothing would train."""
    T = cfg.actor.rollout_len
    S = policy_state_shape(cfg.policy)
    need = fragment_bytes(spec, T, T, S)  # the largest: every step ends an episode by truncation
    if cfg.transport.max_bytes < need:
        base = fragment_bytes(spec, T, 0, S)
        raise ConfigError(f"invalid config: transport.max_bytes={cfg.transport.max_bytes}; allowed: >= {need} (one "
                          f"fragment of {cfg.env.id} with actor.rollout_len={T} takes up to {need} bytes: {base} plus "
                          f"{(need - base) // T} per truncated step; a smaller bound refuses every fragment)")


def check_wandb(cfg: Config) -> None:
    """``online`` without credentials cannot start; say so before anything is created."""
    from .tracking import has_wandb_credentials

    if cfg.tracking.wandb.mode == "online" and not has_wandb_credentials():
        raise ConfigError("invalid config: tracking.wandb.mode=online needs W&B credentials and none are configured; "
                          "allowed: run `wandb login` (or set WANDB_API_KEY) first, or tracking.wandb.mode=auto "
                          "(offline without credentials) | offline | disabled")


def prestart(cfg: Config, spec: Optional[EnvSpec] = None) -> EnvSpec:
    """Every pre-start check; returns the env's spec (``spec``: one already made for this env config)."""
    spec = spec or env_spec(cfg)  # an env id that cannot be made is a config error too (make_env says so)
    check_transport(cfg, spec)
    check_resume(cfg, spec)
    check_wandb(cfg)
    if cfg.runner.name == RunnerKind.process:
        from .runners.slots import check_fits

        check_fits(cfg, spec)
    return spec
