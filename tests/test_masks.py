"""Action masks: the distribution under a mask against a reference worked out by hand, numpy inference against
torch, admission's ``mask`` rule at its edges, the masks through every way bytes move (shared-memory slots, Ray's
wire form, the learner's batch and its tagged audit), envs that name masks in info or in a Dict observation, and
the bad input each part refuses."""
import dataclasses
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from laglab import algo
from laglab.actor import Actor
from laglab.admission import Admission, validate
from laglab.config import ConfigError, Duplicates
from laglab.envs import MASK_KEY, EnvGroup, EnvSpec, MaskedPickEnv, make_env
from laglab.inference import InferencePolicy
from laglab.learner import Learner
from laglab.policy import ActorCritic
from laglab.run import env_spec, run
from laglab.tagged import TAGGED_ID, expected_mask

from test_protocol import ALL, balanced, cfg_of, on

MASKED = EnvSpec((3,), True, 4, masked=True)


def reference_logp_entropy(logits, mask, action):
    """The slow way: probabilities of the legal actions, renormalized; illegal ones have probability 0."""
    legal = [i for i in range(len(logits)) if mask[i]]
    z = sum(math.exp(logits[i]) for i in legal)
    p = {i: math.exp(logits[i]) / z for i in legal}
    return math.log(p[action]), -sum(q * math.log(q) for q in p.values())


def test_masked_log_probs_and_entropy_match_the_renormalized_distribution_worked_by_hand():
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, (64, 5)).astype(np.float32)
    mask = rng.random((64, 5)) < 0.5
    mask[np.arange(64), rng.integers(0, 5, 64)] = True  # at least one legal action
    actions = np.array([rng.choice(np.flatnonzero(m)) for m in mask])
    lt = torch.tensor(logits, requires_grad=True)
    logp, ent = algo.categorical_logp_entropy(lt, torch.from_numpy(actions), torch.from_numpy(mask))
    for i in range(64):
        want_lp, want_ent = reference_logp_entropy(logits[i].astype(np.float64), mask[i], int(actions[i]))
        assert logp[i].item() == pytest.approx(want_lp, abs=1e-5)
        assert ent[i].item() == pytest.approx(want_ent, abs=1e-5)
    (logp.sum() + ent.sum()).backward()  # no NaN from the masked entries, and they get no gradient
    assert torch.isfinite(lt.grad).all()
    assert (lt.grad[torch.from_numpy(~mask)] == 0).all()
    unmasked = algo.categorical_logp_entropy(lt, torch.from_numpy(actions))[0]
    assert not torch.allclose(unmasked, logp)  # (the mask changes the answer on these logits)


def test_numpy_inference_under_a_mask_matches_torch_and_never_samples_an_illegal_action():
    torch.manual_seed(0)
    model = ActorCritic(MASKED, (16,))
    with torch.no_grad():
        model.pi[-1].weight.mul_(300.0)  # sharp logits: the most probable action is often illegal
    from laglab.inference import Snapshot

    pol = InferencePolicy(Snapshot.make(1, model, np.zeros(3), np.ones(3)), MASKED)
    rng = np.random.default_rng(3)
    obs = rng.normal(size=(512, 3)).astype(np.float32)
    mask = rng.random((512, 4)) < 0.4
    mask[np.arange(512), rng.integers(0, 4, 512)] = True
    a, logp, *_ = pol.act(obs, rng, mask)
    assert mask[np.arange(512), a].all()
    t_logp, _ = model.logp_entropy(torch.from_numpy(obs), torch.from_numpy(a), torch.from_numpy(mask))
    np.testing.assert_allclose(logp, t_logp.detach().numpy(), atol=1e-5)
    best = pol.mode(obs, mask)[0]
    assert mask[np.arange(512), best].all()
    assert (pol.mode(obs)[0] != best).any()  # unmasked, the mode is sometimes illegal


def test_a_draw_of_exactly_zero_still_picks_a_legal_action():
    class Zeros:
        def random(self, shape, dtype=np.float64):
            return np.zeros(shape, dtype)

    torch.manual_seed(0)
    from laglab.inference import Snapshot

    pol = InferencePolicy(Snapshot.make(1, ActorCritic(MASKED, (8,)), np.zeros(3), np.ones(3)), MASKED)
    mask = np.array([[False, True, True, True], [False, False, False, True], [True, False, False, False]])
    a, logp, *_ = pol.act(np.zeros((3, 3), np.float32), Zeros(), mask)
    assert mask[np.arange(3), a].all() and np.isfinite(logp).all()


