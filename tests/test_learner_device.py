"""``learner.device`` (issue 23), tested on the CPU this machine has: every tensor of an update is made on the
configured device (the update runs under another default device, ``meta``, so a tensor created without naming its
device would land there, and every op's output device is recorded), the update is the same update bit for bit,
checkpoints load from whatever device saved them, and a device the machine lacks is refused naming the ones it has.
"""
import collections
import contextlib

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from laglab.actor import Actor
from laglab.config import ConfigError, available_devices
from laglab.learner import Learner, chain_heights, read_checkpoint
from laglab.run import env_spec

from test_protocol import cfg_of


class OutputDevices(TorchDispatchMode):
    """Counts the device of every tensor every aten op returns."""

    def __init__(self):
        super().__init__()
        self.seen = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.seen[t.device.type] += 1
        return out


CASES = {
    "ppo": {},
    "vtrace_dual_clip": {"algo": {"name": "vtrace", "advantage": {"estimator": "vtrace"},
                                  "loss": {"kind": "dual_clip"}}},
    "decoupled_ewma_kl_adaptive": {"algo": {"loss": {"kind": "decoupled", "prox": "ewma"}},
                                   "learner": {"lr_schedule": "kl_adaptive", "kl_target": 0.01, "target_kl": 1.0}},
    "continuous": {"env": {"id": "Pendulum-v1"}},
    "masked": {"env": {"kwargs": {"masked": True}}},
    "gru_burn_in_ewma": {"policy": {"recurrent": "gru", "hidden": 8}, "learner": {"burn_in": 4},
                         "algo": {"loss": {"kind": "decoupled", "prox": "ewma"}}},
    "lstm": {"policy": {"recurrent": "lstm", "hidden": 8}},
    # truncations (bootstrapped from their final observations) and chains that start mid-episode from a stored state
    # with no episode end in their first 4 steps (the burn-in cut): CartPole's episodes outlast a rollout
    "truncations": {"env": {"id": "CartPole-v1", "max_episode_steps": 10}},
    "lstm_burn_in_cut": {"policy": {"recurrent": "lstm", "hidden": 8}, "learner": {"burn_in": 4},
                         "env": {"id": "CartPole-v1"}},
}


class OnDevice(TorchDispatchMode):
    """Lineage of the update's tensors: what lives on the learner's device is the model's and the optimizer's state,
    what ``Learner._dev`` moved there and what ops make from those alone. An op fed a tensor of any other origin (a
    host tensor never moved: on a GPU, a device mismatch or a silent host computation) is recorded. Storages
    identify tensors, so views count as their base."""

    def __init__(self, learner):
        super().__init__()
        self.resident, self.strays, self.suspended, self.held = set(), [], 0, []
        for t in [*learner.params, *learner.opt.exp_avg, *learner.opt.exp_avg_sq, *learner.opt.step_t,
                  *(learner.prox_model.parameters() if learner.prox_model is not None else [])]:
            self.add(t)

    def add(self, t):
        if isinstance(t, torch.Tensor):
            self.resident.add(t.untyped_storage().data_ptr())
            self.held.append(t)  # (held: no freed storage's address can come back as another tensor's)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.suspended or func in (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default):
            return out  # (host work; a tensor from numpy: made on the host, resident only once moved)
        ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.numel() > 1]
        stray = [t for t in ins if t.untyped_storage().data_ptr() not in self.resident]
        if stray:
            self.strays.append(str(func))
        else:
            for t in tree_leaves(out):
                self.add(t)
        return out


def watch_lineage(learner, monkeypatch):
    mode = OnDevice(learner)
    dev, batch = learner._dev, learner._batch

    def moved(t):
        out = dev(t)
        mode.add(out)
        return out

    def host_work(frags):  # (stacking fragments is the host's work, before the batch moves)
        mode.suspended += 1
        try:
            return batch(frags)
        finally:
            mode.suspended -= 1

    monkeypatch.setattr(learner, "_dev", moved)
    monkeypatch.setattr(learner, "_batch", host_work)
    return mode


def stale_batch(cfg):
    """A learner and two batches of fragments: one at lag 0, one collected two versions back (so V-trace's
    weights, the decoupled loss's IS weights and the KL measures are not trivially 1)."""
    spec = env_spec(cfg)
    torch.manual_seed(0)
    learner = Learner(cfg, spec)
    actor = Actor(cfg, 0, 1)
    actor.load(learner.snapshot())
    n = cfg.learner.batch_size // cfg.actor.rollout_len
    frags = []
    while len(frags) < 2 * n:
        frags += actor.collect().fragments
    return learner, frags[:n], frags[n:2 * n]


# feed-forward cases: a recurrent minibatch packs its pieces with index tensors made by torch.tensor(..., device=)
# each time (host data copied to the device: correct, and checked by the meta-device test below, but indistinguishable
# here from a tensor made from numpy and never moved)
@pytest.mark.parametrize("case", [c for c in CASES if "recurrent" not in CASES[c].get("policy", {})])
def test_every_tensor_an_update_computes_with_was_moved_to_its_device_or_made_there(case, monkeypatch):
    over = {k: dict(v) for k, v in CASES[case].items()}
    # (torch's path: the one that runs on an accelerator; learner.backend=numpy is the CPU's alone)
    over.setdefault("learner", {}).update(device="cpu", backend="torch")
    learner, first, second = stale_batch(cfg_of(actors=1, **over))
    learner.update(first)
    b = learner._batch(second)
    if case == "truncations":
        assert len(b.trunc_pos) > 0  # (the case reaches the truncation bootstrap)
    mode = watch_lineage(learner, monkeypatch)
    with mode:
        learner.update(second)
    assert len(mode.resident) > 20 and not mode.strays, sorted(set(mode.strays))


