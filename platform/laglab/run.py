"""One training run: build the learner and tracker, hand them to the configured runner, and always leave
a readable run dir (metrics, summary marked with how the run ended, checkpoint)."""
from __future__ import annotations

import logging
import random
import time
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch
from omegaconf import OmegaConf

from .config import Config, ConfigError, usable_cpus
from .accounting import Budget
from .checks import check_resume, env_spec, prestart, resume_checkpoint  # noqa: F401 - check_resume, env_spec: API
from .learner import INCARNATION_MARK, Learner
from .lifetime import sweep_left_dirs
from .shm import sweep_stale
from . import runners, timeline
from .console import footer
from .tracking import Tracker

log = logging.getLogger("laglab")


def cpu_model() -> Optional[str]:
    """The CPU's model name and its widest vector instructions (``"Intel(R) Xeon(R) Processor, avx512f"``): the same
    commit and seed give bit-identical runs on one kind of CPU only (float rounding differs between instruction
    sets, and the trajectories part after a few updates), so a study says which CPUs its runs had."""
    try:
        with open("/proc/cpuinfo") as f:
            head = f.read().split("\n\n", 1)[0]
    except OSError:
        return None
    info = dict(line.split(":", 1) for line in head.splitlines() if ":" in line)
    info = {k.strip(): v.strip() for k, v in info.items()}
    flags = set(info.get("flags", "").split())
    isa = next((x for x in ("avx512f", "avx2", "avx", "sse4_2") if x in flags), None)
    name = info.get("model name") or info.get("Model") or info.get("cpu model")
    return ", ".join(x for x in (name, isa) if x) or None


def git_state(src: Path) -> Tuple[Optional[str], Optional[bool]]:
    """(the checkout's commit, whether its tracked files differ from it); (None, None) outside git."""
    import subprocess

    try:
        git = lambda *a: subprocess.run(["git", "-C", str(src), *a], capture_output=True, text=True,  # noqa: E731
                                        timeout=5).stdout.strip()
        commit = git("rev-parse", "HEAD") or None
        return commit, bool(git("status", "--porcelain", "--untracked-files=no")) if commit else None
    except (OSError, subprocess.SubprocessError):
        return None, None


def provenance() -> Dict[str, Any]:
    """Where a run came from and what the machine was doing when it started: git commit and dirty flag of the
    source tree, package versions, host, command line, start time, and the host's load (``load_1min``: the 1-min
    load average; ``cpu_count``; ``laglab_runs_alive``: other processes running train.py, not this one's
    ancestors). :func:`host_load_over` adds, at the run's end, what the rest of the machine used while it ran
    (``cpu_busy``). The analysis shows the code per group, warns when groups ran different code, and warns when
    wall-clock measures were taken under load. Nothing here waits: it is on every run's start-up path."""
    import datetime
    import os
    import platform as stdlib_platform
    import sys
    from importlib.metadata import PackageNotFoundError, version

    out: Dict[str, Any] = {"host": stdlib_platform.node(), "python": stdlib_platform.python_version(),
                           "command": " ".join(sys.argv), "start_time": datetime.datetime.now().isoformat(timespec="seconds")}
    for pkg in ("laglab", "torch", "gymnasium", "numpy"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    out["git_commit"], out["git_dirty"] = git_state(Path(__file__).resolve().parents[2])
    out["cpu_count"] = os.cpu_count()
    out["usable_cpus"] = usable_cpus()  # (affinity capped by a cgroup quota: the cores the run could use)
    out["cpu"] = cpu_model()
    try:
        out["load_1min"] = os.getloadavg()[0]
    except OSError:
        out["load_1min"] = None
    try:
        mine, pid = set(), os.getpid()
        while pid > 1 and pid not in mine:  # this process and its ancestors (a sweep's parent, a launcher)
            mine.add(pid)
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        alive = 0
        for d in os.listdir("/proc"):
            if d.isdigit() and int(d) not in mine:
                try:
                    with open(f"/proc/{d}/cmdline", "rb") as f:
                        argv = f.read().split(b"\0")
                except OSError:
                    continue
                alive += any(a.endswith(b"train.py") for a in argv)
        out["laglab_runs_alive"] = alive
    except OSError:
        out["laglab_runs_alive"] = None
    return out


def _cpu_jiffies() -> Tuple[int, int, int]:
    """(all CPUs' time, all CPUs' busy time, the time this process and its descendants used), in clock ticks.

    Descendants: the live ones (the process runner's fork server and the actors it forked) each with what it
    reaped, plus what this process reaped; so a run's own actors are never "other" load. Ray's workers are not
    descendants (Ray's raylet starts them)."""
    import os

    from .config import machine_cpu_ticks
    total, busy = machine_cpu_ticks()
    stats = proc_stats(reaped=True)
    return total, busy, sum(stats[p][1] for p in descendants(stats, os.getpid()) if p in stats)


def proc_stats(reaped: bool) -> Dict[int, Tuple[int, int]]:
    """{pid: (ppid, CPU time in clock ticks)} of every process now: user + system time, and with ``reaped`` also
    what each has reaped of its children."""
    import os
    stats = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    rest = f.read().rsplit(")", 1)[1].split()
            except OSError:  # (exited while we looked)
                continue
            # ppid; utime + stime (+ cutime + cstime: what it reaped)
            stats[int(d)] = (int(rest[1]), sum(int(x) for x in rest[11:15 if reaped else 13]))
    return stats


def descendants(stats: Dict[int, Tuple[int, int]], root: int) -> set:
    """``root`` and every process below it in ``stats`` (a :func:`proc_stats` reading)."""
    mine, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _) in stats.items():
            if ppid == parent and pid not in mine:
                mine.add(pid)
                frontier.append(pid)
    return mine


