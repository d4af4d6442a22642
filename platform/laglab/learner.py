"""The learner: batch assembly from fragments, advantages (GAE | V-trace), PPO epochs (clip | dual-clip),
observation and reward normalization statistics, snapshot publication and checkpoints.

The current policy is a pair (weights, observation statistics). The statistics the learner normalizes with
are frozen when a snapshot is published, so data collected under the newest snapshot is evaluated by the
learner exactly as the actor evaluated it (pi/mu = 1 on lag-0 data); new statistics are gathered from each
batch after its epochs and take effect at the next publication. Reward scaling (by the std of the discounted
return, as CleanRL / gymnasium's NormalizeReward) is the learner's too: fragments carry raw rewards and the
running discounted return, so it survives actor restarts and resumes and does not depend on the actor count.
"""
from __future__ import annotations

import collections
import copy
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Dict, NamedTuple, Optional, Sequence

import numpy as np
import torch

from . import algo, npstep
from .config import Config, ConfigError, Estimator, LossKind, LrSchedule, ewma_prox, is_decoupled
from .npstep import NumpyStep
from .optim import Adam, clip_grad_norm
from .envs import EnvSpec, RunningMeanStd, normalize
from .fragment import Fragment, chain_depths, successors
from .policy import ActorCritic, RecurrentActorCritic, Snapshot, Tanh
from .tagged import audit_batch