def test_the_lineage_catches_a_host_tensor_never_moved(monkeypatch):
    learner, first, _ = stale_batch(cfg_of(actors=1, learner={"device": "cpu", "backend": "torch"}))
    mode = watch_lineage(learner, monkeypatch)
    batch = learner._batch  # (the lineage's: host work, then moved)
    monkeypatch.setattr(learner, "_batch", lambda frags: batch(frags)._replace(  # the rewards left on the host
        rewards=torch.from_numpy(batch(frags).rewards.numpy().copy())))
    with mode:
        learner.update(first)
    assert "aten.clone.default" in mode.strays  # (_targets' first use of the rewards)
    mode = OnDevice(learner)
    with mode:
        w = learner.params[0]
        (w * 2).sum()
        w * torch.ones_like(w)  # made from a resident tensor: resident
        assert not mode.strays
        w * torch.from_numpy(np.ones(w.shape, np.float32))
    assert mode.strays == ["aten.mul.Tensor"]


@pytest.mark.parametrize("case", list(CASES))
def test_every_tensor_of_an_update_is_made_on_the_configured_device(case):
    over = {k: dict(v) for k, v in CASES[case].items()}
    over.setdefault("learner", {})["device"] = "cpu"
    cfg = cfg_of(actors=1, **over)
    learner, first, second = stale_batch(cfg)
    torch.manual_seed(0)
    twin = Learner(cfg, env_spec(cfg))  # the same seed: the same initial weights; updated without the probe
    for a, b in zip(learner.model.parameters(), twin.model.parameters()):
        assert torch.equal(a, b)
    learner.update(first)
    twin.update(first)
    probe = OutputDevices()
    with torch.device("meta"), probe:  # a tensor made without naming its device would be a meta tensor here
        m = learner.update(second)
        kl = learner.fragment_kl(second[0])
    m_twin = twin.update(second)
    b = twin._batch(second)
    if case == "truncations":
        assert len(b.trunc_pos) > 0  # (the case reaches the truncation bootstrap)
    if case == "lstm_burn_in_cut":
        assert twin._burn_in(b, chain_heights(b.succ) == 0)[1].any()  # (and the burn-in cut)
    assert probe.seen["cpu"] > 100 and set(probe.seen) == {"cpu"}, probe.seen
    assert learner.model.pi_head.weight.device.type == "cpu" if hasattr(learner.model, "pi_head") else True
    for a, b in zip(learner.model.parameters(), twin.model.parameters()):  # the very same update
        assert torch.equal(a, b)
    m.pop("learner/update_s"), m_twin.pop("learner/update_s")
    assert m == pytest.approx(m_twin, nan_ok=True) and m["lag/mean"] == 1.0
    assert np.isfinite(kl) and kl == twin.fragment_kl(second[0])


def test_the_probe_catches_a_tensor_made_without_its_device():
    """The test above can fail: a factory call that names no device is made on the context's default."""
    probe = OutputDevices()
    with torch.device("meta"), probe:
        torch.zeros(3, device="cpu") + 1
        torch.zeros(3)
    assert probe.seen["meta"] == 1


@contextlib.contextmanager
def saved_as_if_on(location: str):
    """torch.save names ``location`` (e.g. ``cuda:0``) as every tensor's device, as a save on that device does: the
    storage records name the device torch.load restores them to."""
    import torch.serialization as ser

    entry = (-1000, lambda obj: location, lambda obj, loc: None)
    ser._package_registry.insert(0, entry)
    try:
        yield
    finally:
        ser._package_registry.remove(entry)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the load of a GPU checkpoint on a machine without one")
def test_a_checkpoint_saved_on_a_gpu_resumes_and_evaluates_on_the_cpu(tmp_path):
    cfg = cfg_of(actors=1, learner={"device": "cpu"})
    learner, first, _ = stale_batch(cfg)
    learner.update(first)
    with saved_as_if_on("cuda:0"):
        path = learner.save_checkpoint(tmp_path / "final.pt", env_steps=256)
    with pytest.raises(RuntimeError, match="CUDA"):  # what a load without map_location does here
        torch.load(path, weights_only=True)
    other = Learner(cfg, env_spec(cfg))
    assert other.load_checkpoint(path) == 256
    for a, b in zip(learner.model.parameters(), other.model.parameters()):
        assert a.device.type == "cpu" and torch.equal(a, b)
    for a, b in zip(learner.opt.exp_avg_sq, other.opt.exp_avg_sq):
        assert a.device.type == "cpu" and torch.equal(a, b)
    assert other.opt.step_t[0].device.type == "cpu"
    other.update(first)  # and it trains on from there
    from laglab.evaluate import load_policy
    policy, snap, _ = load_policy(path, cfg, env_spec(cfg))
    assert snap.version == learner.version


@pytest.mark.parametrize("device,allowed", [
    ("cuda", "a device this machine has"), ("cuda:7", "a device this machine has"), ("gpu", "auto | cpu | cuda"),
    ("cuda:x", "auto | cpu | cuda"), ("CPU", "auto | cpu | cuda")])
def test_a_device_this_machine_lacks_is_refused_naming_the_ones_it_has(device, allowed):
    if device.startswith("cuda") and device != "cuda:x" and torch.cuda.device_count() > 7:
        pytest.skip("this machine has that GPU")
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ConfigError, match="learner.device") as e:
        cfg_of(learner={"device": device})
    assert allowed in str(e.value)
    if allowed.startswith("a device"):
        assert " | ".join(available_devices()) in str(e.value)


def test_auto_is_the_gpu_where_there_is_one_else_the_cpu():
    learner = Learner(cfg_of(), env_spec(cfg_of()))
    assert learner.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert next(learner.model.parameters()).device.type == learner.device.type
