"""MuJoCo throughput side by side: a CleanRL-style PPO (written here from CleanRL's ppo_continuous_action
recipe: one env, 2,048-step rollouts, 10 epochs x 32 minibatches, 64-64 tanh actor and critic, normalized
and clipped observations and rewards, one Python process) against laglab's default preset for the same env
on the same budget, in one invocation. Prints SPS, the wall clock that SPS means per 1M env steps, and the
ratio, so issue 18's "at most a quarter of CleanRL's wall clock per 1M steps" goal (an earlier round's: at most half)
is checked without running CleanRL itself.

    python benchmarks/mujoco.py [--env HalfCheetah-v5] [--preset halfcheetah] [--steps 50000] [--runners process thread]

Both contenders are timed from the start of training (imports excluded). The CleanRL-style loop is a
throughput reference, not a port: it learns like CleanRL's recipe, and its returns are printed only as a
sign that it trains.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# this file's own folder comes first on sys.path when it runs as a script, and this file is named like the
# ``mujoco`` package that gymnasium imports: take the folder off the path
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def cleanrl_style(env_id: str, steps: int, seed: int = 0) -> dict:
    import gymnasium as gym
    import torch
    from torch import nn

    torch.manual_seed(seed)
    env = gym.make(env_id)
    env = gym.wrappers.RecordEpisodeStatistics(env)
    env = gym.wrappers.ClipAction(env)
    env = gym.wrappers.NormalizeObservation(env)
    env = gym.wrappers.TransformObservation(env, lambda o: np.clip(o, -10, 10), env.observation_space)
    env = gym.wrappers.NormalizeReward(env, gamma=0.99)
    env = gym.wrappers.TransformReward(env, lambda r: float(np.clip(r, -10, 10)))
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]

    def mlp(out, gain):
        layers = [nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, out)]
        for i, layer in enumerate(x for x in layers if isinstance(x, nn.Linear)):
            nn.init.orthogonal_(layer.weight, gain if i == 2 else np.sqrt(2))
            nn.init.zeros_(layer.bias)
        return nn.Sequential(*layers)

    actor, critic = mlp(act_dim, 0.01), mlp(1, 1.0)
    log_std = nn.Parameter(torch.zeros(act_dim))
    params = list(actor.parameters()) + list(critic.parameters()) + [log_std]
    opt = torch.optim.Adam(params, lr=3e-4, eps=1e-5)
    T, epochs, mbs, gamma, lam = 2048, 10, 32, 0.99, 0.95
    buf_o = torch.zeros(T, obs_dim)
    buf_a = torch.zeros(T, act_dim)
    buf_lp, buf_r, buf_d, buf_v = (torch.zeros(T) for _ in range(4))
    o, _ = env.reset(seed=seed)
    o = torch.tensor(o, dtype=torch.float32)
    done = 0.0
    returns = []
    t0 = time.perf_counter()
    n_updates = steps // T
    for u in range(n_updates):
        for g in opt.param_groups:
            g["lr"] = 3e-4 * (1 - u / n_updates)
        for t in range(T):
            with torch.no_grad():
                mean = actor(o)
                a = mean + torch.randn(act_dim) * log_std.exp()
                lp = torch.distributions.Normal(mean, log_std.exp()).log_prob(a).sum()
                v = critic(o)[0]
            o2, r, term, trunc, info = env.step(a.numpy())
            buf_o[t], buf_a[t], buf_lp[t], buf_r[t], buf_d[t], buf_v[t] = o, a, lp, float(r), done, v
            done = float(term or trunc)
            if term or trunc:
                returns.append(float(info["episode"]["r"]))
                o2, _ = env.reset()
            o = torch.tensor(o2, dtype=torch.float32)
        with torch.no_grad():
            nxt = critic(o)[0]
            adv = torch.zeros(T)
            last = 0.0
            for t in reversed(range(T)):
                nd = 1.0 - (done if t == T - 1 else buf_d[t + 1])
                nv = nxt if t == T - 1 else buf_v[t + 1]
                delta = buf_r[t] + gamma * nv * nd - buf_v[t]
                last = delta + gamma * lam * nd * last
                adv[t] = last
            ret = adv + buf_v
        mb = T // mbs
        for _ in range(epochs):
            perm = torch.randperm(T)
            for k in range(mbs):
                i = perm[k * mb:(k + 1) * mb]
                mean = actor(buf_o[i])
                dist = torch.distributions.Normal(mean, log_std.exp())
                lp = dist.log_prob(buf_a[i]).sum(-1)
                ratio = (lp - buf_lp[i]).exp()
                a_ = (adv[i] - adv[i].mean()) / (adv[i].std() + 1e-8)
                pg = torch.max(-a_ * ratio, -a_ * ratio.clamp(0.8, 1.2)).mean()
                vl = 0.5 * ((critic(buf_o[i]).squeeze(-1) - ret[i]) ** 2).mean()
                loss = pg + 0.5 * vl
                opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(params, 0.5)
                opt.step()
    wall = time.perf_counter() - t0
    done_steps = n_updates * T
    return {"who": "CleanRL-style PPO (1 process)", "sps": done_steps / wall, "wall": wall, "steps": done_steps,
            "final": float(np.mean(returns[-20:])) if returns else float("nan")}


def laglab(preset: str, steps: int, runner: str, out: Path) -> dict:
    run_dir = out / runner
    cmd = [sys.executable, str(ROOT / "train.py"), f"env={preset}", f"runner={runner}", f"total_env_steps={steps}",
           f"hydra.run.dir={run_dir}", "tracking.wandb.mode=disabled", "tracking.progress=false",
           "tracking.console_every_s=1e9"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-3000:])
    s = json.loads((run_dir / "summary.json").read_text())
    return {"who": f"laglab {preset}, runner={runner}", "sps": s["sps"], "wall": s["wall_time_s"],
            "steps": s["env_steps"], "final": s["final_return_mean"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="HalfCheetah-v5")
    ap.add_argument("--preset", default="halfcheetah")
    ap.add_argument("--steps", type=int, default=50_000)
    ap.add_argument("--runners", nargs="+", default=["process"])
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="laglab-mujoco-"))
    rows = [cleanrl_style(args.env, args.steps)] + [laglab(args.preset, args.steps, r, out) for r in args.runners]
    base = rows[0]["sps"]
    print(f"\n{args.env}, {args.steps:,} env steps each (run dirs under {out})\n")
    print("| who | SPS | minutes per 1M steps | wall clock vs CleanRL-style | return (last 20 episodes) |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['who']} | {r['sps']:,.0f} | {1e6 / r['sps'] / 60:.1f} | {base / r['sps']:.2f}x | "
              + (f"{r['final']:.1f} |" if r["final"] is not None else "- (no episode finished) |"))


if __name__ == "__main__":
    main()