def mfrag(actions, masks, T=4):
    from test_admission import frag

    f = frag(EnvSpec((3,), True, 4, masked=True))
    return dataclasses.replace(f, actions=np.asarray(actions, np.int64), masks=masks)


@pytest.mark.parametrize("masks,actions,reason", [
    (np.ones((4, 4), bool), [0, 1, 2, 3], None),
    (np.eye(4, dtype=bool), [0, 1, 2, 3], None),  # exactly one legal action per step, taken
    (np.eye(4, dtype=bool), [0, 1, 2, 2], "mask"),  # the last step's action is not allowed
    (np.array([[1, 1, 1, 1]] * 3 + [[0, 0, 0, 0]], bool), [0, 1, 2, 3], "mask"),  # a step allows nothing
    (np.ones((4, 4), bool), [0, 1, 2, 4], "action"),  # out of range is not a mask question
    (np.ones((4, 3), bool), [0, 1, 2, 2], "shape"),
    (np.ones((3, 4), bool), [0, 1, 2, 2], "shape"),
    (np.ones((4, 4), np.float32), [0, 1, 2, 3], "shape"),  # a mask is bool
    (None, [0, 1, 2, 3], "shape"),  # a masked env's fragment without masks
])
def test_admission_checks_masks_at_their_edges(masks, actions, reason):
    spec = EnvSpec((3,), True, 4, masked=True)
    assert validate(mfrag(actions, masks), spec, 2, 4, learner_version=2) == reason


def test_masks_on_an_unmasked_env_are_refused_and_a_mask_rejection_is_booked_by_its_steps():
    unmasked = EnvSpec((3,), True, 4)
    f = mfrag([0, 1, 2, 3], np.ones((4, 4), bool))
    assert validate(f, unmasked, 2, 4, learner_version=2) == "shape"
    adm = Admission(EnvSpec((3,), True, 4, masked=True), 2, 4, Duplicates.ignore)
    assert adm.admit(mfrag([0, 0, 0, 0], np.eye(4, dtype=bool)), True, 2) == "mask"
    assert adm.stats.rejected == {"mask": 4} and adm.stats.admitted_steps == 0


class DictMasked(gym.Env):
    """A Dict observation with an action_mask entry (the other common convention); every action legal but 0."""

    def __init__(self, bad=False, box_actions=False):
        box = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        spaces = {"obs": box, MASK_KEY: gym.spaces.MultiBinary(3)}
        if bad:
            spaces["extra"] = box
        self.observation_space = gym.spaces.Dict(spaces)
        self.action_space = box if box_actions else gym.spaces.Discrete(3)

    def _o(self):
        return {"obs": np.zeros(2, np.float32), MASK_KEY: np.array([0, 1, 1], np.int8)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._o(), {}

    def step(self, action):
        assert int(action) != 0, "an illegal action reached the env"
        return self._o(), 1.0, False, False, {}


class Forgetful(MaskedPickEnv):
    """Names its mask at reset only."""

    def step(self, action):
        obs, r, te, tr, _ = super().step(action)
        return obs, r, te, tr, {}


class StepOnly(MaskedPickEnv):
    """Names its mask on steps only."""

    def reset(self, *, seed=None, options=None):
        return super().reset(seed=seed)[0], {}


class Sometimes(MaskedPickEnv):
    """Names its mask only when some action is illegal (a convention some envs follow), and at reset only with
    seed 0 or no seed (so the learner's probe and an actor's first reset disagree)."""

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed)
        return obs, (info if seed in (None, 0) else {})


class AllIllegal(MaskedPickEnv):
    def reset(self, *, seed=None, options=None):
        obs, _ = super().reset(seed=seed)
        return obs, {MASK_KEY: np.zeros(self.n, bool)}


for _id, _cls in (("laglabtest/DictMasked-v0", DictMasked), ("laglabtest/Forgetful-v0", Forgetful),
                  ("laglabtest/StepOnly-v0", StepOnly), ("laglabtest/Sometimes-v0", Sometimes),
                  ("laglabtest/AllIllegal-v0", AllIllegal)):
    if _id not in gym.registry:
        gym.register(_id, entry_point=_cls)


