"""Recurrent policies (issue 21): the actors' numpy network against the learner's torch network over sequences with
episode resets, the history contract the fragments carry (the state at a fragment's first step, its final state,
zero at every episode start) and admission's ``state`` rule at its edges, reassembly's extra condition, the learner's
unroll and truncated BPTT against a reference written step by step, burn-in, and runs on every runner."""
import dataclasses

import numpy as np
import pytest
import torch

from laglab.actor import Actor
from laglab.admission import validate
from laglab.config import ConfigError
from laglab.envs import EnvSpec
from laglab.fragment import successors
from laglab.inference import InferencePolicy, Snapshot
from laglab.learner import Learner, chain_heights
from laglab.policy import RecurrentActorCritic
from laglab.recurrent import policy_state_shape
from laglab.run import env_spec, run

from test_protocol import ALL, balanced, cfg_of, on

DISCRETE = EnvSpec((3,), True, 4)
CONTINUOUS = EnvSpec((3,), False, 2, action_low=np.full(2, -1.0, np.float32), action_high=np.full(2, 1.0, np.float32))


def rec(kind="gru", **over):
    """The small protocol config with a recurrent policy."""
    policy = {"recurrent": kind, "hidden": 8, **over.pop("policy", {})}
    return cfg_of(policy=policy, **over)


def slow_states(model: RecurrentActorCritic, obs, state, dones, cut_at=0, cut=None):
    """The model's states step by step: its core called one env and one step at a time (``cut``: the envs whose state
    is detached before step ``cut_at``)."""
    T, N = obs.shape[:2]
    out = torch.zeros((T, N) + model.state_shape)
    for n in range(N):
        s = state[n:n + 1]
        for t in range(T):
            if cut is not None and cut[n] and t == cut_at:
                s = s.detach()
            s = model.step(obs[t, n:n + 1], s)
            out[t, n] = s[0]
            if dones[t, n]:
                s = torch.zeros_like(s)
    return out


@pytest.mark.parametrize("kind", ["gru", "lstm"])
@pytest.mark.parametrize("spec", [DISCRETE, CONTINUOUS], ids=["discrete", "continuous"])
@pytest.mark.parametrize("p_done", [0.1, 0.0], ids=["resets", "one-segment"])
def test_numpy_inference_matches_the_torch_network_over_a_sequence_with_resets(kind, spec, p_done):
    torch.manual_seed(0)
    model = RecurrentActorCritic(spec, (16,), "tanh", 0.0, kind, 8)
    with torch.no_grad():  # non-trivial biases and heads: zero-initialized ones would hide a misplaced term
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    pol = InferencePolicy(Snapshot.make(0, model, np.zeros(3), np.ones(3)), spec, "tanh", kind)
    rng = np.random.default_rng(0)
    T, N = 60, 5
    obs = rng.normal(size=(T, N, 3)).astype(np.float32)
    dones = rng.random((T, N)) < p_done
    h = np.zeros((N,) + pol.state_shape, np.float32)
    states, logps, values, actions = [], [], [], []
    for t in range(T):
        a, logp, v, *_, nxt = pol.act(obs[t], rng, None, h)
        states.append(nxt)
        logps.append(logp)
        values.append(v)
        actions.append(a)
        h = np.where(dones[t].reshape((-1,) + (1,) * (nxt.ndim - 1)), 0.0, nxt).astype(np.float32)
    with torch.no_grad():
        h, ends = model.unroll(torch.from_numpy(obs), model.zero_state(N), torch.from_numpy(dones))
        ref = slow_states(model, torch.from_numpy(obs), model.zero_state(N), dones)
        np.testing.assert_allclose(np.stack(states), ref.numpy(), atol=1e-5)  # numpy against torch, every state
        np.testing.assert_allclose(h.numpy(), model.output(ref).numpy(), atol=1e-6)  # the fused unroll's outputs
        pieces = model.outputs(torch.from_numpy(obs), model.zero_state(N), torch.from_numpy(dones))
        np.testing.assert_allclose(pieces.numpy(), h.numpy(), atol=1e-6)  # ... and the gradient pass's, piece-wise
        at = dones.copy()
        at[-1] = True  # ... and its states where an episode ends and at the end
        np.testing.assert_allclose(ends.numpy()[at], ref.numpy()[at], atol=1e-6)
        assert not ends.numpy()[~at].any()
        flat = h.flatten(0, 1)
        t_logp = model.logp_entropy_of(flat, torch.from_numpy(np.stack(actions)).flatten(0, 1))[0]
        np.testing.assert_allclose(np.stack(logps).reshape(-1), t_logp.numpy(), atol=1e-4)
        np.testing.assert_allclose(np.stack(values).reshape(-1), model.value_of(flat).numpy(), atol=1e-5)


