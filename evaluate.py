"""Score a trained policy: ``python evaluate.py <run dir> [--episodes 10] [--mode deterministic|sample]
[--checkpoint auto|final|latest|PATH] [--seed S] [--video] [key=value ...]``.

Loads the run's checkpoint (checkpoints/final.pt, else latest.pt) with the observation statistics it acted
with, plays whole episodes on the run's env config, prints mean +- std and writes ``eval.json`` in the run
dir. ``key=value`` arguments override the run's config (e.g. ``env.max_episode_steps=2000``); the options
may also be given that way (``episodes=20 mode=sample``). A checkpoint made for another env or network is
refused, naming what differs. ``--video`` records every episode to ``<run dir>/videos/<checkpoint>-<mode>-<seed>/``
(needs a renderer:
``pip install -e '.[video]'``; MuJoCo also needs ``MUJOCO_GL``), and says what is missing otherwise.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "platform"))

OPTIONS = {"episodes", "mode", "checkpoint", "seed", "video"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--episodes", type=int, default=10)
    ap.add_argument("--mode", choices=["deterministic", "sample"], default="deterministic")
    ap.add_argument("--checkpoint", default="auto", help="auto | final | latest | a path to a .pt file")
    ap.add_argument("--seed", type=int, default=1_000_000, help="episode i is reset with seed + i")
    ap.add_argument("--video", action="store_true", help="record every episode under <run dir>/videos/")
    ap.add_argument("overrides", nargs="*", help="key=value: the options above, or overrides of the run's config")
    args = ap.parse_args(argv)
    overrides = []
    for o in args.overrides:
        key, eq, value = o.partition("=")
        if eq and key in OPTIONS:  # Hydra-style spelling of an option
            if key == "video":
                args.video = value.lower() in ("1", "true", "yes")
            else:
                setattr(args, key, type(getattr(args, key))(value))
        else:
            overrides.append(o)

    from laglab.config import ConfigError
    from laglab.console import log_third_party_to
    from laglab.evaluate import evaluate, find_checkpoint

    if args.episodes < 1:
        print(f"laglab: invalid option: episodes={args.episodes}; allowed: an integer >= 1", file=sys.stderr)
        return 2
    if args.run_dir.is_dir():  # third-party noise (MuJoCo's compiler warnings) goes to a log file, not the terminal
        log_third_party_to(args.run_dir / "evaluate.log")

    video = None
    try:
        if args.video:  # named by the checkpoint it plays (final, latest or the file's name), not by "auto"
            which = find_checkpoint(args.run_dir, args.checkpoint).stem if args.run_dir.is_dir() else args.checkpoint
            video = args.run_dir / "videos" / f"{Path(which).stem}-{args.mode}-{args.seed}"
        out = evaluate(args.run_dir, args.episodes, args.mode, args.checkpoint, args.seed, video, overrides)
    except ConfigError as e:
        print(f"laglab: {e}", file=sys.stderr)
        return 2
    print(f"{out['env_id']}, {out['checkpoint']} (policy version {out['policy_version']}, "
          f"{out['trained_env_steps']:,} env steps trained): {out['episodes']} episodes, {out['mode']}: "
          f"return {out['return_mean']:.1f} +- {out['return_std']:.1f} (min {out['return_min']:.1f}, "
          f"max {out['return_max']:.1f}), mean length {out['length_mean']:.0f}")
    if out.get("video_dir"):
        print(f"videos: {out['video_dir']} ({len(out.get('videos', []))} files)")
    print(f"-> {args.run_dir / 'eval.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