def host_load_over(start: Optional[Tuple[int, int, int]]) -> Dict[str, Any]:
    """``cpu_busy``: the fraction of the machine's CPU time that *other* processes used since ``start`` (a
    :func:`_cpu_jiffies` reading; this process and its descendants, the actor processes among them, are not
    others — Ray's workers are), and the 1-min load average at the end."""
    import os
    out: Dict[str, Any] = {}
    try:
        out["load_1min_end"] = os.getloadavg()[0]
        t1, b1, o1 = _cpu_jiffies()
        t0, b0, o0 = start
        out["cpu_busy"] = round(min(1.0, max(0.0, ((b1 - b0) - (o1 - o0)) / (t1 - t0))), 3) if t1 > t0 else None
        out["cpu_busy_own_excluded"] = True  # (its actor processes too: runs before this key counted them as load)
    except (OSError, ValueError, IndexError, TypeError):
        out["cpu_busy"] = None
    return out


def device_name(device: torch.device) -> str:
    """The learner's device (as :func:`laglab.learner.resolve_device` gives it, with its index) as a person reads it:
    ``cpu``, ``cuda:0 (NVIDIA A100-SXM4-40GB)``, ``mps:0``."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


class CheckpointFailed(RuntimeError):
    """Training completed but checkpoints/final.pt could not be written (summary.json says why)."""


def start_tracker(cfg: Config, run_dir: Path, resolved_config: Dict[str, Any], group: Optional[str]) -> Tracker:
    """The run's tracker; a W&B that cannot start online is a :class:`ConfigError` naming the mode. An offline
    W&B run starts in the background (the run does not wait for it) and says once, when it is up, the command
    that uploads it later."""
    mode = cfg.tracking.wandb.mode
    try:
        return Tracker(run_dir, cfg.tracking, cfg.total_env_steps, resolved_config, cfg.algo.name, group,
                       wandb_background=True)
    except Exception as e:  # noqa: BLE001 - W&B's own errors (credentials, network) have no common base class
        if mode == "disabled":
            raise
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"invalid config: tracking.wandb.mode={mode}: W&B did not start ({why}); allowed: offline | "
                          "disabled, or fix what W&B reports (credentials: `wandb login`)") from e


def run(cfg: Config, run_dir: Path, resolved_config: Optional[Dict[str, Any]] = None,
        group: Optional[str] = None) -> Dict[str, Any]:
    """Train once; ``resolved_config`` is what W&B records as the run's config (default: ``cfg``),
    ``group`` the W&B group when the config names none (train.py passes the sweep dir in a multirun)."""
    run_dir = Path(run_dir)
    timeline.reset(keep=("process_start", "interpreter", "config", "imports"))  # (train.py's; a second run()
    # in one process starts its own learner, tracker and actors)
    stale = sweep_stale()
    if stale:
        pids = sorted({n.split("-")[1] for n in stale})
        log.info("laglab: removed %d shared-memory segment(s) left in /dev/shm by killed runs (pid %s)", len(stale),
                 ", ".join(pids))
    sweep_left_dirs()
    torch.set_num_threads(cfg.runner.torch_threads)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    spec = prestart(cfg)  # everything a run is refused for, before anything is created
    learner = Learner(cfg, spec)
    timeline.mark("learner")
    if cfg.learner.checkpoint or cfg.learner.checkpoint_every:
        learner.incarnation_mark = run_dir / "checkpoints" / INCARNATION_MARK
    used = 0
    if cfg.resume:
        ck = resume_checkpoint(cfg.resume)
        used = learner.load_checkpoint(ck)
        log.info("laglab: resumed from %s at policy version %d, %d env steps", ck, learner.version, used)
    budget = Budget(cfg.total_env_steps, used)
    if resolved_config is None:
        resolved_config = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True, enum_to_str=True)
    tracker = start_tracker(cfg, run_dir, resolved_config, group)
    timeline.mark("tracker")  # (the tracker's clock, the metrics' wall_time, starts here)
    wandb_mode = tracker.wandb.mode if tracker.wandb else "disabled"
    auto = getattr(cfg, "actors_auto", None)  # how actors=auto chose (validate), else null: the count was given
    device = device_name(learner.device)
    base = {"algo": cfg.algo.name, "actors": cfg.actors, "actors_auto": auto, "seed": cfg.seed,
            "runner": cfg.runner.name.value, "learner_device": device, "learner_backend": learner.backend,
            "torch_threads_auto": getattr(cfg, "torch_threads_auto", None),  # (null: runner.torch_threads was given)
            "env_id": cfg.env.id, "total_env_steps": cfg.total_env_steps, "resumed_from": cfg.resume,
            "start_env_steps": used, "start_version": learner.version, "wandb_mode": wandb_mode,
            "provenance": {**provenance(), "learner_device": device, "learner_backend": learner.backend,
                           "torch_threads": torch.get_num_threads()}}
    try:
        cpu0: Optional[Tuple[int, int, int]] = _cpu_jiffies()
    except (OSError, ValueError, IndexError):
        cpu0 = None
    threads = cfg.runner.torch_threads
    log.info("laglab: %s on %s, %d actor(s)%s, runner=%s, learner on %s%s, seed=%d -> %s", cfg.algo.name, cfg.env.id,
             cfg.actors, f" (actors=auto: {auto['cpus']} usable CPU(s))" if auto else "", cfg.runner.name.value,
             device, f" ({threads} torch threads)" if threads != 1 else "", cfg.seed, run_dir)
    status, error, result = "failed", None, {}
    t0 = time.perf_counter()
    try:
        result = runners.get(cfg.runner.name)(cfg, learner, tracker, spec, budget, run_dir)
        status = "completed"
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):
            status = "interrupted"
        else:
            error = f"{type(e).__name__}: {e}"
        books = getattr(e, "laglab_books", None)
        if books is not None:  # the books up to the failure or interruption (every actor has stopped by now)
            try:
                result = books()
            except Exception:  # noqa: BLE001 - a failure report must not fail
                pass
        raise
    finally:
        wall = time.perf_counter() - t0
        env_steps = budget.used
        summary = dict(base)
        summary["provenance"] = {**base["provenance"], **host_load_over(cpu0)}
        summary.update({
            "status": status,
            "env_steps": env_steps,
            "updates": learner.updates,
            "policy_version": learner.version,
            "diverged_at_update": learner.diverged_at,  # null: every update's loss was finite
            "wall_time_s": wall,
            "sps": (env_steps - used) / wall if wall > 0 else 0.0,
        })
        if error:
            summary["error"] = error
        summary["startup"] = timeline.startup()
        summary["startup_actors"] = timeline.actor_starts()
        for key in ("transport", "chaos", "actor_restarts", "cpu"):
            if key in result:
                summary[key] = result[key]
        if "actor_stats" in result:
            summary["actors_stats"] = {str(i): vars(s) for i, s in sorted(result["actor_stats"].items())}
        if cfg.learner.checkpoint:
            try:
                summary["checkpoint"] = str(learner.save_checkpoint(run_dir / "checkpoints" / "final.pt", env_steps))
                learner.settle_incarnation_mark()  # (every actor has stopped: no number is handed out any more)
            except Exception as e:  # noqa: BLE001 - a full disk, a file in the way: the summary is written regardless
                summary["checkpoint_error"] = f"{type(e).__name__}: {e}"
                log.error("laglab: the final checkpoint could not be written: %s", summary["checkpoint_error"])
        summary = tracker.finish(summary)
        log.info("%s", footer(summary, run_dir))  # run dir, return, lag, books, faults, W&B, next commands
    if "checkpoint_error" in summary:  # training completed, its weights are not on disk: not a success
        raise CheckpointFailed(f"the final checkpoint could not be written ({summary['checkpoint_error']}); "
                               f"{run_dir / 'summary.json'} has the run's figures")
    return summary
