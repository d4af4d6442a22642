"""The collection loop every runner uses: an actor steps its env group with batched inference on its local
copy of one policy snapshot and emits one Fragment per env per rollout; plus the ``max_lead_steps``
throttle rule."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from . import timeline
from .config import Config, ConfigError
from .envs import EnvGroup, EnvSpec, discounted_return, normalize
from .fragment import Fragment, FragmentId
from .inference import InferencePolicy, Snapshot
from .recurrent import policy_state_shape


@dataclass
class Episode:
    actor_id: int
    env_index: int
    ret: float
    length: int


@dataclass
class Rollout:
    fragments: List[Fragment]
    episodes: List[Episode]
    steps: int
    env_s: float  # wall seconds in env.step
    infer_s: float  # wall seconds in policy inference
    discarded: int = 0  # steps taken and thrown away: the snapshot went stale mid-rollout (actor.refresh_lag)
    skipped: Tuple[Tuple[int, int], ...] = ()  # (env index, t_end) of each stream's range that is never sent
    padding: int = 0  # timesteps the streams' counters advanced past the steps taken (the throttle counts them)


@dataclass
class ActorStats:
    steps: int = 0
    rollouts: int = 0
    episodes: int = 0
    env_s: float = 0.0
    infer_s: float = 0.0
    throttle_s: float = 0.0  # paused by max_lead_steps
    blocked_s: float = 0.0  # waiting for room in the queue
    version: int = -1
    loads: int = 0
    snapshot_s: float = 0.0  # fetching and loading snapshots (the practitioner's "waiting on parameters")
    snapshot_cpu_s: float = 0.0  # Ray: CPU seconds the worker's process spent over its calls' ways (asking the
    # board, Ray's I/O thread taking the answer, reading the snapshot from the object store, loading it: a part of
    # cpu_s; with its threads' idle work in the while, 6-7 ms a second: 0.03 ms of a 5 ms call); 0 elsewhere
    snapshot_wait_s: float = 0.0  # Ray: the calls' thread's waits for a CPU over those ways (its run delay)
    ask_s: float = 0.0  # Ray: the part of snapshot_s from asking the snapshot board to holding its answer (the
    # board's turn and the answer's way back); the rest is reading and loading the snapshot
    refreshes: int = 0  # rollouts discarded because the snapshot went stale (actor.refresh_lag)
    discarded_steps: int = 0  # their steps
    env_cpu_s: float = 0.0  # CPU seconds of this thread inside env.step (env_s less what the env waited)
    cpu_s: float = 0.0  # CPU seconds: the actor's whole process (process and Ray runners: rollouts, sends, snapshot
    # loads, polling) or, in-process (sync, thread), its own thread's time in rollouts
    cpu_wait_s: float = 0.0  # seconds the actor's process was ready to run and waited for a CPU (process and Ray
    # runners, Linux: the kernel's run delay of the thread that runs the rollouts, /proc/thread-self/schedstat; 0
    # where the kernel does not say)
    start_cpu_s: float = 0.0  # CPU seconds the actor's process used before its first rollout (process and Ray
    # runners: the interpreter's start, imports, its envs), not in cpu_s
    boot_cpu_s: float = 0.0  # Ray: the part of start_cpu_s before the worker took up laglab's actor code (Ray's own
    # worker start, up to registering with its raylet, which starts that many at a time); 0 elsewhere


def run_delay_s() -> float:
    """Seconds this thread has spent ready to run while it waited for a CPU (the second field of
    ``/proc/thread-self/schedstat``: the scheduler's run delay); 0.0 where the kernel does not provide it."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def lead(produced: int, consumed: Mapping[int, int], incarnation: int) -> int:
    """Env steps this actor incarnation has produced beyond what the learner has credited it with
    (``consumed``: incarnation -> watermark, from the newest snapshot or a credit grant; keyed by incarnation,
    so a restarted actor starts with a clean slate)."""
    return produced - consumed.get(incarnation, 0)


def seed_for(base: int, actor_id: int, incarnation: int) -> int:
    return int(np.random.SeedSequence([base, actor_id, incarnation]).generate_state(1)[0])


class Actor:
    def __init__(self, cfg: Config, actor_id: int, incarnation: int, expect: Optional[EnvSpec] = None):
        """``expect``: the learner's view of the env (whether it names action masks); an env whose first reset here
        disagrees is a :class:`ConfigError` (the two would read each other's fragments wrong)."""
        self.cfg = cfg
        self.actor_id = actor_id
        self.incarnation = incarnation
        n = cfg.actor.envs_per_actor
        seed = seed_for(cfg.seed, actor_id, incarnation)
        self.envs = EnvGroup(cfg.env, n, seed % (2**31), actor_id)
        self.envs.tag(actor_id * n)
        self.rng = np.random.default_rng(seed)
        self.policy: Optional[InferencePolicy] = None
        self.heartbeat: Optional[Callable[[], None]] = None  # called every step: alive while collecting
        self.snapshot: Optional[Snapshot] = None
        self.stats = ActorStats()
        self.first_step_t: Optional[float] = None  # monotonic time of this actor's first env step
        self.obs = self.envs.reset()
        self.spec = self.envs.spec  # (whether the env names its legal actions is known once it has been reset)
        if expect is not None and expect.masked != self.spec.masked:
            self.envs.close()
            raise ConfigError(f"env {cfg.env.id!r} named its legal actions (info[\"action_mask\"]) at one reset and not at "
                              "another (the learner's probe and this actor's first reset disagree): a masked env must "
                              "name them after every reset and step (or set env.action_mask=false)")
        self.t = np.zeros(n, dtype=np.int64)  # env-instance step counters
        self.episode_id = np.zeros(n, dtype=np.int64)
        self.episode_t = np.zeros(n, dtype=np.int64)
        self.ep_return = np.zeros(n, dtype=np.float64)
        self.disc_return = np.zeros(n, dtype=np.float64)  # discounted raw return of the running episodes
        self.gamma = cfg.algo.advantage.gamma
        # recurrent policies: each env's state before its next step (zero at an episode's start), carried across
        # rollouts and snapshot loads: a state the previous version computed is what this one continues from
        shape = policy_state_shape(cfg.policy)
        self.h = None if shape is None else np.zeros((n,) + shape, np.float32)
        if not self.spec.discrete:
            self._low, self._high = self.spec.action_low, self.spec.action_high

    def load(self, snap: Snapshot, fetch_s: float = 0.0) -> None:
        """Switch to ``snap`` (between rollouts only: a fragment is collected by exactly one version).
        ``fetch_s``: what getting ``snap`` cost the caller (a shared-memory read, an object-store get), booked
        with the load in ``stats.snapshot_s``."""
        if self.snapshot is None or snap.version != self.snapshot.version:
            t0 = time.perf_counter()
            self.policy = InferencePolicy(snap, self.spec, self.cfg.policy.activation, self.cfg.policy.recurrent)
            self.snapshot = snap
            self.stats.version = snap.version
            self.stats.loads += 1
            fetch_s += time.perf_counter() - t0
        self.stats.snapshot_s += fetch_s

    def wants(self, newest: int) -> bool:
        """Whether to load the newest snapshot (version ``newest``) before the next rollout: always when none is
        loaded; else when it is more than ``actor.sync_min_lag`` versions ahead (0: whenever it is newer)."""
        return self.snapshot is None or newest - self.snapshot.version > self.cfg.actor.sync_min_lag

    def stale(self, newest: int) -> bool:
        """``actor.refresh_lag``: the snapshot is more than that many versions behind ``newest``."""
        n = self.cfg.actor.refresh_lag
        return n is not None and self.snapshot is not None and newest - self.snapshot.version > n

    def _norm(self, obs: np.ndarray) -> np.ndarray:
        s = self.snapshot
        if self.cfg.env.normalize_obs:
            return normalize(obs, s.obs_mean, s.obs_var, self.cfg.env.obs_clip)
        return obs

    def collect(self, envs: Optional[Sequence[int]] = None, newest: Optional[Callable[[], int]] = None,
                check_every: int = 1) -> Rollout:
        c0 = time.thread_time()
        try:
            return self._collect(envs, newest, check_every)
        finally:
            self.stats.cpu_s += time.thread_time() - c0

    def _collect(self, envs: Optional[Sequence[int]], newest: Optional[Callable[[], int]],
                 check_every: int) -> Rollout:
        """One rollout of ``rollout_len`` steps of the env instances ``envs`` (default: all of them, in
        lockstep); one fragment per env instance. The others do not step (the sync runner fills a batch
        from exactly the env instances it needs).

        ``newest()``: the newest published version, asked before every ``check_every``-th step when
        ``actor.refresh_lag`` is set; once the snapshot is more than refresh_lag versions behind it, the rollout
        stops there and is discarded: no fragments, ``discarded`` = its steps (the envs keep their state; the
        next fragment of each env starts where this one stopped). The streams' timestep counters still advance by a
        whole rollout, so fragments stay aligned to ``rollout_len`` and the skipped range is named in ``skipped``
        for the books (never sent, never lost); the fragment before and the one after are not adjacent."""
        assert self.snapshot is not None, "load a snapshot first"
        sel = slice(None) if envs is None else np.asarray(envs, dtype=np.int64)
        index = np.arange(self.envs.n)[sel]
        T, E = self.cfg.actor.rollout_len, len(index)
        spec = self.spec
        obs_buf = np.empty((T, E) + spec.obs_shape, dtype=np.float32)
        act_buf = np.empty((T, E) + spec.action_shape, dtype=np.int64 if spec.discrete else np.float32)
        ret_buf = np.empty((T, E), dtype=np.float32)
        term_buf = np.empty((T, E), dtype=bool)
        trunc_buf = np.empty((T, E), dtype=bool)
        logp_buf = np.empty((T, E), dtype=np.float32)
        val_buf = np.empty((T, E), dtype=np.float32)
        mean_buf = None if spec.discrete else np.empty((T, E, spec.n_actions), dtype=np.float32)
        lstd_buf = None if spec.discrete else np.empty((T, E, spec.n_actions), dtype=np.float32)
        mask_buf = np.empty((T, E, spec.n_actions), dtype=bool) if spec.masked else None
        final_obs: List[List[np.ndarray]] = [[] for _ in range(E)]  # per env: final obs of its truncations
        start_t, start_ep, start_ept = self.t[sel].copy(), self.episode_id[sel].copy(), self.episode_t[sel].copy()
        h = None if self.h is None else self.h[sel].copy()  # the state at the rollout's first step
        start_h = h
        episodes: List[Episode] = []
        env_s = infer_s = 0.0
        st = self.stats
        obs = self.obs[sel]
        # per env, kept locally and written back once (a step's few numpy calls, not their arithmetic, are the
        # cost): the discounted return, and the episode's return and length up to ``begin`` (the first step of
        # this rollout that belongs to the running episode and is not yet summed into ``ep_ret``)
        disc = self.disc_return[sel].copy()
        ep_ret = self.ep_return[sel].copy()
        begin = np.zeros(E, dtype=np.int64)
        rew64 = np.empty((T, E), dtype=np.float64)  # the env's rewards as it gave them (episode returns sum these)
        beat = self.heartbeat
        check = newest if self.cfg.actor.refresh_lag is not None else None
        step, stale_at = 0, None
        try:
            for step in range(T):
                if beat is not None:
                    beat()
                if check is not None and step % check_every == 0 and self.stale(check()):
                    stale_at = step
                    break
                t0 = time.perf_counter()
                mask = None
                if mask_buf is not None:
                    mask = self.envs.masks[sel]
                    mask_buf[step] = mask
                a_np, logp, v, mean, log_std, nxt = self.policy.act(self._norm(obs), self.rng, mask, h)
                if spec.discrete:
                    env_a = a_np
                else:
                    env_a = np.clip(a_np, self._low, self._high)
                    mean_buf[step] = mean
                    lstd_buf[step] = log_std
                t1, c1 = time.perf_counter(), time.thread_time()
                res = self.envs.step(env_a, None if envs is None else index)
                t2 = time.perf_counter()
                st.env_cpu_s += time.thread_time() - c1
                if self.first_step_t is None:
                    self.first_step_t = time.monotonic()
                    timeline.mark("first_env_step", self.first_step_t)  # (in-process runners; a process: its status)
                obs_buf[step] = obs
                act_buf[step] = a_np
                logp_buf[step] = logp
                val_buf[step] = v
                term_buf[step] = res.terminated
                trunc_buf[step] = res.truncated
                rew64[step] = res.rewards
                done = res.terminated | res.truncated
                if nxt is not None:
                    h = np.where(done.reshape((-1,) + (1,) * (nxt.ndim - 1)), np.float32(0.0), nxt)
                    self.h[sel] = h
                acc = discounted_return(disc, res.rewards, self.gamma)
                ret_buf[step] = acc
                if done.any():
                    disc = np.where(done, 0.0, acc)
                    for i in np.flatnonzero(res.truncated):
                        final_obs[i].append(res.final_obs[i])
                    for i in np.flatnonzero(done):
                        g = int(index[i])
                        ret = float(ep_ret[i] + rew64[begin[i]:step + 1, i].sum())
                        length = int(self.episode_t[g]) + step + 1
                        episodes.append(Episode(self.actor_id, g, ret, length))
                        ep_ret[i] = 0.0
                        begin[i] = step + 1
                        self.episode_t[g] = -(step + 1)  # (+ the steps taken, at the write-back: its length then)
                        self.episode_id[g] += 1
                else:
                    disc = acc
                obs = res.next_obs
                infer_s += t1 - t0
                env_s += t2 - t1
        except BaseException:
            # an env or the policy raised at ``step``: the counters stand where the last whole step left them (as
            # when they were kept per step), whatever the runner does with this actor next
            self._write_back(sel, disc, ep_ret, begin, rew64, step)
            raise
        if stale_at is not None:
            self._write_back(sel, disc, ep_ret, begin, rew64, stale_at)
            return self._discard(sel, index, obs, start_t, stale_at, episodes, env_s, infer_s)
        self._write_back(sel, disc, ep_ret, begin, rew64, T)
        rew_buf = rew64.astype(np.float32)
        self.obs[sel] = obs
        version = self.snapshot.version
        no_final = np.empty((0,) + spec.obs_shape, dtype=np.float32)
        frags = []
        for e in range(E):
            fid = FragmentId(
                actor_id=self.actor_id,
                incarnation=self.incarnation,
                env_index=int(index[e]),
                episode_id=int(start_ep[e]),
                episode_t0=int(start_ept[e]),
                t_start=int(start_t[e]),
                t_end=int(start_t[e]) + T - 1,
                behavior_version=version,
            )
            frags.append(
                Fragment.sealed(
                    id=fid,
                    obs=obs_buf[:, e].copy(),
                    actions=act_buf[:, e].copy(),
                    rewards=rew_buf[:, e].copy(),
                    terminated=term_buf[:, e].copy(),
                    truncated=trunc_buf[:, e].copy(),
                    logp=logp_buf[:, e].copy(),
                    values=val_buf[:, e].copy(),
                    trunc_obs=np.stack(final_obs[e]).astype(np.float32) if final_obs[e] else no_final.copy(),
                    disc_return=ret_buf[:, e].copy(),
                    last_obs=obs[e].copy(),
                    mean=None if mean_buf is None else mean_buf[:, e].copy(),
                    log_std=None if lstd_buf is None else lstd_buf[:, e].copy(),
                    masks=None if mask_buf is None else mask_buf[:, e].copy(),
                    state=None if start_h is None else start_h[e].copy(),
                    final_state=None if h is None else h[e].copy(),
                )
            )
        st = self.stats
        st.steps += T * E
        st.rollouts += 1
        st.episodes += len(episodes)
        st.env_s += env_s
        st.infer_s += infer_s
        return Rollout(frags, episodes, T * E, env_s, infer_s)

    def _write_back(self, sel, disc: np.ndarray, ep_ret: np.ndarray, begin: np.ndarray, rew64: np.ndarray,
                    taken: int) -> None:
        """Store the per-env running figures a rollout kept locally after ``taken`` of its steps: the streams'
        step counters, the discounted return, each running episode's return (the rewards since ``begin`` added) and
        length (an episode that began at step ``begin`` of this rollout holds ``-begin`` in ``episode_t``: it has
        ``taken - begin`` steps)."""
        self.t[sel] += taken
        self.disc_return[sel] = disc
        for i in range(len(begin)):
            ep_ret[i] += rew64[begin[i]:taken, i].sum()
        self.ep_return[sel] = ep_ret
        self.episode_t[sel] += taken

    def _discard(self, sel, index: np.ndarray, obs: np.ndarray, start_t: np.ndarray, taken: int,
                 episodes: List[Episode], env_s: float, infer_s: float) -> Rollout:
        self.obs[sel] = obs
        T = self.cfg.actor.rollout_len
        skipped: Tuple[Tuple[int, int], ...] = ()
        padding = 0
        if taken:
            padding = (T - taken) * len(index)
            self.t[sel] = start_t + T
            skipped = tuple((int(e), int(t) + T - 1) for e, t in zip(index, start_t))
        steps = taken * len(index)
        st = self.stats
        st.steps += steps
        st.episodes += len(episodes)
        st.env_s += env_s
        st.infer_s += infer_s
        st.refreshes += 1
        st.discarded_steps += steps
        return Rollout([], episodes, steps, env_s, infer_s, discarded=steps, skipped=skipped, padding=padding)

    def close(self) -> None:
        self.envs.close()


def steps_per_rollout(cfg: Config) -> int:
    return cfg.actor.envs_per_actor * cfg.actor.rollout_len


def throttle_state(produced: int, consumed: Mapping[int, int], incarnation: int,
                   max_lead: Optional[int]) -> Tuple[bool, int]:
    """(must_pause, lead): pause before a rollout that would start beyond ``max_lead`` steps of lead."""
    ld = lead(produced, consumed, incarnation)
    return (max_lead is not None and ld >= max_lead), ld
