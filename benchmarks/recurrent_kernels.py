"""Which recurrent core is cheaper to train on this CPU: forward + backward of torch's nn.GRU and nn.LSTM and of the
numpy GRU the learner's numpy step uses (``laglab.npstep.gru_forward`` / ``gru_backward``, with an episode end in
every sequence) over one minibatch of the recurrent learner's shape (``--steps`` steps x ``--seqs`` sequences,
encoder width ``--inputs``), on one thread (the process runner's learner: one torch thread, one BLAS thread), side by
side, with each one's ratio to torch's LSTM.

    python benchmarks/recurrent_kernels.py [--hidden 64 128] [--steps 32] [--seqs 8] [--inputs 64] [--reps 50]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # (as train.py sets it for a run's learner, before numpy loads)
import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "platform"))
from laglab.npstep import gru_backward, gru_forward  # noqa: E402


def fwd_bwd_ms(kind: str, hidden: int, steps: int, seqs: int, inputs: int, reps: int) -> float:
    core = (torch.nn.GRU if kind == "gru" else torch.nn.LSTM)(inputs, hidden)
    x = torch.randn(steps, seqs, inputs, requires_grad=True)

    def once():
        out, _ = core(x)
        out.sum().backward()

    return best_ms(once, reps)


def numpy_gru_ms(hidden: int, steps: int, seqs: int, inputs: int, reps: int) -> float:
    core = torch.nn.GRU(inputs, hidden)
    w = [p.detach().numpy() for p in core.parameters()]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((steps, seqs, inputs)).astype(np.float32)
    h0 = np.zeros((seqs, hidden), np.float32)
    keep = np.ones((steps, seqs), np.float32)
    keep[steps // 2] = 0.0  # (an episode end mid-sequence in each: the resets' cost is in)
    dout = np.ones((steps, seqs, hidden), np.float32)

    def once():
        _, tape = gru_forward(x, h0, keep, *w)
        gru_backward(tape, dout)

    return best_ms(once, reps)


def best_ms(once, reps: int) -> float:
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
        n = numpy_gru_ms(h, a.steps, a.seqs, a.inputs, a.reps)
        print(f"  hidden {h:4d}: torch GRU {g:6.2f} ms ({g / l:.2f}x LSTM)  torch LSTM {l:6.2f} ms  "
              f"numpy GRU {n:6.2f} ms ({n / l:.2f}x LSTM)")


if __name__ == "__main__":
    main()
