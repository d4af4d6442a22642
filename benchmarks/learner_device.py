"""The learner's update on every device this machine has, side by side: updates per second and samples per second of
update (batch transitions / update time) for the presets and for a large network, with each row's ratio to the CPU
learner at one thread (the runners' default, ``runner.torch_threads=1``), by torch's autograd (``learner.backend=torch``).
The CPU rows include the numpy step (``learner.backend=numpy``, feed-forward cases; ``cpu (numpy)``), on one BLAS
thread as in a run.

    python benchmarks/learner_device.py [--cases cartpole pendulum halfcheetah large] [--threads 1 2] [--updates 5]
                                        [--devices cpu cuda:0 ...] [--backends torch numpy]

A case is a batch collected once by an actor (numpy, as in a run) from the preset's env; the learner then runs
``--updates`` full updates on it (targets, epochs x minibatches of PPO steps, the optimizer) after one warm-up
update, best of three blocks (the machine is noisy); each row's speed-up is given against the CPU learner at one
thread and at its best thread count (the fair baseline for an accelerator). The large network: ``policy.hidden_sizes=[256,256]``,
``learner.batch_size=8192`` (64 envs x rollout 128), 4 epochs of 4 minibatches, on HalfCheetah-v5 (Pendulum-v1 where
MuJoCo is not installed). Devices: the CPU at each ``--threads`` count, then every CUDA device and MPS where torch sees
one. On a machine without an accelerator only CPU rows are measured; the table says what a GPU machine adds.
"""
from __future__ import annotations

import argparse
import os
import sys

