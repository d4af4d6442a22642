"""How many shared-memory fragment slots a ``runner=process`` run gives each actor, and whether the pool can
work and fits on this machine. Light on purpose (no torch): the command line's checks run it before anything
heavy is imported."""
from __future__ import annotations

import platform as stdlib_platform
import shutil
from typing import Optional

from ..config import Config, ConfigError, batch_fragments
from ..envs import EnvSpec
from ..recurrent import policy_state_shape
from ..shm import FragmentLayout

# Architectures whose hardware keeps stores in order as other cores see them (total store order). The seqlock and
# the slot hand-off rely on it: numpy offers no memory barriers.
TSO_MACHINES = ("x86_64", "amd64")  # (32-bit x86 is TSO too, but an int64 store is not one instruction there)


def slots_per_actor(cfg: Config) -> int:
    """Slots in each actor's partition: ``runner.slots_per_actor``, or (0 = auto) two rollouts' worth and at
    least an equal share of two batches."""
    if cfg.runner.slots_per_actor > 0:
        return cfg.runner.slots_per_actor
    E = cfg.actor.envs_per_actor
    return max(2 * E, -(-2 * batch_fragments(cfg) // cfg.actors))


def pool_refusal(cfg: Config) -> Optional[str]:
    """Why a slot pool of this size cannot work (an actor must hold one rollout; the pool one batch), or None.
    Shared by :func:`check_fits` and the model (:mod:`laglab.sim`), which refuses what the runner refuses."""
    per = slots_per_actor(cfg)
    E = cfg.actor.envs_per_actor
    if per < E:
        return (f"runner.slots_per_actor={per}; allowed: 0 (auto) or >= actor.envs_per_actor ({E}): an actor must be "
                "able to hold one rollout in its slots")
    if per * cfg.actors < batch_fragments(cfg):
        return (f"runner.slots_per_actor={per}; allowed: 0 (auto) or >= {-(-batch_fragments(cfg) // cfg.actors)}: the "
                f"slot pool ({per * cfg.actors} fragments) must hold at least one batch ({batch_fragments(cfg)} "
                "fragments)")
    return None


def check_fits(cfg: Config, spec: EnvSpec) -> None:
    """Refuse, before any process starts, a machine whose memory ordering the shared-memory protocol does not
    support, and a slot pool that cannot work or does not fit in /dev/shm."""
    machine = stdlib_platform.machine()
    if machine.lower() not in TSO_MACHINES:
        raise ConfigError(f"invalid config: runner=process; allowed on x86-64 only (this machine is {machine}): its "
                          "shared-memory seqlock relies on x86's store ordering. Use runner=thread or runner=ray")
    refusal = pool_refusal(cfg)
    if refusal:
        raise ConfigError(f"invalid config: {refusal}")
    per = slots_per_actor(cfg)
    need = per * cfg.actors * FragmentLayout(spec, cfg.actor.rollout_len,
                                             policy_state_shape(cfg.policy)).slot_bytes
    try:
        free = shutil.disk_usage("/dev/shm").free
    except OSError:
        free = None
    if free is not None and need > 0.8 * free:
        raise ConfigError(f"invalid config: runner.slots_per_actor={per}; the slot pool needs {need / 2**20:.0f} MiB "
                          f"of shared memory and /dev/shm has {free / 2**20:.0f} MiB free (allowed: at most 80%)")
