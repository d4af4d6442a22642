"""Config schema (checked by Hydra/OmegaConf) and the cross-field rules a schema cannot express.

The tree mirrors the system: ``algo`` (advantage estimator + policy loss), ``env``, ``policy`` (network),
``actor``, ``learner``, ``runner``, ``transport``, ``tracking``; ``actors``, ``seed`` and
``total_env_steps`` sit at the top. Types, unknown keys and enum values are rejected by OmegaConf when
Hydra composes the config; :func:`validate` rejects combinations, before any thread starts.
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import math
import os
import typing
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from omegaconf import DictConfig, OmegaConf


class Estimator(str, Enum):
    gae = "gae"
    vtrace = "vtrace"


class LossKind(str, Enum):
    clip = "clip"
    dual_clip = "dual_clip"
    decoupled = "decoupled"  # clip around a proximal policy, importance weight pi_prox/mu (algo.decoupled_loss)
    decoupled_dual_clip = "decoupled_dual_clip"  # the same with dual-clip's bound c*A for A < 0


class Prox(str, Enum):
    start = "start"  # the learner's policy at the start of the update (the policy PPO's clip is around)
    ewma = "ewma"  # an exponentially weighted moving average of the weights (Hilton et al. 2022, PPO-EWMA)


class LrSchedule(str, Enum):
    linear = "linear"  # annealed linearly in learner progress, reaching 0 at the budget
    constant = "constant"
    kl_adaptive = "kl_adaptive"  # Sample Factory's rule, per minibatch, around learner.kl_target


class RunnerKind(str, Enum):
    thread = "thread"
    sync = "sync"
    process = "process"
    ray = "ray"


class Duplicates(str, Enum):
    ignore = "ignore"  # a fragment delivered twice is admitted once
    charge = "charge"  # admitted again, and counted


class Overflow(str, Enum):
    block = "block"
    reject = "reject"
    drop_oldest = "drop_oldest"


@dataclass
class AdvantageConfig:
    estimator: Estimator = Estimator.gae
    gamma: float = 0.99
    lam: float = 0.95
    rho_bar: float = 1.0  # V-trace: truncation of the importance weight in the TD error
    c_bar: float = 1.0  # V-trace: truncation of the trace-cutting coefficients


@dataclass
class LossConfig:
    kind: LossKind = LossKind.clip
    clip_eps: float = 0.2
    dual_clip_c: float = 3.0  # lower bound c*A for negative advantages (dual-clip only), must be > 1
    # decoupled: the proximal policy the ratio is clipped around, and the cap of the weight pi_prox/mu
    prox: Prox = Prox.start
    prox_beta: Optional[float] = None  # prox=ewma: decay per optimizer step; null = (K-1)/(K+1), K steps per update
    is_cap: float = 5.0
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    max_grad_norm: float = 0.5
    norm_adv: bool = True


@dataclass
class AlgoConfig:
    name: str = "ppo"
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    loss: LossConfig = field(default_factory=LossConfig)


@dataclass
class EnvConfig:
    id: str = "CartPole-v1"
    kwargs: Dict[str, Any] = field(default_factory=dict)
    max_episode_steps: Optional[int] = None
    normalize_obs: bool = False  # running mean/std owned by the learner, frozen and shipped with every snapshot
    obs_clip: float = 10.0
    normalize_reward: bool = False  # scale rewards by the std of the discounted return (learner side)
    reward_clip: float = 10.0
    latency_ms: List[float] = field(default_factory=list)  # env=latency: per-step cost, cycled over the actors
    # envs that name their legal actions (info["action_mask"], or a Dict observation with an action_mask entry):
    # sample and train under the mask; false = ignore the masks (the policy may pick an illegal action)
    action_mask: bool = True


@dataclass
class PolicyConfig:
    hidden_sizes: List[int] = field(default_factory=lambda: [64, 64])
    activation: str = "tanh"
    log_std_init: float = 0.0
    # none: the MLPs above, one per head. gru | lstm: an encoder MLP (hidden_sizes), a recurrent core of ``hidden``
    # units shared by both heads, then a linear policy head and a linear value head; actors carry one state per env
    # (zero at an episode's start) and ship the state at each fragment's first step (laglab.recurrent)
    recurrent: str = "none"
    hidden: int = 64


@dataclass
class ActorConfig:
    envs_per_actor: int = 8
    rollout_len: int = 32  # steps per fragment
    # an actor pauses once it has produced this many env steps beyond what the learner has consumed
    # of its data, until the next snapshot arrives; null = never pause
    max_lead_steps: Optional[int] = None
    # lag as an independent variable: act with the snapshot exactly this many publications behind the newest
    # (the store keeps the last fixed_lag + 1); null = the newest
    fixed_lag: Optional[int] = None
    # seed 004's forced refresh: while collecting, an actor whose snapshot falls more than refresh_lag versions
    # behind the newest discards the rollout in progress (booked as "refresh") and loads the newest; null = never
    refresh_lag: Optional[int] = None
    # seed 004's minimum sync interval: keep acting with the snapshot until the newest is more than this many
    # versions ahead (0 = load every new version, as without it)
    sync_min_lag: int = 0


@dataclass
class LearnerConfig:
    batch_size: int = 1024  # transitions per update
    epochs: int = 4
    minibatches: int = 4
    lr: float = 1e-3
    lr_schedule: LrSchedule = LrSchedule.linear
    kl_target: Optional[float] = None  # lr_schedule=kl_adaptive: the KL per minibatch step the rule steers to
    lr_min: float = 1e-6  # lr_schedule=kl_adaptive: the bounds of the adapted learning rate
    lr_max: float = 1e-2
    adam_eps: float = 1e-5
    broadcast_every: int = 1  # publish a snapshot every N updates
    max_policy_lag: Optional[int] = None  # drop transitions older than this many versions; null = keep all
    target_kl: Optional[float] = None  # stop the epochs of an update early past this approx KL
    # drop fragments whose KL(behavior || current) exceeds this before the update (booked as "kl"), and when one
    # arrives while the actors act with an older version than the learner's (broadcast_every > 1, fixed_lag),
    # publish the newest to them at once; null = keep all
    max_kl_behavior: Optional[float] = None
    # recurrent policies: the first burn_in steps of a fragment that starts mid-episode from its stored (behavior)
    # state are run under the current policy to refresh the state, left out of the loss and cut from the gradient,
    # as R2D2's burn-in (up to the first episode end in them; 0 = none)
    burn_in: int = 0
    checkpoint: bool = True  # checkpoints/final.pt at the end
    checkpoint_every: int = 0  # also checkpoints/latest.pt every N updates (0 = never)
    # where the learner's update runs: auto (CUDA if available, else CPU) | cpu | cuda | cuda:N | mps; actors are
    # numpy on CPU whatever it is (snapshots are host arrays)
    device: str = "auto"
    # how an update's minibatch steps are computed: auto (numpy for a feed-forward policy on the CPU with
    # runner.torch_threads=1; torch elsewhere) | numpy (on the CPU whatever learner.device says) | torch (autograd).
    # The same arithmetic to float32 rounding (laglab.npstep); numpy is ~2-3x cheaper per step at the presets' sizes
    backend: str = "auto"


BACKENDS = ("auto", "numpy", "torch")


@dataclass
class RunnerConfig:
    name: RunnerKind = RunnerKind.thread  # for the library API (run(cfg)); train.py defaults to process (conf)
    # the learner's torch threads: an integer >= 1, or "auto": the CPUs the actors leave free, where the update is
    # big enough for threads to pay (auto_torch_threads; validate() resolves it to an integer)
    torch_threads: Any = 1
    poll_s: float = 0.05  # how often a waiting thread re-checks for shutdown and failures
    actor_timeout_s: float = 120.0  # learner gives up when no data arrives for this long
    # restart intensity: a crashed or hung actor restarts with a new incarnation, at most this many times per
    # slot within any restart_window_s seconds (more fails the run)
    actors_max_restarts: int = 5
    restart_window_s: float = 10.0
    heartbeat_timeout_s: float = 60.0  # an actor that shows no sign of life this long is declared hung
    restart_backoff_s: float = 0.5  # wait before a restart
    start_method: str = "forkserver"  # process runner: spawn | forkserver
    slots_per_actor: int = 0  # process runner: shared-memory fragment slots per actor (0 = auto)
    start_timeout_s: float = 120.0  # process runner: an actor process that has not started by then fails the run
    actor_nice: int = 19  # process runner: niceness added to actor processes (0 = same priority as the learner)
    address: Optional[str] = None  # ray runner: null = a local Ray instance; "auto" or "ray://host:10001" = a cluster
    cpus_per_actor: float = 1.0  # ray runner: CPUs Ray reserves for each actor
    resource: Optional[str] = None  # ray runner: a custom resource every actor needs (placement on labelled nodes)
    max_inflight: int = 2  # ray runner: rollout calls outstanding per actor (bounds the object store too)


@dataclass
class TransportConfig:
    capacity: int = 64  # fragments in the queue
    max_bytes: int = 256 * 1024 * 1024
    policy: Overflow = Overflow.block
    duplicates: Duplicates = Duplicates.ignore
    dedup_window: int = 64  # fragments remembered per (actor incarnation, env instance) for duplicate detection


@dataclass
class ChaosConfig:
    """Fault injection (laglab.chaos); every probability is per fragment, every event is counted."""

    name: str = "none"
    drop_p: float = 0.0  # lost in transit
    duplicate_p: float = 0.0  # delivered twice
    reorder_p: float = 0.0  # delivered after the next fragment
    delay_p: float = 0.0  # delivered after the next `delay_fragments` fragments
    delay_fragments: int = 4
    # NaN obs | wrong obs shape | impossible probability | unknown schema (| an illegal action's mask | a NaN state)
    corrupt_p: float = 0.0
    kill_every_steps: Optional[int] = None  # an actor crashes once it has produced this many steps
    hang_every_steps: Optional[int] = None  # an actor stops (no heartbeat) once it has produced this many steps
    stall_every_updates: Optional[int] = None  # the learner stalls after every N updates ...
    stall_s: float = 0.0  # ... for this many seconds


@dataclass
class WandbConfig:
    mode: str = "auto"  # online | offline | disabled | auto (online if credentials are configured)
    project: str = "laglab"
    entity: Optional[str] = None
    group: Optional[str] = None
    name: Optional[str] = None
    tags: List[str] = field(default_factory=list)
    init_timeout_s: float = 60.0  # an online init that cannot reach the server fails after this (auto: goes offline)


@dataclass
class TrackingConfig:
    console_every_s: float = 5.0  # a plain progress line in the log (and Hydra's log file)
    progress: bool = True  # a live progress bar when stdout is a terminal
    log_interval_s: float = 2.0  # W&B scalar rows at most this often (metrics.parquet gets every update)
    hist_every: int = 20  # histograms (version lag, data age) every N updates, to W&B and histograms.parquet
    flush_every_s: float = 30.0  # rewrite the parquet files this often, so a crashed run keeps its rows
    return_window: int = 20
    wandb: WandbConfig = field(default_factory=WandbConfig)


@dataclass
class Config:
    # an integer >= 1, or "auto" (train.py's default): the count measured fastest for the runner on the CPUs this
    # process may use (auto_actors); validate() resolves it, so a validated Config always holds an integer
    actors: Any = 4
    seed: int = 0
    total_env_steps: int = 200_000
    resume: Optional[str] = None  # a run dir: continue from its newest checkpoint (version counter intact)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    chaos: ChaosConfig = field(default_factory=ChaosConfig)


_SCHEMAS = {c.__name__: c for c in (AdvantageConfig, LossConfig, AlgoConfig, EnvConfig, PolicyConfig, ActorConfig,
                                     LearnerConfig, RunnerConfig, TransportConfig, ChaosConfig, WandbConfig,
                                     TrackingConfig, Config)}


def _schema_at(path: str) -> type:
    schema: type = Config
    for part in [p for p in path.split(".") if p]:
        t = {f.name: f.type for f in dataclasses.fields(schema)}[part]
        schema = _SCHEMAS[t] if isinstance(t, str) else t
    return schema


SCHEMA_NAME = "laglab_schema"  # not a selectable group option


CGROUP_ROOT = "/sys/fs/cgroup"


def cgroup_quota_files(root: str = CGROUP_ROOT, self_cgroup: str = "/proc/self/cgroup") -> Tuple[str, ...]:
    """The CPU-quota files that bound this process: its own cgroup's and every ancestor's up to the root (cgroup
    v2 ``cpu.max``; v1 ``cpu.cfs_quota_us`` under the cpu controller's mount), from ``/proc/self/cgroup``. A quota
    set on a parent (systemd's ``CPUQuota``, a Kubernetes pod) binds the processes below it, so every level counts;
    without a cgroup namespace the process's own cgroup is not the mount's root."""
    paths: Dict[str, str] = {}
    try:
        for line in Path(self_cgroup).read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers == "":
                paths["v2"] = path
            elif "cpu" in controllers.split(","):
                paths["v1"] = path
    except (OSError, ValueError):
        pass
    out: List[str] = []
    for kind, leaf in (("v2", paths.get("v2", "/")), ("v1", paths.get("v1", "/"))):
        base = Path(root) if kind == "v2" else next(
            (Path(root) / d for d in ("cpu", "cpu,cpuacct", "cpuacct,cpu") if (Path(root) / d).is_dir()),
            Path(root) / "cpu")
        parts = [p for p in leaf.split("/") if p and p != ".."]
        for depth in range(len(parts), -1, -1):
            out.append(str(base.joinpath(*parts[:depth], "cpu.max" if kind == "v2" else "cpu.cfs_quota_us")))
    return tuple(dict.fromkeys(out))


def cpu_quota(files: Optional[Sequence[str]] = None) -> Optional[int]:
    """The CPUs a cgroup's quota allows this process (``docker --cpus=2``, Kubernetes limits, systemd's
    ``CPUQuota``: a quota of 200000 us per 100000 us is 2), rounded up — the smallest over ``files``
    (:func:`cgroup_quota_files`: the process's cgroup and its ancestors); None where no quota is set or none can be
    read."""
    best: Optional[int] = None
    for f in (cgroup_quota_files() if files is None else files):
        try:
            text = Path(f).read_text().split()
            if f.endswith("cpu.max"):  # "<quota> <period>" or "max <period>"
                quota, period = text[0], text[1]
            else:  # cgroup v1: cpu.cfs_quota_us (-1: none) beside cpu.cfs_period_us
                quota, period = text[0], Path(f).with_name("cpu.cfs_period_us").read_text().split()[0]
            if quota in ("max", "-1"):
                continue
            q, per = int(quota), int(period)
            if q > 0 and per > 0:
                n = max(1, -(-q // per))
                best = n if best is None else min(best, n)
        except (OSError, ValueError, IndexError):
            continue
    return best


def machine_cpu_ticks() -> Tuple[int, int]:
    """(every CPU's time, their busy time: all but idle and iowait) since boot, in clock ticks, from /proc/stat
    (the whole machine's, whatever this process may use; OSError where there is none)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    total = sum(v[:8])
    return total, total - v[3] - v[4]


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity (taskset, cgroups' cpusets, SLURM), capped by a cgroup's CPU quota
    (a container limited to 2 CPUs on a 64-CPU host may still see all 64 in its affinity) — not the machine's count."""
    try:
        n = max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # (not Linux)
        n = max(1, os.cpu_count() or 1)
    quota = cpu_quota()
    return min(n, quota) if quota else n


def auto_actors(runner: Any, cpus: int) -> int:
    """The actor count ``actors=auto`` picks for ``runner`` on ``cpus`` usable CPUs: one actor per CPU (the actors
    run at nice 19, so the learner keeps the core it needs), at least one (thread: one, whatever the CPUs: its actors
    share the learner's GIL).

    Measured on this project's 2-CPU machine. Until 2026-12-04 the learner's torch step was the bottleneck and the rule
    was one actor per CPU the learner does not use (1 here: benchmarks/actors_auto.py, reports/actors_knee_cartpole).
    With the numpy learner step (learner.backend) the one actor became the bottleneck; reports/actors_default_cartpole
    and _halfcheetah (sweeps/actors_default.yaml: the process runner at 1, 2 and 3 actors, each at its own tuned lr,
    10 held-out seeds) measured, against 1 actor: CartPole 2 actors +11% SPS at the same AUC per env step (-1.4
    [-9, +10] of 450) and the shortest time to 475; 3 actors +20% SPS but -20 [-30, -10] AUC and no sooner to 475;
    HalfCheetah 2 actors +32% SPS, the same final return, 7% less AUC per env step (-83 [-229, -26]) and sooner to
    1,500 (IQM 39 s vs 43 s, overlapping intervals). So 2 on 2 CPUs; 1 CPU keeps 1 (the actor and the learner share
    it). The sync runner follows the process runner's rule, so ``runner=sync`` beside a default run is the matched
    baseline (the same envs). More CPUs than two were not measured here: one actor per CPU assumes that the learner,
    at nice 0, keeps up with that many."""
    kind = str(getattr(runner, "value", runner))
    return 1 if kind == "thread" else max(1, int(cpus))


# torch_threads=auto gives the update more than one thread only from this much work per minibatch step
# (transitions per minibatch x the widest hidden layer): measured in benchmarks/learner_device.py
AUTO_THREADS_WORK = 1024 * 64


def actor_cores(c: "Config") -> float:
    """CPUs of this machine the actors keep busy beside the learner: one per actor process (process runner), per
    actor thread (thread runner: they step envs while the learner computes), a Ray actor's reservation (a local
    instance, at least one per actor whatever its fraction; on a cluster, counted as if local: the head may host
    actors), none for the sync runner (its actors step in the learner's thread, between updates)."""
    kind = str(getattr(c.runner.name, "value", c.runner.name))
    if kind == "sync":
        return 0.0
    if kind == "ray":  # (a fractional reservation still runs one busy process per actor)
        return float(max(c.actors * float(c.runner.cpus_per_actor), c.actors))
    return float(c.actors)


def auto_torch_threads(c: "Config", cpus: int) -> int:
    """``runner.torch_threads=auto``: the CPUs the actors leave free (at least 1), where a minibatch step is at
    least :data:`AUTO_THREADS_WORK` (transitions per minibatch x the widest hidden layer); else 1.

    Measured on this project's 2-CPU machine (``python benchmarks/learner_device.py --threads 1 2``, learner updates
    alone, best of 3 blocks; transitions per minibatch x width): 2 threads made the update 1.42x faster at 1024 x 64,
    1.47x at 2048 x 64, 1.58x at 256 x 256, 1.69-1.90x from 2048 x 128 up, and the presets 0.82-1.08x (CartPole
    256 x 64, Pendulum and HalfCheetah 64 x 64: no gain). In whole CartPole runs a second thread cost the process
    runner its actor's core (17-19k vs 23-30k SPS) and did not help the sync runner (18-24k vs 23-24k), three seeds
    each: the presets keep one thread."""
    if c.learner.device not in ("auto", "cpu"):
        return 1  # the update runs on the accelerator
    widths = list(c.policy.hidden_sizes) + ([int(c.policy.hidden)] if c.policy.recurrent != "none" else [])
    work = c.learner.batch_size // max(1, c.learner.minibatches) * max(widths or [1])
    free = int(cpus - math.ceil(actor_cores(c) - 1e-9))
    return max(1, free) if work >= AUTO_THREADS_WORK else 1


def resolve_actors(actors: Any, runner: Any) -> Any:
    """``actors`` as an integer when it is ``"auto"``; anything else as given (validate() checks it)."""
    return auto_actors(runner, usable_cpus()) if actors == "auto" else actors


def lead_batches(k: float, *, _root_: Any) -> int:
    """Resolver ``${lead_batches:k}``: a per-actor ``max_lead_steps`` that lets all actors together run
    ``k`` snapshots' worth of batches ahead of the learner (at least one rollout each)."""
    a, lr = _root_.actor, _root_.learner
    n = resolve_actors(_root_.actors, _root_.runner.name)
    n = n if isinstance(n, int) and n >= 1 else 1  # (a bad count is validate()'s to refuse, with its message)
    share = math.ceil(float(k) * lr.batch_size * lr.broadcast_every / n)
    return max(int(a.envs_per_actor) * int(a.rollout_len), share)


def actors_n(*, _root_: Any) -> Any:
    """Resolver ``${actors_n:}``: the actor count with ``auto`` resolved (for the run dir's name)."""
    return resolve_actors(_root_.actors, _root_.runner.name)


def register_configs() -> None:
    from hydra.core.config_store import ConfigStore

    OmegaConf.register_new_resolver("lead_batches", lead_batches, replace=True)
    OmegaConf.register_new_resolver("actors_n", actors_n, replace=True)
    ConfigStore.instance().store(name=SCHEMA_NAME, node=Config)


class ConfigError(ValueError):
    """A user-caused config problem; the message names the key and what is allowed."""


ACTIVATIONS = ("tanh", "relu", "elu")
RECURRENT = ("none", "gru", "lstm")


DEVICE_FORMS = "auto | cpu | cuda | cuda:N | mps"


def available_devices() -> List[str]:
    """The learner devices this machine has (imports torch: only asked when a run names an accelerator)."""
    import torch

    out = ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        out.append("mps")
    return out


def check_device(device: Any) -> None:
    """``learner.device``: one of :data:`DEVICE_FORMS`, and an accelerator this machine has. ``auto`` and ``cpu``
    are settled without importing torch (a config check stays instant)."""
    ok = isinstance(device, str) and (device in ("auto", "cpu", "cuda", "mps")
                                      or (device.startswith("cuda:") and device[5:].isdigit()))
    _require(ok, "learner.device", DEVICE_FORMS, device)
    if device in ("auto", "cpu"):
        return
    have = available_devices()
    wanted = "cuda:0" if device == "cuda" else device
    _require(wanted in have, "learner.device", f"a device this machine has: auto | {' | '.join(have)}", device)


def _require(ok: bool, key: str, allowed: str, got: Any) -> None:
    if not ok:
        raise ConfigError(f"invalid config: {key}={'null' if got is None else repr(got)}; allowed: {allowed}")


def schema_keys(schema: type = Config, prefix: str = "") -> List[str]:
    """Every key of a schema as a dotted path, nodes included (``learner``, ``learner.batch_size``, ...)."""
    out: List[str] = []
    for name, t in typing.get_type_hints(schema).items():
        out.append(prefix + name)
        if dataclasses.is_dataclass(t):
            out.extend(schema_keys(t, f"{prefix}{name}."))
    return out


def did_you_mean(key: str, candidates: List[str]) -> Optional[str]:
    """The known key a mistyped dotted ``key`` most likely meant: a near-miss among its siblings (or across the
    whole tree), or the same name under another node (``batch_size`` -> ``learner.batch_size``)."""
    parent, _, leaf = key.rpartition(".")
    siblings = [c for c in candidates if c.rpartition(".")[0] == parent]
    for pool, word, cutoff in ((siblings, key, 0.75), (candidates, key, 0.8)):
        close = difflib.get_close_matches(word, pool, n=1, cutoff=cutoff)
        if close:
            return close[0]
    same_leaf = [c for c in candidates if c.rpartition(".")[2] == leaf and c != key]
    if len(same_leaf) == 1:
        return same_leaf[0]
    leaves = {c.rpartition(".")[2]: c for c in candidates}
    close = difflib.get_close_matches(leaf, list(leaves), n=1, cutoff=0.85)
    return leaves[close[0]] if close else None


def describe_type(t: Any) -> str:
    """What a value of schema type ``t`` may be, in the words of the error messages (``an integer``,
    ``null or a number``, ``block | reject | drop_oldest``)."""
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is typing.Union and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return "null or " + describe_type(rest[0]) if len(rest) == 1 else "null or a value"
    if origin in (list, List):
        return f"a list [{describe_type(args[0]) if args else 'a value'}, ...]"
    if origin in (dict, Dict):
        return "a mapping {key: value, ...}"
    if isinstance(t, type) and issubclass(t, Enum):
        return " | ".join(m.value for m in t)
    if dataclasses.is_dataclass(t):
        return f"a group of keys ({', '.join(f.name for f in dataclasses.fields(t))})"
    return {bool: "true | false", int: "an integer", float: "a number", str: "a string"}.get(t, str(t))


def key_type(schema: type, key: str) -> Any:
    """The declared type of ``key`` (one field name) in the dataclass ``schema``; None if it declares none."""
    try:
        return typing.get_type_hints(schema).get(key)
    except Exception:  # noqa: BLE001 - a foreign class whose hints cannot be resolved
        return None


RENAMED = {"learner.anneal_lr": "learner.lr_schedule=linear (was anneal_lr=true) or learner.lr_schedule=constant "
                                "(was anneal_lr=false)"}


def upgrade_saved(cfg: DictConfig) -> DictConfig:
    """A run's saved config (``.hydra/config.yaml``) written by an older laglab, in today's keys:
    ``learner.anneal_lr: true | false`` is ``learner.lr_schedule: linear | constant``. (A command line with an old
    key is refused, naming the new one: see RENAMED.)"""
    learner = cfg.get("learner")
    if isinstance(learner, DictConfig) and "anneal_lr" in learner:
        value = learner.pop("anneal_lr")
        if "lr_schedule" not in learner:
            learner.lr_schedule = "linear" if value else "constant"
    return cfg


def unknown_key_message(key: str, schema: type, candidates: Optional[List[str]] = None) -> str:
    """``invalid config: unknown key K; allowed under P: ...; did you mean X?`` for a key ``schema`` lacks
    (``candidates``: the dotted keys to suggest from; default: the keys of laglab's schema)."""
    if key in RENAMED:
        return f"invalid config: {key} is no longer a key; use {RENAMED[key]}"
    where = key.rpartition(".")[0]
    allowed = ", ".join(f.name for f in dataclasses.fields(schema)) if dataclasses.is_dataclass(schema) else "?"
    guess = did_you_mean(key, schema_keys() if candidates is None else candidates)
    return (f"invalid config: unknown key {key}; allowed{' under ' + where if where else ' at the top level'}: "
            f"{allowed}" + (f"; did you mean {guess}?" if guess else ""))


def unknown_keys(node: Any, schema: type, prefix: str = "") -> List[str]:
    """Keys of ``node`` (a DictConfig or mapping) that the dataclass ``schema`` does not declare, as dotted
    paths. Hydra's ``+key=value`` forces a key into the composed config past the schema; this finds it.
    Free-form fields (``Dict[str, Any]``, such as ``env.kwargs``) are not descended into."""
    fields = {f.name: f for f in dataclasses.fields(schema)}
    out: List[str] = []
    for key in node.keys():
        path = f"{prefix}{key}"
        if key not in fields:
            out.append(path)
            continue
        sub_type = fields[key].type
        sub_type = _SCHEMAS.get(sub_type, sub_type) if isinstance(sub_type, str) else sub_type
        value = node.get(key) if not isinstance(node, DictConfig) else node._get_node(key)
        if dataclasses.is_dataclass(sub_type) and isinstance(value, (DictConfig, dict)):
            out.extend(unknown_keys(value, sub_type, path + "."))
    return out


def validate(cfg: Any) -> Config:
    """Check the cross-field rules and return a typed ``Config`` object.

    Accepts a DictConfig (from Hydra) or a ``Config``. Raises :class:`ConfigError` naming the key.
    """
    if isinstance(cfg, DictConfig):
        extra = unknown_keys(cfg, Config)
        if extra:
            raise ConfigError(unknown_key_message(extra[0], _schema_at(extra[0].rpartition(".")[0])))
        merged = OmegaConf.merge(OmegaConf.structured(Config), cfg)
        c: Config = OmegaConf.to_object(merged)  # type: ignore[assignment]
    else:
        c = cfg
    a, lr, ac, al = c.actor, c.learner, c.algo, c.algo.advantage
    if c.actors == "auto":
        c.actors = auto_actors(c.runner.name, usable_cpus())
        c.actors_auto = {"cpus": usable_cpus(), "actors": c.actors}  # (not a key: what run() reports of the choice)
    _require(isinstance(c.actors, int) and not isinstance(c.actors, bool) and c.actors >= 1, "actors",
             "an integer >= 1, or auto", c.actors)
    _require(c.total_env_steps >= 1, "total_env_steps", "an integer >= 1", c.total_env_steps)
    _require(a.envs_per_actor >= 1, "actor.envs_per_actor", "an integer >= 1", a.envs_per_actor)
    _require(a.rollout_len >= 1, "actor.rollout_len", "an integer >= 1", a.rollout_len)
    _require(lr.batch_size >= 1, "learner.batch_size", "an integer >= 1", lr.batch_size)
    _require(lr.epochs >= 1, "learner.epochs", "an integer >= 1", lr.epochs)
    _require(lr.minibatches >= 1, "learner.minibatches", "an integer >= 1", lr.minibatches)
    _require(lr.lr > 0, "learner.lr", "a number > 0", lr.lr)
    _require(lr.broadcast_every >= 1, "learner.broadcast_every", "an integer >= 1", lr.broadcast_every)
    _require(
        lr.batch_size % lr.minibatches == 0,
        "learner.batch_size",
        f"a multiple of learner.minibatches ({lr.minibatches})",
        lr.batch_size,
    )
    _require(
        lr.batch_size % a.rollout_len == 0,
        "learner.batch_size",
        f"a multiple of actor.rollout_len ({a.rollout_len}): a batch is whole fragments",
        lr.batch_size,
    )
    _require(
        c.total_env_steps >= lr.batch_size,
        "total_env_steps",
        f">= learner.batch_size ({lr.batch_size}), or no update would ever run",
        c.total_env_steps,
    )
    _require(
        lr.max_policy_lag is None or lr.max_policy_lag >= 0,
        "learner.max_policy_lag",
        "null or an integer >= 0",
        lr.max_policy_lag,
    )
    _require(lr.target_kl is None or lr.target_kl > 0, "learner.target_kl", "null or > 0", lr.target_kl)
    _require(lr.max_kl_behavior is None or lr.max_kl_behavior > 0, "learner.max_kl_behavior", "null or a number > 0",
             lr.max_kl_behavior)
    _require(lr.kl_target is None or lr.kl_target > 0, "learner.kl_target", "null or a number > 0", lr.kl_target)
    _require(lr.kl_target is None or lr.lr_schedule == LrSchedule.kl_adaptive, "learner.kl_target",
             "null unless learner.lr_schedule=kl_adaptive (it is the KL that schedule steers to; learner.target_kl "
             "stops an update's epochs early)", lr.kl_target)
    _require(lr.max_kl_behavior is None or a.sync_min_lag == 0, "learner.max_kl_behavior",
             "null with actor.sync_min_lag > 0 (actors keeping an old snapshot would send only data the cap drops)",
             lr.max_kl_behavior)
    if lr.lr_schedule == LrSchedule.kl_adaptive:
        _require(lr.kl_target is not None, "learner.kl_target",
                 "a number > 0 with learner.lr_schedule=kl_adaptive (the KL the rule steers to, e.g. 0.01)",
                 lr.kl_target)
        _require(0 < lr.lr_min <= lr.lr_max, "learner.lr_min", f"a number in (0, learner.lr_max = {lr.lr_max:g}]",
                 lr.lr_min)
        _require(lr.lr_min <= lr.lr <= lr.lr_max, "learner.lr",
                 f"a number in [learner.lr_min, learner.lr_max] = [{lr.lr_min:g}, {lr.lr_max:g}] with "
                 "learner.lr_schedule=kl_adaptive (the rule adapts it within those bounds)", lr.lr)
    _require(0.0 <= al.gamma <= 1.0, "algo.advantage.gamma", "a number in [0, 1]", al.gamma)
    _require(0.0 <= al.lam <= 1.0, "algo.advantage.lam", "a number in [0, 1]", al.lam)
    _require(al.c_bar > 0, "algo.advantage.c_bar", "a number > 0", al.c_bar)
    _require(
        al.rho_bar >= al.c_bar,
        "algo.advantage.rho_bar",
        f"a number >= algo.advantage.c_bar ({al.c_bar}) (V-trace needs rho_bar >= c_bar)",
        al.rho_bar,
    )
    _require(0.0 < ac.loss.clip_eps < 1.0, "algo.loss.clip_eps", "a number in (0, 1)", ac.loss.clip_eps)
    _require(ac.loss.dual_clip_c > 1.0, "algo.loss.dual_clip_c", "a number > 1", ac.loss.dual_clip_c)
    _require(ac.loss.is_cap > 0, "algo.loss.is_cap", "a number > 0", ac.loss.is_cap)
    _require(ac.loss.prox_beta is None or 0.0 < ac.loss.prox_beta < 1.0, "algo.loss.prox_beta",
             "null (auto) or a number in (0, 1)", ac.loss.prox_beta)
    _require(ac.loss.prox_beta is None or ac.loss.prox == Prox.ewma, "algo.loss.prox_beta",
             "null unless algo.loss.prox=ewma (the decay of the EWMA proximal policy)", ac.loss.prox_beta)
    _require(ac.loss.max_grad_norm > 0, "algo.loss.max_grad_norm", "a number > 0", ac.loss.max_grad_norm)
    _require(
        c.policy.activation in ACTIVATIONS, "policy.activation", " | ".join(ACTIVATIONS), c.policy.activation
    )
    _require(
        len(c.policy.hidden_sizes) >= 1 and all(h >= 1 for h in c.policy.hidden_sizes),
        "policy.hidden_sizes",
        "a non-empty list of integers >= 1",
        c.policy.hidden_sizes,
    )
    _require(c.policy.recurrent in RECURRENT, "policy.recurrent", " | ".join(RECURRENT), c.policy.recurrent)
    _require(isinstance(c.policy.hidden, int) and c.policy.hidden >= 1, "policy.hidden", "an integer >= 1",
             c.policy.hidden)
    _require(0 <= lr.burn_in < a.rollout_len, "learner.burn_in",
             f"an integer in [0, actor.rollout_len = {a.rollout_len}) (burn-in steps are left out of the loss: a "
             "segment must keep at least one)", lr.burn_in)
    _require(lr.burn_in == 0 or c.policy.recurrent != "none", "learner.burn_in",
             "0 unless policy.recurrent is gru or lstm (burn-in refreshes a recurrent state)", lr.burn_in)
    if c.policy.recurrent != "none":
        n_frag = lr.batch_size // a.rollout_len
        _require(n_frag % lr.minibatches == 0, "learner.minibatches",
                 f"a divisor of the fragments in a batch (learner.batch_size / actor.rollout_len = {n_frag}) with a "
                 "recurrent policy: its minibatches are whole fragments, of equal size", lr.minibatches)
    per_round = a.envs_per_actor * a.rollout_len
    if a.max_lead_steps is not None:
        _require(
            a.max_lead_steps >= per_round,
            "actor.max_lead_steps",
            f"null or >= one rollout (envs_per_actor*rollout_len = {per_round})",
            a.max_lead_steps,
        )
        need = lr.batch_size * lr.broadcast_every
        _require(
            a.max_lead_steps * c.actors >= need,
            "actor.max_lead_steps",
            f"null or >= learner.batch_size*learner.broadcast_every/actors ({need / c.actors:g}), "
            "or every actor would pause before the learner publishes a snapshot",
            a.max_lead_steps,
        )
    _require(a.fixed_lag is None or a.fixed_lag >= 0, "actor.fixed_lag", "null or an integer >= 0", a.fixed_lag)
    _require(a.refresh_lag is None or a.refresh_lag >= 0, "actor.refresh_lag", "null or an integer >= 0",
             a.refresh_lag)
    _require(a.sync_min_lag >= 0, "actor.sync_min_lag", "an integer >= 0", a.sync_min_lag)
    _require(a.refresh_lag is None or a.sync_min_lag <= a.refresh_lag, "actor.sync_min_lag",
             f"an integer in [0, actor.refresh_lag = {a.refresh_lag}] (an actor keeping a snapshot longer than "
             "refresh_lag would discard every rollout)", a.sync_min_lag)
    fixed = (a.fixed_lag or 0) * lr.broadcast_every
    _require(
        lr.max_policy_lag is None or a.fixed_lag is None or lr.max_policy_lag >= fixed + lr.broadcast_every - 1,
        "learner.max_policy_lag",
        f"null or >= actor.fixed_lag*broadcast_every + broadcast_every - 1 ({fixed + lr.broadcast_every - 1}): "
        "actors act that many versions behind on purpose",
        lr.max_policy_lag,
    )
    _require(
        lr.max_policy_lag is None or lr.max_policy_lag >= lr.broadcast_every - 1,
        "learner.max_policy_lag",
        f"null or >= learner.broadcast_every - 1 ({lr.broadcast_every - 1}): snapshots go out every "
        f"{lr.broadcast_every} updates, so data from the newest snapshot is up to that many versions old and "
        "would all be dropped",
        lr.max_policy_lag,
    )
    _require(not (c.env.id == "laglab/Tagged-v0" and c.env.normalize_obs), "env.normalize_obs",
             "false with the tagged env (its audit reads the tags from the observations the learner trains on)",
             c.env.normalize_obs)
    _require(all(x >= 0 for x in c.env.latency_ms), "env.latency_ms", "a list of numbers >= 0", c.env.latency_ms)
    _require(c.transport.capacity >= 1, "transport.capacity", "an integer >= 1", c.transport.capacity)
    _require(c.transport.dedup_window >= 1, "transport.dedup_window", "an integer >= 1", c.transport.dedup_window)
    _require(c.transport.max_bytes >= 1, "transport.max_bytes", "an integer >= 1", c.transport.max_bytes)
    ch = c.chaos
    for k in ("drop_p", "duplicate_p", "reorder_p", "delay_p", "corrupt_p"):
        _require(0.0 <= getattr(ch, k) <= 1.0, f"chaos.{k}", "a probability in [0, 1]", getattr(ch, k))
    _require(ch.delay_p + ch.reorder_p <= 1.0, "chaos.delay_p", "delay_p + reorder_p <= 1", ch.delay_p)
    _require(ch.delay_fragments >= 1, "chaos.delay_fragments", "an integer >= 1", ch.delay_fragments)
    for k in ("kill_every_steps", "hang_every_steps", "stall_every_updates"):
        v = getattr(ch, k)
        _require(v is None or v >= 1, f"chaos.{k}", "null or an integer >= 1", v)
    _require(ch.stall_s >= 0, "chaos.stall_s", "a number >= 0", ch.stall_s)
    _require(ch.hang_every_steps is None or c.runner.name != RunnerKind.sync, "chaos.hang_every_steps",
             "null with runner=sync (a hung actor would hang the one thread there)", ch.hang_every_steps)
    _require(c.runner.actors_max_restarts >= 0, "runner.actors_max_restarts", "an integer >= 0",
             c.runner.actors_max_restarts)
    _require(c.runner.start_method in ("spawn", "forkserver"), "runner.start_method", "spawn | forkserver",
             c.runner.start_method)
    _require(c.runner.slots_per_actor >= 0, "runner.slots_per_actor", "0 (auto) or an integer >= 1",
             c.runner.slots_per_actor)
    _require(0 <= c.runner.actor_nice <= 19, "runner.actor_nice", "an integer in [0, 19]", c.runner.actor_nice)
    _require(c.runner.start_timeout_s > 0, "runner.start_timeout_s", "a number > 0", c.runner.start_timeout_s)
    _require(c.runner.restart_window_s > 0, "runner.restart_window_s", "a number > 0", c.runner.restart_window_s)
    _require(c.runner.restart_backoff_s >= 0, "runner.restart_backoff_s", "a number >= 0", c.runner.restart_backoff_s)
    _require(c.runner.heartbeat_timeout_s > 0, "runner.heartbeat_timeout_s", "a number > 0",
             c.runner.heartbeat_timeout_s)
    _require(lr.checkpoint_every >= 0, "learner.checkpoint_every", "an integer >= 0 (0 = never)", lr.checkpoint_every)
    _require(c.runner.max_inflight >= 1, "runner.max_inflight", "an integer >= 1", c.runner.max_inflight)
    _require(c.runner.cpus_per_actor >= 0, "runner.cpus_per_actor", "a number >= 0", c.runner.cpus_per_actor)
    if c.runner.name == RunnerKind.ray and importlib.util.find_spec("ray") is None:
        raise ConfigError("invalid config: runner=ray needs Ray, which is not installed: pip install -e '.[ray]'")
    if c.runner.torch_threads == "auto":
        c.runner.torch_threads = auto_torch_threads(c, usable_cpus())
        c.torch_threads_auto = {"cpus": usable_cpus(), "threads": c.runner.torch_threads}  # (what run() reports)
    _require(isinstance(c.runner.torch_threads, int) and not isinstance(c.runner.torch_threads, bool)
             and c.runner.torch_threads >= 1, "runner.torch_threads", "an integer >= 1, or auto", c.runner.torch_threads)
    check_device(lr.device)
    _require(lr.backend in BACKENDS, "learner.backend", " | ".join(BACKENDS), lr.backend)
    if lr.backend == "numpy":
        _require(c.policy.recurrent == "none" or not ewma_prox(c), "learner.backend",
                 "auto or torch with a recurrent policy and algo.loss.prox=ewma (the EWMA policy's unroll is torch's)",
                 lr.backend)
        _require(lr.device in ("auto", "cpu"), "learner.backend",
                 f"auto or torch with learner.device={lr.device} (numpy runs on the CPU)", lr.backend)
    _require(c.tracking.hist_every >= 0, "tracking.hist_every", "an integer >= 0 (0 = never)", c.tracking.hist_every)
    _require(c.tracking.return_window >= 1, "tracking.return_window", "an integer >= 1", c.tracking.return_window)
    _require(
        c.tracking.wandb.mode in ("disabled", "offline", "online", "auto"),
        "tracking.wandb.mode",
        "online | offline | disabled | auto",
        c.tracking.wandb.mode,
    )
    return c


def is_decoupled(cfg: Config) -> bool:
    return cfg.algo.loss.kind in (LossKind.decoupled, LossKind.decoupled_dual_clip)


def ewma_prox(cfg: Config) -> bool:
    """The decoupled loss with the EWMA proximal policy (``algo.loss.prox=ewma`` means nothing to another loss)."""
    return is_decoupled(cfg) and cfg.algo.loss.prox == Prox.ewma


def batch_fragments(cfg: Config) -> int:
    """Fragments in one learner batch."""
    return cfg.learner.batch_size // cfg.actor.rollout_len