def test_a_recurrent_policy_needs_a_state_and_a_feed_forward_one_returns_none():
    model = RecurrentActorCritic(DISCRETE, (8,), "tanh", 0.0, "gru", 4)
    pol = InferencePolicy(Snapshot.make(0, model, np.zeros(3), np.ones(3)), DISCRETE, "tanh", "gru")
    with pytest.raises(ValueError, match="state"):
        pol.act(np.zeros((2, 3), np.float32), np.random.default_rng(0))
    from laglab.policy import ActorCritic
    mlp = InferencePolicy(Snapshot.make(0, ActorCritic(DISCRETE, (8,)), np.zeros(3), np.ones(3)), DISCRETE)
    assert mlp.state_shape is None and mlp.act(np.zeros((2, 3), np.float32), np.random.default_rng(0))[-1] is None


def collect(cfg, rollouts=3, actor_id=0):
    spec = env_spec(cfg)
    learner = Learner(cfg, spec)
    actor = Actor(cfg, actor_id, 1)
    actor.load(learner.snapshot())
    frags = [f for _ in range(rollouts) for f in actor.collect().fragments]
    return learner, actor, frags


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_fragments_carry_the_history_contract_and_the_learner_scores_lag_0_data_as_the_actor_did(kind):
    """Short episodes (the tagged env ends them every few steps): states are zero at every episode start, a fragment's
    final state is its successor's first state, and under the behavior weights the learner's unroll from the stored
    states gives back the behavior log-probs (pi/mu = 1 at lag 0) — wrong if a state, a reset or a join were off."""
    cfg = rec(kind)
    learner, actor, frags = collect(cfg)
    S = policy_state_shape(cfg.policy)
    for f in frags:
        assert f.state.shape == S and f.final_state.shape == S and f.state.dtype == np.float32
        assert validate(f, learner.spec, 2, 4, 0, S) is None
        if f.id.episode_t0 == 0:
            assert not f.state.any()
    by = {(f.id.env_index, f.id.t_start): f for f in frags}
    joined = 0
    for f in frags:
        g = by.get((f.id.env_index, f.id.t_end + 1))
        if g is not None:
            np.testing.assert_array_equal(g.state, f.final_state)
            joined += 1
    assert joined == 8 and any(f.state.any() for f in frags)  # (some fragments start mid-episode)
    succ = successors(frags)
    assert (succ >= 0).sum() == 8 and chain_heights(succ).max() == 2
    b = learner._batch(frags)
    _, _, _, cur_logp, init = learner._recurrent_pass(b)
    np.testing.assert_allclose(cur_logp.numpy(), b.behavior_logp.numpy(), atol=2e-5)
    # a chain's later links continue from the state the learner computes, which is the stored one at lag 0
    np.testing.assert_allclose(init.numpy(), np.stack([f.state for f in frags]), atol=1e-5)


def test_a_join_needs_the_very_state_and_not_the_same_behavior_version():
    cfg = rec()
    _, _, frags = collect(cfg, rollouts=2)
    assert (successors(frags) >= 0).sum() == 4
    first, second = frags[:4], frags[4:]
    nudged = [dataclasses.replace(g, state=g.state + np.float32(1e-3)) for g in second]
    assert (successors(first + nudged) >= 0).sum() == 0
    missing = [dataclasses.replace(f, final_state=None) for f in first]
    assert (successors(missing + second) >= 0).sum() == 0
    # a newer behavior version for the successor (an async actor loaded a snapshot between its rollouts): still one
    # history, which the learner continues from the state the current policy computes
    bumped = [dataclasses.replace(g, id=dataclasses.replace(g.id, behavior_version=1)) for g in second]
    assert (successors(first + bumped) >= 0).sum() == 4
    # a feed-forward fragment pair joins on identity alone (as before recurrent policies)
    plain = [dataclasses.replace(f, state=None, final_state=None) for f in first + nudged]
    assert (successors(plain) >= 0).sum() == 4


