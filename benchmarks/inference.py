"""The actors' inference cost per call: ``InferencePolicy.act`` with the policy and value MLPs as two networks
and as one (first layers side by side, later ones block-diagonal: ``laglab.inference.InferencePolicy._fuse``), side
by side, for CartPole's shape (4 obs, 2 actions) and HalfCheetah's (17 obs, 6 continuous actions) at several
hidden widths and batch sizes (an actor's batch is its env count). Prints microseconds per call (best of
``--blocks`` blocks of ``--calls`` calls) and the fused / separate ratio: what ``FUSE_MAX_WIDTH`` is chosen from.

    python benchmarks/inference.py [--widths 32 64 128 256] [--batch 4 8 32] [--calls 5000] [--blocks 5]
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # (as an actor process runs)

import numpy as np  # noqa: E402

from laglab.envs import EnvSpec  # noqa: E402
import laglab.inference as inference  # noqa: E402
from laglab.inference import InferencePolicy  # noqa: E402
from laglab.policy import ActorCritic, Snapshot  # noqa: E402

SHAPES = {
    "cartpole": EnvSpec((4,), True, 2),
    "halfcheetah": EnvSpec((17,), False, 6, -np.ones(6, np.float32), np.ones(6, np.float32)),
}


def per_call_us(policy: InferencePolicy, batch: int, calls: int, blocks: int) -> float:
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((batch,) + policy.spec.obs_shape).astype(np.float32)
    for _ in range(200):
        policy.act(obs, rng)
    best = float("inf")
    for _ in range(blocks):  # best of several blocks: the machine is noisy
        t = time.perf_counter()
        for _ in range(calls):
            policy.act(obs, rng)
        best = min(best, (time.perf_counter() - t) / calls * 1e6)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--widths", type=int, nargs="+", default=[32, 64, 128, 256])
    ap.add_argument("--batch", type=int, nargs="+", default=[4, 8, 32])
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--blocks", type=int, default=5)
    args = ap.parse_args()
    inference.FUSE_MAX_ROWS = 1 << 30  # both contenders at every batch size, whatever FUSE_MAX_ROWS says
    print("| shape | hidden | batch | separate us/call | fused us/call | fused / separate |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, spec in SHAPES.items():
        for width in args.widths:
            model = ActorCritic(spec, (width, width))
            snap = Snapshot.make(0, model, np.zeros(spec.obs_shape), np.ones(spec.obs_shape))
            fused = InferencePolicy(snap, spec)
            fused.fused = InferencePolicy._fuse(fused.pi, fused.v)  # (whatever FUSE_MAX_WIDTH says)
            separate = InferencePolicy(snap, spec)
            separate.fused = None
            for batch in args.batch:
                s, f = [], []
                for _ in range(2):  # interleaved
                    s.append(per_call_us(separate, batch, args.calls, args.blocks))
                    f.append(per_call_us(fused, batch, args.calls, args.blocks))
                s_us, f_us = min(s), min(f)
                print(f"| {name} | {width}x{width} | {batch} | {s_us:.1f} | {f_us:.1f} | {f_us / s_us:.2f} |",
                      flush=True)


if __name__ == "__main__":
    main()
