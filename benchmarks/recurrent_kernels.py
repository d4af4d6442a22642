"""Which recurrent core is cheaper to train on this CPU: forward + backward of torch's nn.GRU and nn.LSTM over one
minibatch of the recurrent learner's shape (``--steps`` steps x ``--seqs`` sequences, encoder width ``--inputs``),
on one thread (the process runner's learner thread count), side by side, with the GRU / LSTM ratio.

    python benchmarks/recurrent_kernels.py [--hidden 64 128] [--steps 32] [--seqs 8] [--inputs 64] [--reps 50]
"""
from __future__ import annotations

import argparse
import time

import torch


def fwd_bwd_ms(kind: str, hidden: int, steps: int, seqs: int, inputs: int, reps: int) -> float:
    core = (torch.nn.GRU if kind == "gru" else torch.nn.LSTM)(inputs, hidden)
    x = torch.randn(steps, seqs, inputs, requires_grad=True)

    def once():
        out, _ = core(x)
        out.sum().backward()

    for _ in range(5):
        once()
    best = float("inf")
    for _ in range(3):  # best of three blocks: the machine is noisy
        t = time.perf_counter()
        for _ in range(reps):
            once()
        best = min(best, (time.perf_counter() - t) / reps * 1e3)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--inputs", type=int, default=64)
    ap.add_argument("--reps", type=int, default=50)
    a = ap.parse_args()
    torch.set_num_threads(1)
    print(f"forward + backward, {a.steps} steps x {a.seqs} sequences, {a.inputs} inputs, 1 thread (best of 3 x {a.reps})")
    for h in a.hidden:
        g, l = (fwd_bwd_ms(k, h, a.steps, a.seqs, a.inputs, a.reps) for k in ("gru", "lstm"))
        print(f"  hidden {h:4d}: GRU {g:6.2f} ms  LSTM {l:6.2f} ms  GRU / LSTM = {g / l:.2f}")


if __name__ == "__main__":
    main()