def bad_state(f, kind):
    if kind == "missing":
        return dataclasses.replace(f, state=None)
    if kind == "final_missing":
        return dataclasses.replace(f, final_state=None)
    if kind == "shape":
        return dataclasses.replace(f, state=np.zeros(f.state.size + 1, np.float32))
    if kind == "dtype":
        return dataclasses.replace(f, state=f.state.astype(np.float64))
    if kind == "nan":
        s = f.state.copy()
        s.flat[0] = np.nan
        return dataclasses.replace(f, state=s)
    if kind == "inf_final":
        s = f.final_state.copy()
        s.flat[-1] = np.inf
        return dataclasses.replace(f, final_state=s)
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["missing", "final_missing", "shape", "dtype", "nan", "inf_final"])
def test_admission_refuses_a_bad_state_as_state(kind):
    cfg = rec()
    learner, _, frags = collect(cfg, rollouts=2)
    f = next(f for f in frags if f.state.any())
    S = policy_state_shape(cfg.policy)
    assert validate(f, learner.spec, 2, 4, 0, S) is None
    assert validate(bad_state(f, kind), learner.spec, 2, 4, 0, S) == "state"


def test_admission_holds_episode_starts_to_the_zero_state_and_feed_forward_runs_to_no_state():
    cfg = rec()
    learner, _, frags = collect(cfg, rollouts=2)
    S = policy_state_shape(cfg.policy)
    start = next(f for f in frags if f.id.episode_t0 == 0)
    assert validate(start, learner.spec, 2, 4, 0, S) is None
    assert validate(dataclasses.replace(start, state=start.state + np.float32(0.5)), learner.spec, 2, 4, 0, S) == "state"
    ended = next(f for f in frags if f.terminated[-1] or f.truncated[-1]) if any(
        f.terminated[-1] or f.truncated[-1] for f in frags) else None
    if ended is not None:
        nonzero = dataclasses.replace(ended, final_state=np.ones(S, np.float32))
        assert validate(nonzero, learner.spec, 2, 4, 0, S) == "state"
    mid = next(f for f in frags if f.state.any())
    assert validate(mid, learner.spec, 2, 4, 0, None) == "state"  # a state where the learner expects none
    assert validate(dataclasses.replace(mid, state=None, final_state=None), learner.spec, 2, 4, 0, None) is None


def test_a_fragment_that_ends_an_episode_hands_on_the_zero_state():
    cfg = rec(total_env_steps=8192)
    learner, _, frags = collect(cfg, rollouts=6)
    S = policy_state_shape(cfg.policy)
    ended = [f for f in frags if f.terminated[-1] or f.truncated[-1]]
    assert ended, "the tagged env ends some episode on a fragment's last step within 6 rollouts"
    for f in ended:
        assert not f.final_state.any()
        assert validate(dataclasses.replace(f, final_state=np.ones(S, np.float32)), learner.spec, 2, 4, 0, S) == "state"


@pytest.mark.parametrize("overrides,key", [
    (dict(policy={"recurrent": "rnn"}), "policy.recurrent"),
    (dict(policy={"recurrent": "gru", "hidden": 0}), "policy.hidden"),
    (dict(policy={"recurrent": "gru"}, learner={"burn_in": 16}), "learner.burn_in"),
    (dict(policy={"recurrent": "gru"}, learner={"burn_in": -1}), "learner.burn_in"),
    (dict(learner={"burn_in": 4}), "learner.burn_in"),
    (dict(policy={"recurrent": "gru"}, learner={"batch_size": 32, "minibatches": 4}), "learner.minibatches"),
])
def test_bad_recurrent_settings_are_refused_naming_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        cfg_of(**overrides)


def slow_minibatch(learner, frags, init, keep, cut=None, model=None):
    """The learner's one-minibatch forward pass written the slow way: every fragment unrolled step by step from its
    initial state, the kept steps' log-probs and values, in the flat order t * N + n."""
    b = learner._batch(frags)
    T, N = b.T, b.N
    model = model or learner.model
    obs = b.obs.view((T, N) + learner.spec.obs_shape)
    states = slow_states(model, obs, init, b.dones.numpy(), learner.cfg.learner.burn_in, cut)
    logp, value, pos = [], [], []
    for t in range(T):
        for n in range(N):
            if keep[t, n]:
                s = model.output(states[t, n:n + 1])
                logp.append(model.logp_entropy_of(s, b.actions[t * N + n:t * N + n + 1])[0][0])
                value.append(model.value_of(s)[0])
                pos.append(t * N + n)
    return torch.stack(logp), torch.stack(value), torch.tensor(pos)


