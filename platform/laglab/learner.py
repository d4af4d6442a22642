"""The learner: batch assembly from fragments, advantages (GAE | V-trace), PPO epochs (clip | dual-clip),
observation-normalizer statistics, snapshot publication and checkpoints."""
from __future__ import annotations

import collections
import os
import time
from pathlib import Path
from typing import Dict, List, Sequence

import numpy as np
import torch
from torch import nn

from . import algo
from .config import Config, Estimator, LossKind
from .envs import EnvSpec, RunningMeanStd, normalize
from .fragment import Fragment
from .policy import ActorCritic, Snapshot


def build_model(cfg: Config, spec: EnvSpec) -> ActorCritic:
    p = cfg.policy
    return ActorCritic(spec, p.hidden_sizes, p.activation, p.log_std_init)


class Learner:
    def __init__(self, cfg: Config, spec: EnvSpec):
        self.cfg = cfg
        self.spec = spec
        self.model = build_model(cfg, spec)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=cfg.learner.lr, eps=cfg.learner.adam_eps)
        self.obs_rms = RunningMeanStd(spec.obs_shape)
        self.version = 0
        self.updates = 0
        self.consumed: Dict[int, int] = collections.defaultdict(int)  # actor id -> steps taken off the queue
        self.trained_steps = 0
        self.gen = torch.Generator().manual_seed(int(cfg.seed) + 7919)

    # ---- publication -------------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        return Snapshot.make(self.version, self.model, self.obs_rms.mean, self.obs_rms.var, dict(self.consumed))

    def take(self, frag: Fragment) -> int:
        """Record that a fragment left the queue; returns its version lag."""
        self.consumed[frag.id.actor_id] += frag.length
        return self.version - frag.id.behavior_version

    # ---- update ------------------------------------------------------------------------------------
    def _norm(self, obs: np.ndarray) -> torch.Tensor:
        if self.cfg.env.normalize_obs:
            obs = normalize(obs, self.obs_rms.mean, self.obs_rms.var, self.cfg.env.obs_clip)
        return torch.from_numpy(np.ascontiguousarray(obs, dtype=np.float32))

    def update(self, frags: Sequence[Fragment], env_steps: int) -> Dict[str, float]:
        """One learner update on a batch of equal-length fragments; bumps the version."""
        cfg, lc, ac = self.cfg, self.cfg.learner, self.cfg.algo
        t_start = time.perf_counter()
        T, N = frags[0].length, len(frags)
        obs_raw = np.stack([f.obs for f in frags], axis=1)  # [T, N, *obs]
        last_raw = np.stack([f.last_obs for f in frags])  # [N, *obs]
        if cfg.env.normalize_obs:
            self.obs_rms.update(obs_raw.reshape((T * N,) + self.spec.obs_shape))
        obs = self._norm(obs_raw).reshape((T * N,) + self.spec.obs_shape)
        last_obs = self._norm(last_raw)
        actions = torch.from_numpy(np.stack([f.actions for f in frags], axis=1))
        actions = actions.reshape((T * N,) + self.spec.action_shape)
        stack = lambda name: torch.from_numpy(np.stack([getattr(f, name) for f in frags], axis=1))  # noqa: E731
        rewards, term, trunc = stack("rewards"), stack("terminated"), stack("truncated")
        b_logp, trunc_v = stack("logp"), stack("trunc_values")
        versions = np.array([f.id.behavior_version for f in frags])
        lags = self.version - versions

        gamma = ac.advantage.gamma
        done = (term | trunc).float()
        rewards_eff = rewards + gamma * trunc_v * trunc.float()  # bootstrap truncation with V(final obs)
        discounts = gamma * (1.0 - done)
        with torch.no_grad():
            values = self.model.value(obs).view(T, N)
            bootstrap = self.model.value(last_obs)
            cur_logp, _ = self.model.logp_entropy(obs, actions)
            cur_logp = cur_logp.view(T, N)
            lag_kl = float(algo.approx_kl_k3(cur_logp, b_logp))
            if ac.advantage.estimator == Estimator.gae:
                adv = algo.gae(rewards_eff, values, bootstrap, discounts, ac.advantage.lam)
                returns = adv + values
            else:
                vt = algo.vtrace(b_logp, cur_logp, rewards_eff, values, bootstrap, discounts,
                                 ac.advantage.rho_bar, ac.advantage.c_bar, ac.advantage.lam)
                adv, returns = vt.advantages, vt.vs

        if lc.anneal_lr:
            frac = max(0.0, 1.0 - env_steps / cfg.total_env_steps)
            for g in self.opt.param_groups:
                g["lr"] = lc.lr * max(frac, 0.0)
        b_adv, b_ret, b_old = adv.reshape(-1), returns.reshape(-1), b_logp.reshape(-1)
        B = T * N
        mb = B // lc.minibatches
        loss_cfg = ac.loss
        sums: Dict[str, float] = collections.defaultdict(float)
        n_mb = 0
        epochs_done = 0
        for _ in range(lc.epochs):
            perm = torch.randperm(B, generator=self.gen)
            kl_epoch = []
            for k in range(lc.minibatches):
                idx = perm[k * mb:(k + 1) * mb]
                logp, ent = self.model.logp_entropy(obs[idx], actions[idx])
                a = b_adv[idx]
                if loss_cfg.norm_adv and mb > 1:
                    a = (a - a.mean()) / (a.std() + 1e-8)
                if loss_cfg.kind == LossKind.dual_clip:
                    info = algo.dual_clip_loss(logp, b_old[idx], a, loss_cfg.clip_eps, loss_cfg.dual_clip_c)
                else:
                    info = algo.ppo_clip_loss(logp, b_old[idx], a, loss_cfg.clip_eps)
                v = self.model.value(obs[idx])
                v_loss = 0.5 * ((v - b_ret[idx]) ** 2).mean()
                ent_m = ent.mean()
                loss = info.loss - loss_cfg.ent_coef * ent_m + loss_cfg.vf_coef * v_loss
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(self.model.parameters(), loss_cfg.max_grad_norm)
                self.opt.step()
                with torch.no_grad():
                    kl = float(algo.approx_kl_k3(logp, b_old[idx]))
                kl_epoch.append(kl)
                sums["policy_loss"] += float(info.loss.detach())
                sums["value_loss"] += float(v_loss.detach())
                sums["entropy"] += float(ent_m.detach())
                sums["clip_frac"] += float(info.clip_frac)
                sums["dual_clip_frac"] += float(info.dual_clip_frac)
                sums["approx_kl"] += kl
                n_mb += 1
            epochs_done += 1
            if lc.target_kl is not None and np.mean(kl_epoch) > lc.target_kl:
                break

        self.version += 1
        self.updates += 1
        self.trained_steps += B
        with torch.no_grad():
            ev = algo.explained_variance(values.reshape(-1), b_ret)
        m = {f"losses/{k}": v / n_mb for k, v in sums.items()}
        m.update({
            "losses/explained_variance": ev,
            "lag/min": float(lags.min()),
            "lag/mean": float(lags.mean()),
            "lag/max": float(lags.max()),
            "lag/kl_behavior": lag_kl,
            "charts/lr": float(self.opt.param_groups[0]["lr"]),
            "learner/epochs_done": float(epochs_done),
            "learner/update_s": time.perf_counter() - t_start,
            "learner/version": float(self.version),
        })
        return m

    # ---- checkpoints -------------------------------------------------------------------------------
    def checkpoint_state(self) -> Dict[str, object]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "obs_mean": torch.from_numpy(np.asarray(self.obs_rms.mean, dtype=np.float64)),
            "obs_var": torch.from_numpy(np.asarray(self.obs_rms.var, dtype=np.float64)),
            "obs_count": float(self.obs_rms.count),
            "version": self.version,
            "updates": self.updates,
            "trained_steps": self.trained_steps,
            "rng": self.gen.get_state(),
        }

    def save_checkpoint(self, path: Path) -> Path:
        """Write atomically: a temp file in the same folder, then rename over the target."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        torch.save(self.checkpoint_state(), tmp)
        os.replace(tmp, path)
        return path

    def load_checkpoint(self, path: Path) -> None:
        state = torch.load(path, weights_only=True)
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.obs_rms.mean = state["obs_mean"].numpy()
        self.obs_rms.var = state["obs_var"].numpy()
        self.obs_rms.count = float(state["obs_count"])
        self.version = int(state["version"])
        self.updates = int(state["updates"])
        self.trained_steps = int(state["trained_steps"])
        self.gen.set_state(state["rng"])


def batch_fragments(cfg: Config) -> int:
    return cfg.learner.batch_size // cfg.actor.rollout_len


def lag_ok(cfg: Config, lag: int) -> bool:
    return cfg.learner.max_policy_lag is None or lag <= cfg.learner.max_policy_lag


def summarize_lags(lags: List[int]) -> Dict[str, float]:
    a = np.asarray(lags)
    return {"min": float(a.min()), "mean": float(a.mean()), "max": float(a.max())}