def test_a_dict_observation_with_an_action_mask_becomes_its_box_and_the_mask_is_used():
    cfg = cfg_of(env={"id": "laglabtest/DictMasked-v0"}, actors=1)
    spec = env_spec(cfg)
    assert spec.masked and spec.obs_shape == (2,)
    actor = Actor(cfg, 0, 1)
    actor.load(Learner(cfg, spec).snapshot())
    frags = actor.collect().fragments  # (the env asserts that no illegal action reaches it)
    assert all(f.masks is not None and (f.masks == [False, True, True]).all() for f in frags)
    with pytest.raises(ConfigError, match="action_mask"):
        make_env(cfg_of(env={"id": "laglabtest/DictMasked-v0", "kwargs": {"bad": True}}).env)
    # a mask beside continuous actions cannot be used: said, not dropped (env.action_mask=false ignores it)
    box = {"id": "laglabtest/DictMasked-v0", "kwargs": {"box_actions": True}}
    with pytest.raises(ConfigError, match="continuous.*env.action_mask=false"):
        env_spec(cfg_of(env=box))
    assert not env_spec(cfg_of(env={**box, "action_mask": False})).discrete


def test_an_env_that_stops_naming_its_mask_is_a_clear_error_and_action_mask_false_ignores_masks():
    cfg = cfg_of(env={"id": "laglabtest/Forgetful-v0"})
    group = EnvGroup(cfg.env, 2, 0)
    group.reset()
    assert group.spec.masked
    with pytest.raises(ConfigError, match="after every reset and step"):
        group.step(group.masks.argmax(axis=1))  # legal picks: the episodes go on, and no mask comes back
    off = cfg_of(env={"id": "laglab/MaskedPick-v0", "action_mask": False})
    assert not env_spec(off).masked
    actor = Actor(off, 0, 1)
    actor.load(Learner(off, env_spec(off)).snapshot())
    assert all(f.masks is None for f in actor.collect().fragments)


def test_envs_that_name_masks_only_sometimes_or_allow_nothing_are_refused_with_a_line_that_says_so():
    step_only = EnvGroup(cfg_of(env={"id": "laglabtest/StepOnly-v0"}).env, 2, 0)
    step_only.reset()
    assert not step_only.spec.masked
    with pytest.raises(ConfigError, match="not at its first reset"):
        step_only.step(np.array([e.unwrapped._mask.argmax() for e in step_only.envs]))  # legal: no reset
    cfg = cfg_of(env={"id": "laglabtest/Sometimes-v0"})
    assert env_spec(cfg).masked  # the learner's probe (seed 0) saw a mask ...
    with pytest.raises(ConfigError, match="the learner's probe and this actor's first reset disagree"):
        Actor(cfg, 0, 1, expect=env_spec(cfg))  # ... this actor's first reset (another seed) did not
    with pytest.raises(ConfigError, match="allows no action"):
        EnvGroup(cfg_of(env={"id": "laglabtest/AllIllegal-v0"}).env, 1, 0).reset()


def test_the_size_check_counts_the_masks_and_a_masked_checkpoint_does_not_fit_an_unmasked_run(tmp_path):
    from laglab.checks import fragment_bytes
    from laglab.learner import read_checkpoint

    cfg = cfg_of(env={"id": "laglab/MaskedPick-v0"})
    spec = env_spec(cfg)
    actor = Actor(cfg, 0, 1)
    learner = Learner(cfg, spec)
    actor.load(learner.snapshot())
    f = next(f for f in actor.collect().fragments if not f.truncated.any())
    assert fragment_bytes(spec, cfg.actor.rollout_len, 0) == f.nbytes
    path = learner.save_checkpoint(tmp_path / "ck.pt")
    read_checkpoint(path, cfg, spec)  # fits its own run
    off = cfg_of(env={"id": "laglab/MaskedPick-v0", "action_mask": False})
    with pytest.raises(ConfigError, match="masked: checkpoint True, this run False"):
        read_checkpoint(path, off, env_spec(off))


def test_the_learner_scores_behavior_actions_under_their_masks():
    """At lag 0 the learner's log-prob of each action is the actor's: wrong if either side ignores the mask."""
    cfg = cfg_of(env={"id": "laglab/MaskedPick-v0"})
    spec = env_spec(cfg)
    learner = Learner(cfg, spec)
    with torch.no_grad():
        learner.model.pi[-1].weight.mul_(100.0)  # a policy far from uniform, so masks change log-probs a lot
    actor = Actor(cfg, 0, 1)
    actor.load(learner.snapshot())
    frags = actor.collect().fragments
    b = learner._batch(frags)
    cur_logp = learner._targets(b)[3]
    np.testing.assert_allclose(cur_logp.numpy(), b.behavior_logp.numpy(), atol=1e-4)
    unmasked = learner.model.logp_entropy(b.obs, b.actions)[0].view(b.T, b.N)
    assert not np.allclose(unmasked.detach().numpy(), b.behavior_logp.numpy(), atol=1e-2)
    assert learner.fragment_kl(frags[0]) == pytest.approx(0.0, abs=1e-4)