@pytest.mark.parametrize("burn_in", [0, 5])
def test_truncated_bptt_and_burn_in_match_the_slow_reference(burn_in):
    """One minibatch of every segment: the positions the loss counts, their log-probs and values, and the gradient of
    the loss through the unroll equal a step-by-step reference; burn-in leaves out the first steps of exactly the
    segments that start from a stored state (a chain's later links continue from a computed state)."""
    cfg = rec(env={"id": "laglab/CartPolePOMDP-v0", "max_episode_steps": 21},  # (truncations; episode ends
              learner={"batch_size": 256, "minibatches": 1, "burn_in": burn_in})  # inside some burn-ins, not all)
    learner, _, frags = collect(cfg, rollouts=5)
    frags = frags[4:]  # (after the first rollout: chains that start mid-episode, from a stored state)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in learner.model.parameters():
            p.add_(0.2 * torch.randn_like(p))  # (data collected by other weights: stored and computed states differ)
    b = learner._batch(frags)
    extras = {}
    learner._targets(b, extras)
    init = extras["init"]
    heads = chain_heights(b.succ) == 0
    assert heads.sum() == 4 and (~heads).sum() == 12
    assert not torch.allclose(init[~heads], b.state[~heads], atol=1e-4)  # computed states, not the stored ones
    keep, cut = learner._burn_in(b, heads)
    # what burn-in leaves out, worked out fragment by fragment: the first k steps of a chain's first fragment when it
    # starts mid-episode, through the first episode end if one comes sooner; nothing elsewhere
    want = np.ones((16, 16), bool)
    want_cut = np.zeros(16, bool)
    for n, f in enumerate(frags):
        if burn_in and heads[n] and f.id.episode_t0 > 0:
            ends = np.flatnonzero((f.terminated | f.truncated)[:burn_in])
            want[:ends[0] + 1 if len(ends) else burn_in, n] = False
            want_cut[n] = not len(ends)
    np.testing.assert_array_equal(keep.numpy(), want)
    np.testing.assert_array_equal(cut.numpy(), want_cut)
    if burn_in:  # (the cases are hit: a burn-in cut short by an episode end, and a whole one)
        assert want_cut.any() and (~want[:, ~want_cut & heads]).any()
    pos = {"pos": torch.arange(b.T * b.N)}  # (each row's flat position: which rows the minibatch took)
    [(rows, logp, ent, v, prox)] = list(learner._minibatches(b, init, keep, False, cut, None, pos))
    idx = rows["pos"]
    ref_logp, ref_v, ref_pos = slow_minibatch(learner, frags, init, keep.numpy(), want_cut)
    order = torch.argsort(idx)
    assert torch.equal(idx[order], ref_pos) and prox is None
    torch.testing.assert_close(logp[order], ref_logp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(v[order], ref_v, atol=1e-5, rtol=1e-5)
    w = learner.model.core.weight_hh_l0
    g = torch.autograd.grad((logp.sum() + v.sum()), w)[0]
    g_ref = torch.autograd.grad((ref_logp.sum() + ref_v.sum()), w)[0]
    torch.testing.assert_close(g, g_ref, atol=1e-4, rtol=1e-4)
    assert g.abs().sum() > 0
    if burn_in:  # the gradient is cut after the burn-in: without the cut it differs
        uncut = slow_minibatch(learner, frags, init, keep.numpy())
        g_uncut = torch.autograd.grad(uncut[0].sum() + uncut[1].sum(), w)[0]
        assert not torch.allclose(g_uncut, g_ref, atol=1e-4, rtol=1e-4)


def test_burn_in_spares_exactly_the_chains_that_start_an_episode():
    """learner.burn_in=k leaves out the first k steps of a chain that starts mid-episode from a stored state —
    however early in the episode (here its second step) — and none of a chain that starts the episode from the
    zero state."""
    cfg = rec(learner={"burn_in": 3})
    learner, _, frags = collect(cfg, rollouts=2)
    frags = frags[4:]  # the second rollout: one fragment per env, each the head of its own chain
    no_end = np.zeros(len(frags[0].terminated), bool)
    frags = [dataclasses.replace(f, id=dataclasses.replace(f.id, episode_t0=t0), terminated=no_end, truncated=no_end,
                                 trunc_obs=f.trunc_obs[:0], state=f.state * (t0 > 0))
             for f, t0 in zip(frags, (0, 1, 2, 7))]
    b = learner._batch(frags)
    heads = chain_heights(b.succ) == 0
    assert heads.all()
    keep, cut = learner._burn_in(b, heads)
    keep, cut = keep.numpy(), cut.numpy()
    assert keep[:, 0].all() and not cut[0]  # the episode's start: every step counts, nothing to cut
    for n in (1, 2, 3):
        assert not keep[:3, n].any() and keep[3:, n].all() and cut[n]


def perturbed(learner, scale=0.5, seed=1, model=None):
    """``learner`` with its weights moved off their init (sharp logits: a log-prob error shows in a KL)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in (model or learner.model).parameters():
            p.add_(scale * torch.randn_like(p))
    return learner


POMDP = {"id": "laglab/CartPolePOMDP-v0", "max_episode_steps": 21}  # truncations, and episodes that span fragments


def test_an_update_trains_a_recurrent_policy_and_reports_the_lag_measures():
    cfg = rec(env=POMDP, learner={"batch_size": 256, "minibatches": 2, "epochs": 2, "burn_in": 2})
    learner = perturbed(Learner(cfg, env_spec(cfg)))
    actor = Actor(cfg, 0, 1)
    actor.load(learner.snapshot())
    frags = [f for _ in range(5) for f in actor.collect().fragments][4:]
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    m = learner.update(frags)
    assert np.isfinite(m["losses/policy_loss"]) and np.isfinite(m["losses/value_loss"])
    assert abs(m["lag/kl_behavior"]) < 1e-5  # lag 0: the learner scores the behavior data as the actor did
    assert m["learner/chain_starts_frac"] == 0.25 and 0 < m["learner/burn_in_frac"] <= 2 * 4 / 256
    assert not torch.equal(before["core.weight_hh_l0"], learner.model.core.weight_hh_l0)
    actor.load(learner.publish_snapshot())
    again = [f for f in actor.collect().fragments if f.state.any()]
    assert again and all(abs(learner.fragment_kl(f)) < 1e-5 for f in again)  # under its behavior weights: 0
    # (the KL reads the stored state: without it, it is not 0. Each fragment's stored state matters more or less --
    # one near an episode's start barely -- and which fragments a rollout holds varies with torch's threads: the
    # largest effect over the rollout's fragments)
    assert max(learner.fragment_kl(dataclasses.replace(f, state=np.zeros_like(f.state))) for f in again) > 1e-3


def numpy_gae(learner, frags):
    """Values and GAE advantages of each env's fragments, joined in time order, written out step by step with the
    actors' numpy network under the learner's current weights: the state zero at episode starts, a truncated step
    bootstrapped with V(final observation) from the state after it, the end with V(last observation)."""
    cfg, a = learner.cfg, learner.cfg.algo.advantage
    pol = InferencePolicy(learner.snapshot(), learner.spec, cfg.policy.activation, cfg.policy.recurrent)
    out = {}
    for e in sorted({f.id.env_index for f in frags}):
        chain = sorted((f.id.t_start, i, f) for i, f in enumerate(frags) if f.id.env_index == e)
        s = chain[0][2].state[None].copy()
        values, rewards, disc = [], [], []
        for _, _, f in chain:
            k = 0
            for t in range(len(f.obs)):
                *_, nxt = pol.act(f.obs[t][None], np.random.default_rng(0), None, s)
                values.append(float(pol.value(f.obs[t][None], s)[0]))
                r = float(f.rewards[t])
                if f.truncated[t]:
                    r += a.gamma * float(pol.value(f.trunc_obs[k][None], nxt)[0])
                    k += 1
                done = f.terminated[t] or f.truncated[t]
                rewards.append(r)
                disc.append(0.0 if done else a.gamma)
                s = np.zeros_like(nxt) if done else nxt
        boot = float(pol.value(chain[-1][2].last_obs[None], s)[0])
        adv, nxt_adv, nxt_v = np.zeros(len(values)), 0.0, boot
        for t in reversed(range(len(values))):
            delta = rewards[t] + disc[t] * nxt_v - values[t]
            nxt_adv = delta + disc[t] * a.lam * nxt_adv
            adv[t], nxt_v = nxt_adv, values[t]
        T = len(chain[0][2].obs)
        for c, (_, i, _) in enumerate(chain):
            out[i] = (np.array(values[c * T:(c + 1) * T]), adv[c * T:(c + 1) * T])
    return out


@pytest.mark.parametrize("kind", ["gru", "lstm"])
@pytest.mark.parametrize("backend", ["torch", "numpy"])
def test_the_learners_values_and_gae_on_joined_chains_with_truncations_match_a_numpy_reference(kind, backend):
    """Weights other than the behavior's (so a joined fragment's computed state differs from its stored one): values
    and advantages equal a reference run step by step over each env's whole history in numpy — wrong if a
    truncation's bootstrap used the state after the reset, or a join the stored state. On either backend's pass
    (torch's fused kernel; numpy's cells, chain level by chain level)."""
    cfg = rec(kind, env=POMDP, learner={"batch_size": 256, "minibatches": 1, "backend": backend})
    learner, _, frags = collect(cfg, rollouts=4)
    assert learner.backend == backend
    assert sum(f.truncated.sum() for f in frags) >= 4 and (successors(frags) >= 0).sum() == 12
    perturbed(learner, 0.3)
    adv, _ = learner.advantages(frags)
    ref = numpy_gae(learner, frags)
    values = learner._targets(learner._batch(frags))[2]
    for i, (v, a) in ref.items():
        np.testing.assert_allclose(values[:, i].numpy(), v, atol=2e-5)
        np.testing.assert_allclose(adv[:, i].numpy(), a, atol=1e-4)


def test_kl_adaptive_measures_the_update_from_the_states_the_update_started_from():
    cfg = rec(env=POMDP, learner={"batch_size": 256, "minibatches": 2, "lr_schedule": "kl_adaptive",
                                  "kl_target": 0.01, "lr": 0.003})
    learner, _, frags = collect(cfg, rollouts=5)
    frags = frags[4:]
    perturbed(learner, 0.3)
    b = learner._batch(frags)
    _, _, _, start_logp, init = learner._recurrent_pass(b)
    m = learner.update(frags)
    with torch.no_grad():
        obs = b.obs.view((b.T, b.N) + learner.spec.obs_shape)
        h = learner.model.output(slow_states(learner.model, obs, init, b.dones.numpy())).flatten(0, 1)
        now = learner.model.logp_entropy_of(h, b.actions)[0]
    from laglab import algo
    assert m["learner/update_kl"] == pytest.approx(float(algo.approx_kl_k3(now, start_logp.reshape(-1))), rel=1e-3)


def test_the_ewma_proximal_policy_runs_along_the_chains_from_its_own_states():
    cfg = rec(env=POMDP, algo={"loss": {"kind": "decoupled", "prox": "ewma"}},
              learner={"batch_size": 256, "minibatches": 1})
    learner, _, frags = collect(cfg, rollouts=4)
    perturbed(learner, 0.3)
    perturbed(learner, 0.3, seed=2, model=learner.prox_model)
    b = learner._batch(frags)
    extras = {}
    learner._targets(b, extras)
    prox_init = learner._recurrent_pass(b, learner.prox_model)[4]
    joined = chain_heights(b.succ) > 0
    assert not torch.allclose(prox_init[joined], extras["init"][joined], atol=1e-4)
    keep = torch.ones((b.T, b.N), dtype=torch.bool)
    pos = {"pos": torch.arange(b.T * b.N)}
    [(rows, _, _, _, prox)] = list(learner._minibatches(b, extras["init"], keep, True, None, prox_init, pos))
    idx = rows["pos"]
    ref = slow_minibatch(learner, frags, prox_init, keep.numpy(), model=learner.prox_model)[0]
    torch.testing.assert_close(prox[torch.argsort(idx)], ref.detach(), atol=1e-5, rtol=1e-5)
    learner.update(frags)  # (and an update runs with it)


def test_a_recurrent_checkpoint_does_not_fit_a_feed_forward_run_nor_another_core(tmp_path):
    from laglab.learner import read_checkpoint

    cfg = rec(total_env_steps=512, learner={"batch_size": 256, "minibatches": 2})
    spec = env_spec(cfg)
    path = Learner(cfg, spec).save_checkpoint(tmp_path / "c.pt")
    read_checkpoint(path, cfg, spec)
    for other in (cfg_of(total_env_steps=512, learner={"batch_size": 256, "minibatches": 2}),
                  rec("lstm", total_env_steps=512, learner={"batch_size": 256, "minibatches": 2}),
                  rec(total_env_steps=512, policy={"hidden": 16}, learner={"batch_size": 256, "minibatches": 2})):
        with pytest.raises(ConfigError, match="policy"):
            read_checkpoint(path, other, spec)


def test_recurrent_fragments_cross_shared_memory_slots_and_rays_wire_form():
    from laglab.runners.ray_actor import from_wire, to_wire
    from laglab.shm import FragmentLayout, SlotPool, new_token, segment_name

    cfg = rec("lstm")
    spec = env_spec(cfg)
    _, _, frags = collect(cfg, rollouts=2, actor_id=1)
    f = next(f for f in frags if f.state.any() and f.final_state.any())
    w = from_wire(to_wire(f))
    np.testing.assert_array_equal(w.state, f.state)
    np.testing.assert_array_equal(w.final_state, f.final_state)
    pool = SlotPool(FragmentLayout(spec, 16, policy_state_shape(cfg.policy)), actors=2, per_actor=2,
                    name=segment_name(new_token(), "t"), create_new=True)
    try:
        slot = pool.free_slot(1)
        g = pool.read(slot, f.id, pool.write(slot, f))
        np.testing.assert_array_equal(g.state, f.state)
        np.testing.assert_array_equal(g.final_state, f.final_state)
        assert not g.state.flags.writeable
    finally:
        pool.close(unlink=True)


@pytest.mark.parametrize("runner", ALL)
def test_a_recurrent_tagged_run_audits_clean_and_balances_its_books_on_each_runner(tmp_path, runner):
    cfg = on(runner, policy={"recurrent": "gru", "hidden": 8}, learner={"burn_in": 4})
    s = run(cfg, tmp_path / runner)
    t = s["transport"]
    assert s["status"] == "completed" and balanced(t)
    assert t["misattributed"] == 0 and sum(t["rejected"].values()) == 0 and t["admitted"] > 0


def test_a_recurrent_run_resumes_and_evaluates(tmp_path):
    from laglab.evaluate import find_checkpoint, load_policy, play

    over = dict(env={"id": "laglab/CartPolePOMDP-v0"}, total_env_steps=4096, actors=1, runner={"name": "sync"},
                policy={"recurrent": "lstm", "hidden": 16}, learner={"batch_size": 512, "minibatches": 4})
    s = run(rec(**over), tmp_path / "a")
    assert s["status"] == "completed"
    cfg = rec(**over)
    policy, snap, _ = load_policy(find_checkpoint(tmp_path / "a", "auto"), cfg, env_spec(cfg))
    assert policy.recurrent == "lstm"
    for mode in ("sample", "deterministic"):
        assert play(cfg, policy, snap, 2, mode).summary()["episodes"] == 2
    r = run(rec(**{**over, "total_env_steps": 8192, "resume": str(tmp_path / "a")}), tmp_path / "b")
    assert r["status"] == "completed" and r["env_steps"] == 8192 and r["policy_version"] > s["policy_version"]


@pytest.mark.parametrize("runner", ["sync", "process"])
def test_chaos_on_a_recurrent_policy_corrupts_states_and_admission_refuses_each_as_state(tmp_path, runner):
    from laglab.chaos import EXPECTED_REASON

    cfg = on(runner, policy={"recurrent": "gru", "hidden": 8}, total_env_steps=16384, chaos={"corrupt_p": 0.3})
    s = run(cfg, tmp_path / runner)
    t, c = s["transport"], s["chaos"]
    assert c["corrupted_steps"].get("state", 0) > 0
    assert {EXPECTED_REASON[k]: n for k, n in c["corrupted_steps"].items()} == t["rejected"]
    assert balanced(t) and t["misattributed"] == 0


def test_the_size_check_counts_the_states():
    from laglab.checks import fragment_bytes

    cfg = rec("lstm")
    _, _, frags = collect(cfg, rollouts=1)
    S = policy_state_shape(cfg.policy)
    f = next(f for f in frags if len(f.trunc_obs) == 0)
    assert fragment_bytes(env_spec(cfg), 16, 0, S) == f.nbytes
    assert fragment_bytes(env_spec(cfg), 16, 0) == f.nbytes - 2 * 4 * int(np.prod(S))