# numpy's BLAS on one thread, as train.py sets it for a run's learner (before numpy loads)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import time
from typing import Dict, List, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (the script's own folder leaves sys.path: benchmarks/mujoco.py would shadow the mujoco package)
sys.path[:] = [os.path.join(ROOT, "platform")] + [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(
    os.path.abspath(__file__))]

CASES: Dict[str, List[str]] = {
    "cartpole": ["env=cartpole"],
    "pendulum": ["env=pendulum"],
    "halfcheetah": ["env=halfcheetah"],
    "large": ["env=halfcheetah", "policy.hidden_sizes=[256,256]", "learner.batch_size=8192", "actor.envs_per_actor=64",
              "actor.rollout_len=128", "learner.epochs=4", "learner.minibatches=4"],
}


def have_mujoco() -> bool:
    try:
        import mujoco  # noqa: F401
        return True
    except ImportError:
        return False


def batch_for(overrides: Sequence[str]):
    """(cfg, fragments of one batch), collected by one actor from a fresh policy."""
    from laglab.actor import Actor
    from laglab.checks import env_spec
    from laglab.learner import Learner
    from laglab.preflight import compose

    cfg = compose([*overrides, "actors=1", "learner.device=cpu", "tracking.wandb.mode=disabled"])
    learner = Learner(cfg, env_spec(cfg))
    actor = Actor(cfg, 0, 1)
    actor.load(learner.snapshot())
    n = cfg.learner.batch_size // cfg.actor.rollout_len
    frags = []
    while len(frags) < n:
        frags += actor.collect().fragments
    actor.close()
    return cfg, frags[:n]


def time_updates(cfg, frags, device: str, threads: int, updates: int, backend: str = "torch") -> float:
    """Seconds per update, best of three blocks of ``updates`` after a warm-up update."""
    import dataclasses

    import torch

    from laglab.checks import env_spec
    from laglab.learner import Learner

    torch.set_num_threads(threads)
    cfg = dataclasses.replace(cfg, learner=dataclasses.replace(cfg.learner, device=device, backend=backend))
    learner = Learner(cfg, env_spec(cfg))
    dev = learner.device  # (the device the update ran on: cuda:N waits for cuda:N)
    sync = ((lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: torch.mps.synchronize())
            if dev.type == "mps" else (lambda: None))
    learner.update(frags)
    sync()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(updates):
            learner.update(frags)
        sync()
        best = min(best, (time.perf_counter() - t) / updates)
    return best


def over_recurrent(over: Sequence[str]) -> bool:
    return any(o.startswith("policy.recurrent=") and not o.endswith("=none") for o in over)


def _split(chunk: str) -> List[str]:
    """Overrides separated by commas, keeping a list value's commas (``policy.hidden_sizes=[256,256]``)."""
    out, depth, cur = [], 0, ""
    for ch in chunk:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return [o for o in out + [cur] if o]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--case", action="append", default=[], metavar="NAME:OVERRIDES",
                    help="one more case, e.g. wide_mb256:env=pendulum,policy.hidden_sizes=[256,256],learner.minibatches=8")
    ap.add_argument("--threads", nargs="+", type=int, default=None,
                    help="CPU thread counts (default: 1 and the CPUs this process may use)")
    ap.add_argument("--devices", nargs="+", default=None, help="default: cpu and every accelerator torch sees")
    ap.add_argument("--updates", type=int, default=5)
    ap.add_argument("--backends", nargs="+", default=["torch", "numpy"], choices=["torch", "numpy"],
                    help="the CPU learner's minibatch steps (learner.backend); numpy on one BLAS thread, as in a run")
    args = ap.parse_args(argv)

    import torch

    from laglab.config import available_devices, usable_cpus

    cpus = usable_cpus()
    threads = sorted(set(args.threads or [1, cpus]))
    devices = args.devices or available_devices()
    accelerators = [d for d in devices if d != "cpu"]
    rows = []
    extra = {}
    for spec in args.case:
        name, _, over = spec.partition(":")
        extra[name] = _split(over)
    for case in list(args.cases) + list(extra):
        over = list(CASES[case] if case in CASES else extra[case])
        if "env=halfcheetah" in over and not have_mujoco():
            if case != "large":
                print(f"{case}: skipped (MuJoCo is not installed: pip install -e '.[mujoco]')")
                continue
            over[over.index("env=halfcheetah")] = "env=pendulum"
        cfg, frags = batch_for(over)
        B = cfg.learner.batch_size
        steps = cfg.learner.epochs * cfg.learner.minibatches
        cpu = "cpu" in devices
        where = ([("cpu", t, "torch") for t in threads if cpu and "torch" in args.backends]
                 + [("cpu", 1, "numpy")] * (cpu and "numpy" in args.backends and not over_recurrent(over))
                 + [(d, 1, "torch") for d in accelerators])
        timed = []
        for device, t, backend in where:
            s = time_updates(cfg, frags, device, t, args.updates, backend)
            name = device if backend == "torch" else f"{device} (numpy)"
            timed.append((name, t, s))
            print(f"  {case} on {name} ({t} thread(s)): {s * 1e3:.1f} ms per update", file=sys.stderr, flush=True)
        # the baseline: torch's CPU update at one thread, the runners' default before learner.backend
        one = next((s for d, t, s in timed if d == "cpu" and t == 1), None)
        best = min((s for d, t, s in timed if d.startswith("cpu")), default=None)  # the CPU at its best
        for device, t, s in timed:
            rows.append((case, cfg.env.id, "x".join(map(str, cfg.policy.hidden_sizes)), B, steps, device, t, s, one,
                         best))
    print(f"\ntorch {torch.__version__}, {cpus} usable CPU(s); devices measured: {', '.join(devices)}")
    head = ("case", "env", "net", "batch", "steps/update", "device", "threads", "ms/update", "updates/s",
            "samples/s", "vs cpu x1", "vs best cpu")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for case, env, net, B, steps, device, t, s, one, best in rows:
        r1, rb = (f"{b / s:.2f}x" if b else "-" for b in (one, best))
        print(f"| {case} | {env} | {net} | {B} | {steps} | {device} | {t} | {s * 1e3:.1f} | {1 / s:.2f} | "
              f"{B / s:,.0f} | {r1} | {rb} |")
    if not accelerators:
        print("\nNo CUDA or MPS device here: CPU rows only. Where torch sees a GPU, each case gets a row per device "
              "(learner.device=cuda:N); 'vs best cpu' is the speed-up of the learner's update over this machine's CPU "
              "learner at its best thread count: issue 23's goal is >= 5x for the large network on one GPU.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