def test_the_tagged_audit_catches_masks_out_of_line_with_their_observations():
    cfg = cfg_of(env={"id": TAGGED_ID, "kwargs": {"masked": True}})
    spec = env_spec(cfg)
    assert spec.masked
    learner = Learner(cfg, spec)
    actor = Actor(cfg, 1, 7)
    actor.load(learner.snapshot())
    frags = actor.collect().fragments
    assert learner.audit(frags) == 0
    assert all((f.masks == expected_mask(f.obs)).all() for f in frags)
    swapped = [dataclasses.replace(frags[0], masks=frags[1].masks)] + frags[1:]  # another stream's masks
    assert not np.array_equal(frags[0].masks, frags[1].masks)
    assert learner.audit(swapped) > 0
    shifted = [dataclasses.replace(f, masks=np.roll(f.masks, 1, axis=0)) for f in frags]  # off by one step
    assert learner.audit(shifted) > 0


def test_masks_cross_shared_memory_slots_and_rays_wire_form():
    from laglab.runners.ray_actor import from_wire, to_wire
    from laglab.shm import FragmentLayout, SlotPool, new_token, segment_name

    cfg = cfg_of(env={"id": TAGGED_ID, "kwargs": {"masked": True}})
    spec = env_spec(cfg)
    actor = Actor(cfg, 1, 7)
    actor.load(Learner(cfg, spec).snapshot())
    f = actor.collect().fragments[0]
    assert not f.masks.all()  # (some steps forbid an action: a lost mask would read as all-True or all-False)
    np.testing.assert_array_equal(from_wire(to_wire(f)).masks, f.masks)
    pool = SlotPool(FragmentLayout(spec, 16), actors=2, per_actor=2, name=segment_name(new_token(), "t"),
                    create_new=True)
    try:
        slot = pool.free_slot(1)
        g = pool.read(slot, f.id, pool.write(slot, f))
        np.testing.assert_array_equal(g.masks, f.masks)
        assert g.masks.dtype == np.bool_ and not g.masks.flags.writeable
    finally:
        pool.close(unlink=True)


@pytest.mark.parametrize("runner", ALL + ["process-forkserver"])
def test_a_masked_tagged_run_audits_clean_and_balances_its_books_on_each_runner(tmp_path, runner):
    cfg = on(runner, env={"id": TAGGED_ID, "kwargs": {"masked": True}})
    s = run(cfg, tmp_path / runner)
    t = s["transport"]
    assert s["status"] == "completed" and balanced(t)
    assert t["misattributed"] == 0 and sum(t["rejected"].values()) == 0 and t["admitted"] > 0


def test_a_masked_policy_learns_the_masked_task_and_evaluation_keeps_to_the_mask(tmp_path):
    """MaskedPick: an illegal pick ends the episode. Under the mask no episode ends early, in training or in
    evaluation; without it (env.action_mask=false) they do. And the policy learns (random legal picks earn ~25 in 50
    steps, the best ~36): wrong if the update scored actions without their masks."""
    from laglab.evaluate import find_checkpoint, load_policy, play

    over = dict(env={"id": "laglab/MaskedPick-v0"}, total_env_steps=30_000, actors=1, runner={"name": "sync"},
                algo={"advantage": {"gamma": 0.9, "lam": 0.9}}, learner={"checkpoint_every": 0})
    cfg = cfg_of(**over)
    s = run(cfg, tmp_path / "masked")
    policy, snap, _ = load_policy(find_checkpoint(tmp_path / "masked", "auto"), cfg, env_spec(cfg))
    for mode in ("sample", "deterministic"):
        assert play(cfg, policy, snap, 5, mode).summary()["length_mean"] == 50  # never an illegal pick
    off = run(cfg_of(**{**over, "env": {"id": "laglab/MaskedPick-v0", "action_mask": False}}), tmp_path / "off")
    assert s["episodes"] < off["episodes"]  # unmasked episodes end early at illegal picks
    assert s["final_return_mean"] > 31


@pytest.mark.parametrize("runner", ["sync", "process"])
def test_chaos_on_a_masked_env_clears_mask_entries_and_admission_refuses_each_as_mask(tmp_path, runner):
    from laglab.chaos import EXPECTED_REASON

    cfg = on(runner, env={"id": TAGGED_ID, "kwargs": {"masked": True}}, total_env_steps=16384,
             chaos={"corrupt_p": 0.3})
    s = run(cfg, tmp_path / runner)
    t, c = s["transport"], s["chaos"]
    assert c["corrupted_steps"].get("mask", 0) > 0
    assert {EXPECTED_REASON[k]: n for k, n in c["corrupted_steps"].items()} == t["rejected"]
    assert balanced(t) and t["misattributed"] == 0