def resolve_device(name: str) -> torch.device:
    """``learner.device`` as a torch device: ``auto`` is CUDA where torch sees a GPU, else the CPU (config validation
    has refused an accelerator this machine lacks)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda":  # with its index, so a tensor's device compares equal to it (cuda means the current)
        device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
        torch.cuda.set_device(device)
    elif device.type == "mps":
        device = torch.device("mps", 0)
    return device


def resolve_backend(cfg: Config, model: torch.nn.Module, device: torch.device) -> str:
    """``learner.backend``: numpy or torch for this model on this device. auto: numpy wherever it can run, unless the
    learner has more than one torch thread (``runner.torch_threads``: set where an update is large enough for threads
    to pay, which numpy's one-thread step does not use: ``benchmarks/learner_device.py``, the large case)."""
    why_not = npstep.supported(model, device, cfg.policy.activation, ewma=ewma_prox(cfg))
    if cfg.learner.backend == "numpy" and why_not:
        raise ConfigError(f"learner.backend=numpy cannot run {why_not}: use learner.backend=auto or torch")
    threads = cfg.runner.torch_threads
    if cfg.learner.backend == "torch" or why_not or (cfg.learner.backend == "auto" and isinstance(threads, int)
                                                     and threads > 1):
        return "torch"
    return "numpy"


def host_tanh(cfg: Config) -> bool:
    """Whether the learner's tanh layers run on numpy (:class:`laglab.policy.Tanh`): where a minibatch's narrowest
    layer holds at least ``Tanh.HOST_MIN`` values (CartPole's 256 x 64: yes; HalfCheetah's 64 x 64: no)."""
    lc = cfg.learner  # (the tanh layers are the hidden_sizes ones, the recurrent encoder's included)
    return (cfg.policy.activation == "tanh"
            and lc.batch_size // lc.minibatches * min(cfg.policy.hidden_sizes, default=0) >= Tanh.HOST_MIN)


def build_model(cfg: Config, spec: EnvSpec):
    p = cfg.policy
    host = host_tanh(cfg)
    if p.recurrent != "none":
        return RecurrentActorCritic(spec, p.hidden_sizes, p.activation, p.log_std_init, p.recurrent, p.hidden,
                                    host_tanh=host)
    return ActorCritic(spec, p.hidden_sizes, p.activation, p.log_std_init, host_tanh=host)


# fingerprint keys older checkpoints lack, with the value they had then
FINGERPRINT_BEFORE = {"masked": False, "policy.recurrent": "none", "policy.hidden": None}


def fingerprint(cfg: Config, spec: EnvSpec) -> Dict[str, Any]:
    """What a checkpoint must agree on with the run that resumes from it (the task, the network, the
    normalizers' meaning, the algorithm)."""
    return {"env.id": cfg.env.id, "env.kwargs": dict(sorted((cfg.env.kwargs or {}).items())),
            "env.max_episode_steps": cfg.env.max_episode_steps, "obs_shape": list(spec.obs_shape),
            "discrete": spec.discrete, "n_actions": spec.n_actions, "masked": spec.masked,
            "action_low": None if spec.action_low is None else [float(x) for x in spec.action_low],
            "action_high": None if spec.action_high is None else [float(x) for x in spec.action_high],
            "policy.hidden_sizes": list(cfg.policy.hidden_sizes), "policy.activation": cfg.policy.activation,
            "policy.recurrent": cfg.policy.recurrent,
            "policy.hidden": None if cfg.policy.recurrent == "none" else int(cfg.policy.hidden),
            "env.normalize_obs": cfg.env.normalize_obs, "env.obs_clip": cfg.env.obs_clip,
            "env.normalize_reward": cfg.env.normalize_reward, "env.reward_clip": cfg.env.reward_clip,
            "algo.name": cfg.algo.name, "algo.advantage.gamma": cfg.algo.advantage.gamma}


class Stacked(NamedTuple):
    """A batch of N equal-length fragments stacked time-major ([T, N]), raw (as the fragments carry it)."""

    T: int
    N: int
    obs: np.ndarray  # [T, N, *obs]
    actions: np.ndarray  # [T, N, *action]
    rewards: np.ndarray  # [T, N] raw rewards
    disc_return: np.ndarray  # [T, N]
    terminated: np.ndarray  # [T, N]
    truncated: np.ndarray  # [T, N]
    logp: np.ndarray  # [T, N]
    trunc_obs: np.ndarray  # [K, *obs] final observations of the truncated steps
    trunc_pos: np.ndarray  # [K] their flat positions t * N + n in [T, N]
    last_obs: np.ndarray  # [N, *obs]
    masks: Optional[np.ndarray] = None  # [T, N, n] legal actions (envs with action masks)
    state: Optional[np.ndarray] = None  # [N, *S] recurrent policies: each fragment's stored initial state


def stack(frags: Sequence[Fragment]) -> Stacked:
    T, N = frags[0].length, len(frags)
    st = lambda name: np.stack([getattr(f, name) for f in frags], axis=1)  # noqa: E731
    trunc = st("truncated")
    pos = [np.flatnonzero(f.truncated) * N + n for n, f in enumerate(frags)]
    return Stacked(T, N, st("obs"), st("actions"), st("rewards"), st("disc_return"), st("terminated"), trunc,
                   st("logp"), np.concatenate([f.trunc_obs for f in frags]), np.concatenate(pos).astype(np.int64),
                   np.stack([f.last_obs for f in frags]), st("masks") if frags[0].masks is not None else None,
                   np.stack([f.state for f in frags]) if frags[0].state is not None else None)


class Batch(NamedTuple):
    T: int
    N: int
    obs: torch.Tensor  # [T*N, *obs], normalized
    actions: torch.Tensor  # [T*N, *action]
    last_obs: torch.Tensor  # [N, *obs], normalized
    trunc_obs: torch.Tensor  # [K, *obs], normalized: evaluated by the current critic for the bootstrap
    trunc_pos: torch.Tensor  # [K] flat positions in [T, N]
    behavior_logp: torch.Tensor  # [T, N]
    rewards: torch.Tensor  # [T, N] (scaled if env.normalize_reward), truncation bootstraps not yet folded in
    raw_rewards: np.ndarray  # [T, N] as the fragments carry them (for the tagged audit)
    discounts: torch.Tensor  # [T, N]
    lags: np.ndarray  # [N] version lag per fragment
    succ: np.ndarray  # [N] index of the proven-adjacent next fragment in the batch, or -1
    depth: np.ndarray  # [N] distance to the end of its chain
    masks: Optional[torch.Tensor] = None  # [T*N, n] legal actions (envs with action masks)
    # recurrent policies
    state: Optional[torch.Tensor] = None  # [N, *S] each fragment's stored (behavior) initial state
    dones: Optional[torch.Tensor] = None  # [T, N] bool: an episode ended at step t (the state is zeroed after it)
    starts_episode: Optional[np.ndarray] = None  # [N] bool: the fragment's first step starts an episode (state 0)


# the Batch fields that are tensors (built on the host, each moved to the update's device once per batch)
BATCH_TENSORS = ("obs", "actions", "last_obs", "trunc_obs", "trunc_pos", "behavior_logp", "rewards", "discounts",
                 "masks", "state", "dones")


def predecessors(succ: np.ndarray) -> np.ndarray:
    """For each fragment, the index of the fragment it continues in the batch, else -1 (the links reversed)."""
    pred = np.full(len(succ), -1, dtype=np.int64)
    has = succ >= 0
    pred[succ[has]] = np.flatnonzero(has)
    return pred


def chain_heights(succ: np.ndarray) -> np.ndarray:
    """Distance from each fragment to the start of its chain (0 = no fragment in the batch precedes it)."""
    return chain_depths(predecessors(succ))


class Learner:
    def __init__(self, cfg: Config, spec: EnvSpec):
        self.cfg = cfg
        self.spec = spec
        # the update's device: the model, the optimizer and every tensor of an update live there; fragments are
        # stacked on the host and each batch crosses once (pinned, for CUDA); snapshots are host arrays
        # (learner.backend=numpy runs on the CPU: with device=auto that is the CPU even where a GPU is)
        self.device = resolve_device("cpu" if cfg.learner.backend == "numpy" else cfg.learner.device)
        self._pin = self.device.type == "cuda"
        # per-minibatch figures: floats on the CPU, device tensors elsewhere (summed once per update, not a sync
        # per minibatch)
        self._scalar = (lambda t: float(t.detach())) if self.device.type == "cpu" else (lambda t: t.detach())
        self.model = build_model(cfg, spec).to(self.device)
        self.recurrent = cfg.policy.recurrent != "none"
        self.params = list(self.model.parameters())
        # torch.optim.Adam's fused CPU kernel, without torch.optim (see laglab.optim: no torch._dynamo import)
        self.opt = Adam(self.params, lr=cfg.learner.lr, eps=cfg.learner.adam_eps)
        self.obs_rms = RunningMeanStd(spec.obs_shape)  # gathers statistics from every batch
        self.obs_mean = self.obs_rms.mean.astype(np.float32)  # frozen at publication (see snapshot)
        self.obs_var = self.obs_rms.var.astype(np.float32)
        self.rew_rms = RunningMeanStd(())  # of the discounted raw return
        self.version = 0
        self.updates = 0
        self.consumed: Dict[int, int] = collections.defaultdict(int)  # incarnation -> watermark (see take)
        self.trained_steps = 0
        self.next_incarnation = 1  # carried by checkpoints, so a resumed run never reuses an incarnation
        self.incarnation_mark: Optional[Path] = None  # where the high-water mark goes (see allocate_incarnation)
        self._mark = 0  # the mark last written: no incarnation of this run reaches it
        # minibatch permutations are drawn on the host (the same sequence on every device), then moved
        self.gen = torch.Generator().manual_seed(int(cfg.seed) + 7919)
        # the decoupled loss's proximal policy when it is an EWMA of the weights (None: the start of each update)
        self.diverged_at: Optional[int] = None  # the first update whose loss was not finite (see update)
        self._last_kl = float("nan")  # the previous update's approx KL (said when the policy diverges)
        self.prox_model: Optional[ActorCritic] = None
        self.prox_beta = prox_beta(cfg)
        self._ewma_total = 1.0  # the weight the EWMA has accumulated (bias correction, as PPO-EWMA)
        if ewma_prox(cfg):
            self.prox_model = copy.deepcopy(self.model).requires_grad_(False)
            for m in self.prox_model.modules():  # (a copied GRU/LSTM's weights are no longer one cuDNN chunk)
                if isinstance(m, torch.nn.RNNBase):
                    m.flatten_parameters()
        self.backend, self._np = resolve_backend(cfg, self.model, self.device), None
        if self.backend == "numpy":
            self._np = NumpyStep(self.model, self.opt, cfg.policy.activation, self.prox_model)

    def _ewma_step(self) -> None:
        """After each optimizer step: prox <- keep * prox + (1 - keep) * theta, keep = beta * W / (beta * W + 1),
        W the accumulated weight (starts at 1, the initial weights; tends to 1 / (1 - beta)), so early on the
        average is not pulled towards the initial weights (Hilton et al. 2022's EwmaModel)."""
        keep = self._ewma_keep()
        with torch.no_grad():
            for q, p in zip(self.prox_model.parameters(), self.params):
                q.lerp_(p, 1.0 - keep)

    def _ewma_keep(self) -> float:
        """The EWMA's ``keep`` for this optimizer step (and the accumulated weight after it)."""
        total = self.prox_beta * self._ewma_total + 1.0
        keep = self.prox_beta * self._ewma_total / total
        self._ewma_total = total
        return keep

    def fragment_kl(self, frag: Fragment) -> float:
        """KL(behavior || current) of one fragment (k3 estimate over its steps), under the policy the next update
        starts from: the measure ``learner.max_kl_behavior`` caps."""
        dev = self._dev
        with torch.no_grad():
            obs = dev(self._norm(np.array(frag.obs)).reshape((-1,) + self.spec.obs_shape))  # copies: a fragment's
            actions = dev(torch.from_numpy(np.array(frag.actions)).reshape((-1,) + self.spec.action_shape))  # arrays
            masks = None if frag.masks is None else dev(torch.from_numpy(np.array(frag.masks)))  # are read-only
            if self.recurrent:
                T = len(frag.obs)
                h, _ = self.model.unroll(obs.view((T, 1) + self.spec.obs_shape),
                                         dev(torch.from_numpy(np.array(frag.state))[None]),
                                         dev(torch.from_numpy(np.array(frag.terminated | frag.truncated))[:, None]))
                logp = self.model.logp_entropy_of(h.flatten(0, 1), actions, masks)[0]
            else:
                logp = self.model.logp_entropy(obs, actions, masks)[0]
            return float(algo.approx_kl_k3(logp, dev(torch.from_numpy(np.array(frag.logp)).reshape(-1))))

    def allocate_incarnation(self) -> int:
        """The next actor incarnation number of this run (continued across resumes). With ``incarnation_mark``
        set, a high-water mark that no number of this run reaches is written there before a number at or past the
        previous mark is used (in blocks of ``MARK_BLOCK``: one small write per thousand restarts), so a run
        resumed after a crash continues past every incarnation the dead run handed out, even after its last
        checkpoint. (A write that fails — a full disk — is logged once and the mark is no longer kept.)"""
        inc = self.next_incarnation
        self.next_incarnation += 1
        if self.incarnation_mark is not None and inc >= self._mark:
            mark = inc + MARK_BLOCK
            try:
                self.incarnation_mark.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.incarnation_mark.with_suffix(".tmp")
                tmp.write_text(f"{mark}\n")
                os.replace(tmp, self.incarnation_mark)
                self._mark = mark
            except OSError as e:
                logging.getLogger("laglab").warning(
                    "laglab: could not write %s (%s): a run resumed after a crash may reuse incarnation numbers",
                    self.incarnation_mark, e)
                self.incarnation_mark = None
        return inc

    def settle_incarnation_mark(self) -> None:
        """The run has ended and hands out no more incarnations: make the mark exact, so a run resumed from
        a run that ended (not crashed) continues at exactly the next number."""
        if self.incarnation_mark is not None and self.incarnation_mark.exists():
            try:
                tmp = self.incarnation_mark.with_suffix(".tmp")
                tmp.write_text(f"{self.next_incarnation}\n")
                os.replace(tmp, self.incarnation_mark)
            except OSError:
                pass

    # ---- publication -------------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """The current policy as a snapshot (weights and the observation statistics the learner normalizes with
        now); no side effect."""
        return Snapshot.make(self.version, self.model, self.obs_mean, self.obs_var, dict(self.consumed),
                             float(self.rew_rms.var))

    def publish_snapshot(self) -> Snapshot:
        """Publication: freeze the observation statistics gathered so far (from now on the learner normalizes
        with exactly the arrays this snapshot ships, as the actors that load it will)."""
        snap = Snapshot.make(self.version, self.model, self.obs_rms.mean, self.obs_rms.var, dict(self.consumed),
                             float(self.rew_rms.var))
        self.obs_mean, self.obs_var = snap.obs_mean, snap.obs_var  # the very arrays shipped (float32)
        return snap

    def take(self, frag: Fragment) -> int:
        """Record that an admitted fragment reached the learner; returns its version lag.

        ``consumed[incarnation]`` is a watermark, not a sum: the incarnation's env steps up to the newest
        rollout the learner has received (its envs step in lockstep, so t_end + 1 steps per env). A fragment
        lost or refused on the way is passed by the next one, so the actors' throttle never leaks credit."""
        mark = (frag.id.t_end + 1) * self.cfg.actor.envs_per_actor
        if mark > self.consumed[frag.id.incarnation]:
            self.consumed[frag.id.incarnation] = mark
        return self.version - frag.id.behavior_version

    # ---- update ------------------------------------------------------------------------------------
    def _dev(self, t: torch.Tensor) -> torch.Tensor:
        """A host tensor on the update's device (one copy; from pinned memory for CUDA, so it can overlap)."""
        if t.device == self.device:
            return t
        return (t.pin_memory() if self._pin else t).to(self.device, non_blocking=self._pin)

    def _norm(self, obs: np.ndarray) -> torch.Tensor:
        if self.cfg.env.normalize_obs:
            obs = normalize(obs, self.obs_mean, self.obs_var, self.cfg.env.obs_clip)
        return torch.from_numpy(np.ascontiguousarray(obs, dtype=np.float32))

    def _batch(self, frags: Sequence[Fragment]) -> "Batch":
        """Stack equal-length fragments time-major ([T, N]), normalize, scale rewards."""
        s = stack(frags)
        T, N = s.T, s.N
        shape = self.spec.obs_shape
        term, trunc = torch.from_numpy(s.terminated), torch.from_numpy(s.truncated)
        rewards = torch.from_numpy(s.rewards)
        if self.cfg.env.normalize_reward:
            clip = self.cfg.env.reward_clip
            rewards = torch.clamp(rewards / float(np.sqrt(self.rew_rms.var + 1e-8)), -clip, clip)
        gamma = self.cfg.algo.advantage.gamma
        succ = successors(frags)
        b = Batch(
            T=T, N=N, obs=self._norm(s.obs).reshape((T * N,) + shape),
            actions=torch.from_numpy(s.actions).reshape((T * N,) + self.spec.action_shape),
            last_obs=self._norm(s.last_obs),
            trunc_obs=self._norm(s.trunc_obs).reshape((len(s.trunc_pos),) + shape),
            trunc_pos=torch.from_numpy(s.trunc_pos),
            behavior_logp=torch.from_numpy(s.logp),
            rewards=rewards,
            raw_rewards=s.rewards,
            # a truncated step is bootstrapped with V(final obs) (folded in by _targets), then cut like a termination
            discounts=gamma * (1.0 - (term | trunc).float()),
            lags=self.version - np.array([f.id.behavior_version for f in frags]),
            succ=succ,
            depth=chain_depths(succ),
            masks=None if s.masks is None else torch.from_numpy(s.masks).reshape(T * N, -1),
            state=None if s.state is None else torch.from_numpy(s.state),
            dones=None if s.state is None else torch.from_numpy(s.terminated | s.truncated),
            starts_episode=None if s.state is None else np.array([f.id.episode_t0 == 0 for f in frags]),
        )
        return b._replace(**{k: self._dev(getattr(b, k)) for k in BATCH_TENSORS if getattr(b, k) is not None})

    def audit(self, frags: Sequence[Fragment]) -> int:
        """Tagged env only: misattributed items in the batch these fragments assemble into."""
        return self._audit(self._batch(frags), frags)

    def _audit(self, b: "Batch", frags: Sequence[Fragment]) -> int:
        """Audit the very tensors an update trains on (see :func:`laglab.tagged.audit_batch`): the [T*N] rows,
        the truncation observations at the flat positions the bootstrap uses, the bootstrap observations."""
        host = lambda t: t.cpu().numpy()  # noqa: E731 - (no copy on the CPU)
        return audit_batch(host(b.obs), host(b.actions), b.raw_rewards, host(b.trunc_obs), host(b.trunc_pos),
                           host(b.last_obs), frags, self.cfg.actor.envs_per_actor, b.succ,
                           None if b.masks is None else host(b.masks))

    def _unroll(self, model, b: "Batch", init: torch.Tensor, cols=None):
        """A recurrent model run over the batch's columns ``cols`` (all by default), each from its state in ``init``
        [N, *S]: (h [T, n, H], ends [T, n, *S]) as :meth:`RecurrentActorCritic.unroll`."""
        obs = b.obs.view((b.T, b.N) + self.spec.obs_shape)
        if cols is None:
            return model.unroll(obs, init, b.dones)
        return model.unroll(obs[:, cols], init[cols], b.dones[:, cols])

    @torch.no_grad()
    def _recurrent_pass(self, b: "Batch", model=None):
        """A recurrent policy's evaluation of a batch under the current weights (or ``model``'s): (values [T, N],
        bootstrap [N], values of the truncations' final observations [K], current log-probs [T, N], initial states
        [N, *S]).

        A fragment that is the first of its chain in the batch starts from its stored state (the behavior
        policy's); a fragment joined to its predecessor (:func:`laglab.fragment.successors`: adjacent, and the stored
        states agree) continues from the state the current policy ends the
        predecessor in, so a chain is one sequence. Chains are run from their starts forwards, one link at a time."""
        T, N, m = b.T, b.N, model or self.model
        height = chain_heights(b.succ)
        if self._np is not None and model is None:  # (numpy step by step: the fused kernel's calls cost more)
            self._np.P.load(self.params)
            with np.errstate(over="ignore", invalid="ignore"):  # (a diverged policy's NaNs, as torch's, silently)
                out = self._np.recurrent_pass(
                    b.obs.numpy().reshape((T, N) + self.spec.obs_shape), b.state.numpy(), b.dones.numpy(), height,
                    predecessors(b.succ), b.actions.numpy(), None if b.masks is None else b.masks.numpy(),
                    b.last_obs.numpy(), b.trunc_obs.numpy(), b.trunc_pos.numpy())
            return tuple(None if a is None else torch.from_numpy(np.ascontiguousarray(a)) for a in out)
        init = b.state.clone()
        hs = torch.zeros((T, N, m.hidden), device=self.device)
        ends = torch.zeros((T, N) + m.state_shape, device=self.device)
        keep_last = (~b.dones[-1]).to(ends.dtype).view((N,) + (1,) * len(m.state_shape))
        pred = predecessors(b.succ)
        for level in range(int(height.max()) + 1):
            at = np.flatnonzero(height == level)
            cols = self._dev(torch.from_numpy(at))
            if level > 0:
                p = self._dev(torch.from_numpy(pred[at]))
                init[cols] = ends[-1, p] * keep_last[p]
            hs[:, cols], ends[:, cols] = self._unroll(m, b, init, cols)
        values = m.value_of(hs)
        final = ends[-1] * keep_last  # the state the step after the last one starts from
        bootstrap = m.value_of(m.output(m.step(b.last_obs, final)))
        trunc_values = None
        if len(b.trunc_pos):  # (a truncated step ends an episode: its state is in ends)
            at = ends.flatten(0, 1)[b.trunc_pos]
            trunc_values = m.value_of(m.output(m.step(b.trunc_obs, at)))
        cur_logp = m.logp_entropy_of(hs.flatten(0, 1), b.actions, b.masks)[0].view(T, N)
        return values, bootstrap, trunc_values, cur_logp, init

    def _burn_in(self, b: "Batch", heads: np.ndarray):
        """(keep [T, N] bool: the steps the loss counts, cut [N] bool: the columns whose state is detached after the
        burn-in). ``learner.burn_in=k``: a fragment that starts mid-episode from its stored (behavior) state — the
        first of its chain in the batch (``heads``) — leaves its first k steps out of the loss and out of the
        gradient (they only refresh the state, as R2D2's burn-in), or fewer when an episode ends among them: the
        steps after that start from the exact zero state and count. Fragments that start an episode, and those
        continuing a chain from a computed state, keep every step."""
        keep = torch.ones((b.T, b.N), dtype=torch.bool, device="cpu")  # (built on the host, then moved once)
        cut = torch.zeros(b.N, dtype=torch.bool, device="cpu")
        k = self.cfg.learner.burn_in
        if k:
            stale = heads & ~b.starts_episode
            d = b.dones[:k].cpu().numpy()
            ended = d.any(axis=0)
            n_out = np.where(ended, d.argmax(axis=0) + 1, k)  # steps left out: through the first episode end
            for n in np.flatnonzero(stale):
                keep[:n_out[n], n] = False
            cut = torch.from_numpy(stale & ~ended)  # (an episode end within the burn-in zeroes the state anyway)
        return self._dev(keep), self._dev(cut)

    @torch.no_grad()
    def _targets(self, b: "Batch", extras: Optional[Dict[str, Any]] = None):
        """(advantages, value targets, values, current log-probs), all [T, N], under the current policy.
        ``extras`` (a dict): filled with the recurrent policy's initial states (``init``)."""
        a = self.cfg.algo.advantage
        trunc_values = None
        if self.recurrent:
            values, bootstrap, trunc_values, cur_logp, init = self._recurrent_pass(b)
            if extras is not None:
                extras["init"] = init
        else:
            values = self.model.value(b.obs).view(b.T, b.N)
            bootstrap = self.model.value(b.last_obs)
            cur_logp = self.model.logp_entropy(b.obs, b.actions, b.masks)[0].view(b.T, b.N)
        rewards = b.rewards.clone()
        if len(b.trunc_pos):  # truncations: bootstrap with the *current* critic's value of the final observation
            if trunc_values is None:
                trunc_values = self.model.value(b.trunc_obs)
            rewards.view(-1)[b.trunc_pos] += a.gamma * trunc_values
        b = b._replace(rewards=rewards)
        adv = torch.zeros_like(values)
        returns = torch.zeros_like(values)
        # reassembly: a fragment whose successor is proven (by identity) to be in the batch continues into
        # it; chains are solved from their ends backwards, one depth level at a time
        for d in range(int(b.depth.max()) + 1):
            at = np.flatnonzero(b.depth == d)
            cols = self._dev(torch.from_numpy(at))
            nxt = self._dev(torch.from_numpy(b.succ[at]))
            has = nxt >= 0
            carry = torch.zeros(len(at), dtype=values.dtype, device=self.device)
            sl = lambda x: x[:, cols]  # noqa: E731
            if a.estimator == Estimator.gae:
                carry[has] = adv[0, nxt[has]]
                adv[:, cols] = algo.gae(sl(b.rewards), sl(values), bootstrap[cols], sl(b.discounts), a.lam, carry)
                returns[:, cols] = adv[:, cols] + values[:, cols]
            else:
                carry[has] = returns[0, nxt[has]] - values[0, nxt[has]]
                vt = algo.vtrace(sl(b.behavior_logp), sl(cur_logp), sl(b.rewards), sl(values), bootstrap[cols],
                                 sl(b.discounts), a.rho_bar, a.c_bar, a.lam, carry)
                returns[:, cols], adv[:, cols] = vt.vs, vt.advantages
        return adv, returns, values, cur_logp

    def advantages(self, frags: Sequence[Fragment]):
        """(advantages, value targets) for a batch, as the next update would compute them."""
        adv, returns, _, _ = self._targets(self._batch(frags))
        return adv, returns

    def update(self, frags: Sequence[Fragment], progress: Optional[int] = None, audit: bool = False) -> Dict[str, float]:
        """One learner update on a batch of equal-length fragments; bumps the version. ``progress``: transitions
        of the budget that met their fate before this batch (trained, dropped or rejected; default: trained), for
        the lr schedule. ``audit``: check the batch against the tagged env's tags first (reported as
        ``transport/audit_misattributed``)."""
        cfg, lc, ac = self.cfg, self.cfg.learner, self.cfg.algo
        t_start = time.perf_counter()
        if cfg.env.normalize_reward:  # the scale does not enter pi/mu, so the batch's own returns count now
            self.rew_rms.update(np.concatenate([f.disc_return for f in frags]))
        b = self._batch(frags)
        misattributed = self._audit(b, frags) if audit else 0
        extras: Dict[str, Any] = {}
        adv, returns, values, cur_logp = self._targets(b, extras)
        lag_kl = float(algo.approx_kl_k3(cur_logp, b.behavior_logp))
        is_ess = algo.effective_sample_fraction(cur_logp - b.behavior_logp)
        obs, actions, lags, masks = b.obs, b.actions, b.lags, b.masks

        if lc.lr_schedule == LrSchedule.linear:  # on learner progress: the budget's transitions that met their fate before this update
            done = self.trained_steps if progress is None else progress
            frac = min(1.0, max(0.0, 1.0 - done / cfg.total_env_steps))
            for g in self.opt.param_groups:
                g["lr"] = lc.lr * frac
        b_adv, b_ret, b_old = adv.reshape(-1), returns.reshape(-1), b.behavior_logp.reshape(-1)
        b_start = cur_logp.reshape(-1)  # the policy at the start of this update
        B = b.T * b.N
        loss_cfg = ac.loss
        dual_c = loss_cfg.dual_clip_c if loss_cfg.kind in (LossKind.dual_clip, LossKind.decoupled_dual_clip) else None
        sums: Dict[str, Any] = collections.defaultdict(float)
        n_mb = 0
        epochs_done = 0
        init, keep, cut = extras.get("init"), None, None
        if init is not None:
            heads = chain_heights(b.succ) == 0
            keep, cut = self._burn_in(b, heads)
            if self.prox_model is not None:  # the EWMA policy's own states, along the same chains
                extras["prox_init"] = self._recurrent_pass(b, self.prox_model)[4]
        flat = {"adv": b_adv, "ret": b_ret, "old": b_old, "start": b_start}
        if self._np is not None:
            self._np.load()
            steps = lambda: self._numpy_steps(b, flat, init, keep, cut)  # noqa: E731
        else:
            steps = lambda: self._torch_steps(b, init, keep, cut, extras.get("prox_init"), flat, dual_c)  # noqa: E731
        ewma_total = self._ewma_total
        try:
            for _ in range(lc.epochs):
                kl_epoch = []
                for figures in steps():
                    for k, v in figures.items():
                        sums[k] += v
                    kl_epoch.append(figures["approx_kl"])
                    n_mb += 1
                epochs_done += 1
                if lc.target_kl is not None and np.mean([float(k) for k in kl_epoch]) > lc.target_kl:
                    break
        except BaseException:
            if self._np is not None:  # (numpy's steps are not stored: the model is as before the update, and so is
                self._ewma_total = ewma_total  # the EWMA's weight a checkpoint written now records)
            raise
        if self._np is not None:
            self._np.store()
        sums = {k: float(v) for k, v in sums.items()}  # (one transfer per figure per update, off the CPU)

        update_kl = None
        if lc.lr_schedule == LrSchedule.kl_adaptive:  # how far the whole update moved the policy, measured after it
            with torch.no_grad():
                if init is None:
                    now = self.model.logp_entropy(obs, actions, masks)[0]
                else:
                    hs = self._unroll(self.model, b, init)[0].flatten(0, 1)
                    now = self.model.logp_entropy_of(hs, actions, masks)[0]
                update_kl = float(algo.approx_kl_k3(now, b_start))
            self._adapt_lr(update_kl)
        if self.diverged_at is None and not np.isfinite(sums["policy_loss"] + sums["value_loss"]):
            self.diverged_at = self.updates + 1  # said once, kept in summary.json: the run goes on (its returns
            logging.getLogger("laglab").warning(  # say what a diverged policy earns, which a study must count)
                "laglab: update %d produced a non-finite loss (the policy diverged; approx KL of the update before: "
                "%.3g): a smaller learner.lr, or for stale data a smaller algo.loss.is_cap", self.updates + 1,
                self._last_kl)
        self._last_kl = sums["approx_kl"] / max(n_mb, 1)
        if cfg.env.normalize_obs:  # new statistics take effect at the next publication (see snapshot)
            self.obs_rms.update(np.concatenate([f.obs for f in frags]))
        self.version += 1
        self.updates += 1
        self.trained_steps += B
        with torch.no_grad():
            ev = algo.explained_variance(values.reshape(-1), b_ret)
        m = {f"losses/{k}": v / n_mb for k, v in sums.items()}
        m.update({
            "losses/explained_variance": ev,
            "lag/min": float(lags.min()),
            "lag/mean": float(lags.mean()),
            "lag/max": float(lags.max()),
            "lag/kl_behavior": lag_kl,
            "lag/is_ess": is_ess,
            "charts/lr": float(self.opt.param_groups[0]["lr"]),
            "learner/epochs_done": float(epochs_done),
            "learner/update_s": time.perf_counter() - t_start,
            "learner/version": float(self.version),
        })
        if update_kl is not None:
            m["learner/update_kl"] = update_kl
        if keep is not None:  # recurrent: fragments that start from their stored (behavior) state; steps burnt in
            m["learner/chain_starts_frac"] = float(heads.mean())
            m["learner/burn_in_frac"] = 1.0 - float(keep.float().mean())
        if audit:
            m["transport/audit_misattributed"] = float(misattributed)
        return m

    def _torch_steps(self, b: "Batch", init, keep, cut, prox_init, flat: Dict[str, torch.Tensor],
                     dual_c: Optional[float]):
        """One epoch of minibatch steps by torch's autograd; yields each step's figures (floats on the CPU, device
        tensors elsewhere: summed once per update, not a sync per minibatch)."""
        loss_cfg, scalar = self.cfg.algo.loss, self._scalar
        decoupled = is_decoupled(self.cfg)
        for rows, logp, ent, v, prox in self._minibatches(b, init, keep, decoupled, cut, prox_init, flat):
            a = rows["adv"]
            if loss_cfg.norm_adv and len(a) > 1:
                a = (a - a.mean()) / (a.std() + 1e-8)
            if decoupled:
                if prox is None:
                    prox = rows["start"]
                info = algo.decoupled_loss(logp, prox, rows["old"], a, loss_cfg.clip_eps, loss_cfg.is_cap, dual_c)
            elif dual_c is not None:
                info = algo.dual_clip_loss(logp, rows["old"], a, loss_cfg.clip_eps, dual_c)
            else:
                info = algo.ppo_clip_loss(logp, rows["old"], a, loss_cfg.clip_eps)
            v_loss = 0.5 * ((v - rows["ret"]) ** 2).mean()
            ent_m = ent.mean()
            loss = info.loss - loss_cfg.ent_coef * ent_m + loss_cfg.vf_coef * v_loss
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            clip_grad_norm(self.params, loss_cfg.max_grad_norm)
            self.opt.step()
            if self.prox_model is not None:
                self._ewma_step()
            with torch.no_grad():  # how far this update moved the policy (staleness is lag/kl_behavior)
                kl = scalar(algo.approx_kl_k3(logp, rows["start"]))
            figures = {"policy_loss": scalar(info.loss), "value_loss": scalar(v_loss), "entropy": scalar(ent_m),
                       "clip_frac": scalar(info.clip_frac), "dual_clip_frac": scalar(info.dual_clip_frac),
                       "approx_kl": kl}
            if info.is_trunc_frac is not None:
                figures["is_trunc_frac"] = scalar(info.is_trunc_frac)
            yield figures

    def _numpy_steps(self, b: "Batch", flat: Dict[str, torch.Tensor], init: Optional[torch.Tensor] = None,
                     keep: Optional[torch.Tensor] = None, cut: Optional[torch.Tensor] = None):
        """One epoch of minibatch steps by :class:`laglab.npstep.NumpyStep` (CPU): the same permutation and slices
        as :meth:`_minibatches`, the same figures as :meth:`_torch_steps`."""
        lc, loss_cfg = self.cfg.learner, self.cfg.algo.loss
        group = self.opt.param_groups[0]
        if init is not None:
            yield from self._numpy_recurrent_steps(b, flat, init, keep, cut)
            return
        B = b.T * b.N
        mb = B // lc.minibatches
        perm = torch.randperm(B, generator=self.gen, device="cpu").numpy()[:mb * lc.minibatches]
        x = b.obs.numpy().reshape(B, -1)[perm]
        actions = b.actions.numpy()[perm]
        masks = None if b.masks is None else b.masks.numpy()[perm]
        cols = {k: t.numpy()[perm] for k, t in flat.items()}
        kind = loss_cfg.kind.value
        ewma = self.prox_model is not None
        for k in range(lc.minibatches):
            sl = slice(k * mb, (k + 1) * mb)
            m_k = None if masks is None else masks[sl]
            prox = self._np.prox_logp(x[sl], actions[sl], m_k) if ewma else None
            yield self._np.step(x[sl], actions[sl], m_k, cols["adv"][sl], cols["ret"][sl], cols["old"][sl],
                                cols["start"][sl], loss_cfg, group["lr"], group["betas"], group["eps"], kind, prox)
            if ewma:
                self._np.ewma(self._ewma_keep())

    def _numpy_recurrent_steps(self, b: "Batch", flat: Dict[str, torch.Tensor], init: torch.Tensor,
                               keep: torch.Tensor, cut: Optional[torch.Tensor]):
        """:meth:`_numpy_steps` for a recurrent policy: the minibatches of whole segments of :meth:`_minibatches`
        (the same draw of the generator, the same rows in the same order)."""
        lc, loss_cfg = self.cfg.learner, self.cfg.algo.loss
        group = self.opt.param_groups[0]
        kind = loss_cfg.kind.value
        obs = b.obs.numpy().reshape((b.T, b.N) + self.spec.obs_shape)
        actions = b.actions.numpy()
        masks = None if b.masks is None else b.masks.numpy()
        cols_flat = {k: t.numpy() for k, t in flat.items()}
        init_np, keep_np, dones = init.numpy(), keep.numpy(), b.dones.numpy()
        cut_np = None if cut is None else cut.numpy()
        steps = np.arange(b.T).reshape(-1, 1) * b.N
        for cols in torch.tensor_split(torch.randperm(b.N, generator=self.gen, device="cpu"), lc.minibatches):
            cols = cols.numpy()
            k = keep_np[:, cols]
            idx = (steps + cols.reshape(1, -1))[k]
            yield self._np.recurrent_step(
                obs[:, cols], init_np[cols], dones[:, cols], k, None if cut_np is None else cut_np[cols], lc.burn_in,
                actions[idx], None if masks is None else masks[idx], cols_flat["adv"][idx], cols_flat["ret"][idx],
                cols_flat["old"][idx], cols_flat["start"][idx], loss_cfg, group["lr"], group["betas"], group["eps"],
                kind)

    def _minibatches(self, b: "Batch", init: Optional[torch.Tensor], keep: Optional[torch.Tensor], decoupled: bool,
                     cut: Optional[torch.Tensor] = None, prox_init: Optional[torch.Tensor] = None,
                     flat: Optional[Dict[str, torch.Tensor]] = None):
        """One epoch's minibatches: (the minibatch's rows of each of ``flat``'s per-transition tensors [T*N], log-probs,
        entropies, values — with gradients — and the EWMA proximal log-probs or None). Feed-forward:
        ``learner.minibatches`` random sets of transitions (every tensor is permuted once per epoch, each minibatch
        a slice of it). Recurrent: random sets of whole segments (fragments), each unrolled from its initial state
        in ``init`` with gradients through the segment (truncated BPTT), the positions ``keep`` leaves out
        (burn-in) dropped."""
        lc = self.cfg.learner
        obs, actions, masks = b.obs, b.actions, b.masks
        flat = flat or {}
        ewma = decoupled and self.prox_model is not None
        if init is None:
            B = b.T * b.N
            mb = B // lc.minibatches
            perm = self._dev(torch.randperm(B, generator=self.gen, device="cpu"))[:mb * lc.minibatches]
            obs, actions = obs[perm], actions[perm]
            masks = None if masks is None else masks[perm]
            flat = {k: t[perm] for k, t in flat.items()}
            for k in range(lc.minibatches):
                sl = slice(k * mb, (k + 1) * mb)
                m_k = None if masks is None else masks[sl]
                logp, ent = self.model.logp_entropy(obs[sl], actions[sl], m_k)
                prox = None
                if ewma:
                    with torch.no_grad():
                        prox = self.prox_model.logp_entropy(obs[sl], actions[sl], m_k)[0]
                yield {k2: t[sl] for k2, t in flat.items()}, logp, ent, self.model.value(obs[sl]), prox
            return
        steps = torch.arange(b.T, device=self.device).view(-1, 1) * b.N
        for cols in torch.tensor_split(self._dev(torch.randperm(b.N, generator=self.gen, device="cpu")), lc.minibatches):
            k = keep[:, cols]
            idx = (steps + cols.view(1, -1))[k]
            m_idx = None if masks is None else masks[idx]
            obs_c = b.obs.view((b.T, b.N) + self.spec.obs_shape)[:, cols]
            h = self.model.outputs(obs_c, init[cols], b.dones[:, cols], lc.burn_in,
                                   None if cut is None else cut[cols])[k]
            logp, ent = self.model.logp_entropy_of(h, actions[idx], m_idx)
            prox = None
            if ewma:
                with torch.no_grad():
                    prox = self.prox_model.logp_entropy_of(self._unroll(self.prox_model, b, prox_init, cols)[0][k],
                                                           actions[idx], m_idx)[0]
            yield {k2: t[idx] for k2, t in flat.items()}, logp, ent, self.model.value_of(h), prox

    def _adapt_lr(self, kl: float) -> None:
        """``lr_schedule=kl_adaptive``: Sample Factory's rule (its ``kl_adaptive_epoch``), once per update, for the
        next one: past 2 x kl_target the learning rate is divided by 1.5, under kl_target / 2 multiplied by 1.5,
        within [lr_min, lr_max]. ``kl`` is how far the update just done moved the policy — KL(start || end), k3,
        over the whole batch, measured after its last step. (Sample Factory measures it against the behavior
        policy, which in an asynchronous run counts the lag too; measured in the minibatch's own forward pass,
        before its step, the first minibatch of every update reads 0 and would push the rate up.)"""
        lc = self.cfg.learner
        for g in self.opt.param_groups:
            if kl > 2.0 * lc.kl_target:
                g["lr"] = max(g["lr"] / 1.5, lc.lr_min)
            elif kl < 0.5 * lc.kl_target:
                g["lr"] = min(g["lr"] * 1.5, lc.lr_max)

    # ---- checkpoints -------------------------------------------------------------------------------
    def checkpoint_state(self, env_steps: int = 0) -> Dict[str, object]:
        f64 = lambda a: torch.from_numpy(np.array(a, dtype=np.float64))  # noqa: E731
        return {
            "env_steps": int(env_steps),
            "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "obs_mean": f64(self.obs_rms.mean),
            "obs_var": f64(self.obs_rms.var),
            "obs_count": float(self.obs_rms.count),
            "obs_norm_mean": f64(self.obs_mean),  # the statistics of the newest snapshot
            "obs_norm_var": f64(self.obs_var),
            "reward_var": float(self.rew_rms.var),
            "reward_mean": float(self.rew_rms.mean),
            "reward_count": float(self.rew_rms.count),
            "version": self.version,
            "updates": self.updates,
            "trained_steps": self.trained_steps,
            "next_incarnation": int(self.next_incarnation),
            "fingerprint": json.dumps(fingerprint(self.cfg, self.spec), sort_keys=True),
            "rng": self.gen.get_state(),
            **({"prox_ewma": self.prox_model.state_dict(), "prox_ewma_total": float(self._ewma_total)}
               if self.prox_model is not None else {}),
        }

    def save_checkpoint(self, path: Path, env_steps: int = 0) -> Path:
        """Write atomically: a temp file in the same folder, then rename over the target."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        torch.save(self.checkpoint_state(env_steps), tmp)
        os.replace(tmp, path)
        return path

    def load_checkpoint(self, path: Path) -> int:
        """Restore everything saved; returns the env steps the checkpointed run had used. Refuses a
        checkpoint made for another env, algorithm or network (:class:`ConfigError`)."""
        state = read_checkpoint(path, self.cfg, self.spec)
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.obs_rms.mean = state["obs_mean"].numpy()
        self.obs_rms.var = state["obs_var"].numpy()
        self.obs_rms.count = float(state["obs_count"])
        self.obs_mean = state["obs_norm_mean"].numpy().astype(np.float32)
        self.obs_var = state["obs_norm_var"].numpy().astype(np.float32)
        self.rew_rms.mean = np.float64(state["reward_mean"])
        self.rew_rms.var = np.float64(state["reward_var"])
        self.rew_rms.count = float(state["reward_count"])
        self.version = int(state["version"])
        self.updates = int(state["updates"])
        self.trained_steps = int(state["trained_steps"])
        self.next_incarnation = max(int(state["next_incarnation"]), read_incarnation_mark(Path(path).parent))
        self.gen.set_state(state["rng"])
        if self.prox_model is not None:  # a checkpoint of a run without the EWMA: it starts at the weights
            if "prox_ewma" in state:
                self.prox_model.load_state_dict(state["prox_ewma"])
                self._ewma_total = float(state["prox_ewma_total"])
            else:
                self.prox_model.load_state_dict(state["model"])
                self._ewma_total = 1.0
        return int(state.get("env_steps", 0))


INCARNATION_MARK = "incarnations"  # beside a run's checkpoints: a number no incarnation of that run reached
MARK_BLOCK = 1024


def read_incarnation_mark(checkpoint_dir: Path) -> int:
    """The incarnation high-water mark a run left beside its checkpoints (0 if none)."""
    try:
        return int((Path(checkpoint_dir) / INCARNATION_MARK).read_text().strip())
    except (OSError, ValueError):
        return 0


def read_checkpoint(path: Path, cfg: Config, spec: EnvSpec, purpose: str = "resume",
                    free: Sequence[str] = ()) -> Dict[str, Any]:
    """Load a checkpoint (``weights_only``: no arbitrary objects) and check that it fits this run (``purpose``
    names what the checkpoint is for in the error: ``resume`` or ``evaluate``; ``free``: fingerprint keys this
    purpose may change)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)  # (any device it was saved from)
    except Exception as e:  # noqa: BLE001 - a truncated or foreign file
        raise ConfigError(f"invalid config: {purpose}: {path} is not a readable laglab checkpoint ({e})") from e
    if "fingerprint" not in state or "next_incarnation" not in state:
        raise ConfigError(f"invalid config: {purpose}: {path} was written by an older laglab (no config "
                          "fingerprint); it cannot be checked against this run")
    saved, now = json.loads(state["fingerprint"]), fingerprint(cfg, spec)
    saved = {**FINGERPRINT_BEFORE, **saved}  # (keys added since: what checkpoints made before them meant)
    diff = [f"{k}: checkpoint {saved.get(k)!r}, this run {v!r}" for k, v in now.items()
            if saved.get(k) != v and k not in free]
    if diff:
        raise ConfigError(f"invalid config: {purpose}={path} does not fit this run ({'; '.join(diff)})")
    return state


def prox_beta(cfg: Config) -> float:
    """The EWMA decay per optimizer step of ``prox=ewma``: ``algo.loss.prox_beta``, or with null the decay whose
    average age (beta / (1 - beta) steps) equals the average age of PPO's proximal policy, the start of the update,
    over an update's K = epochs x minibatches steps ((K - 1) / 2): beta = (K - 1) / (K + 1) (Hilton et al. 2022
    match the proximal policy's age the same way)."""
    if cfg.algo.loss.prox_beta is not None:
        return float(cfg.algo.loss.prox_beta)
    k = cfg.learner.epochs * cfg.learner.minibatches
    return (k - 1) / (k + 1)


def lag_ok(cfg: Config, lag: int) -> bool:
    return cfg.learner.max_policy_lag is None or lag <= cfg.learner.max_policy_lag
