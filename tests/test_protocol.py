"""The transport protocol on the tagged env with scripted faults: admission, duplicates, reordering, loss,
restarts, overflow policies under a stalled learner, exact accounting, resume. Deterministic where the
runner is (sync); the end-to-end tests run on every runner that can show the behavior (sync, thread, process)
and assert only what holds for every interleaving."""
import dataclasses

import numpy as np
import torch
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from omegaconf import OmegaConf

from laglab.actor import Actor
from laglab.admission import Admission, validate
from laglab.chaos import CORRUPTIONS, EXPECTED_REASON, corrupt
from laglab.config import Config, Duplicates, validate as validate_cfg
from laglab.accounting import DUPLICATE, FIRST, TOO_OLD, UNATTRIBUTED, Ledger
from laglab.admission import claimed_steps
from laglab.learner import Learner
from laglab.run import env_spec, run
from laglab.runners.supervisor import ActorFailed
from laglab.tagged import TAGGED_ID, audit_tags


def cfg_of(**over) -> Config:
    small = {"actors": 2, "total_env_steps": 8192, "env": {"id": TAGGED_ID},
             "actor": {"envs_per_actor": 4, "rollout_len": 16},
             "learner": {"batch_size": 256, "minibatches": 2, "epochs": 2},
             "tracking": {"console_every_s": 1e9, "wandb": {"mode": "disabled"}},
             "runner": {"heartbeat_timeout_s": 60.0, "restart_backoff_s": 0.01}}
    return validate_cfg(OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.create(small), OmegaConf.create(over)))


def balanced(t):
    """The identity, recomputed from the summary's parts, and the books closed at every update too."""
    return (t["produced"] == t["admitted"] + sum(t["dropped"].values()) + sum(t["rejected"].values()) + t["in_flight"]
            and t["unaccounted"] == 0 and t["worst_unaccounted_at_update"] == 0 and t["balanced"])


def ledger_for(frags, window=64):
    """A ledger whose stream owners and sent watermarks cover ``frags`` (all from actor 1, incarnation 7)."""
    led = Ledger(16, 4, window, allocate=lambda: 7)
    led.new_incarnation(1)
    for f in frags:
        led.produced_rollout(f.length)
        led.sent(f.id.incarnation, f.id.env_index, f.id.t_end, f.length)
    return led


@pytest.fixture(scope="module")
def tagged_fragments():
    cfg = cfg_of()
    actor = Actor(cfg, 1, 7)
    actor.load(Learner(cfg, env_spec(cfg)).snapshot())
    frags = actor.collect().fragments + actor.collect().fragments
    return cfg, env_spec(cfg), frags


# ---- admission ---------------------------------------------------------------------------------------------
def test_valid_fragments_pass_and_each_corruption_is_rejected_with_its_reason(tagged_fragments):
    cfg, spec, frags = tagged_fragments
    for f in frags:
        assert validate(f, spec, 2, 4, learner_version=0) is None
    for kind in CORRUPTIONS:
        assert validate(corrupt(frags[0], kind), spec, 2, 4, 0) == EXPECTED_REASON[kind]


@pytest.mark.parametrize("mutate,reason", [
    (lambda f: dataclasses.replace(f, id=dataclasses.replace(f.id, behavior_version=5)), "future_version"),
    (lambda f: dataclasses.replace(f, id=dataclasses.replace(f.id, actor_id=9)), "identity"),
    (lambda f: dataclasses.replace(f, id=dataclasses.replace(f.id, env_index=4)), "identity"),
    (lambda f: dataclasses.replace(f, id=dataclasses.replace(f.id, t_end=f.id.t_end + 1)), "length"),
    (lambda f: dataclasses.replace(f, rewards=f.rewards[:-1]), "length"),
    (lambda f: dataclasses.replace(f, actions=f.actions.astype(np.float32)), "shape"),
    (lambda f: dataclasses.replace(f, last_obs=f.last_obs[:2]), "shape"),
    (lambda f: dataclasses.replace(f, values=np.where(np.arange(16) == 3, np.inf, f.values).astype(np.float32)),
     "non_finite"),
    (lambda f: dataclasses.replace(f, logp=np.full(16, np.nan, np.float32)), "logp"),
    (lambda f: dataclasses.replace(f, actions=np.full(16, 2, np.int64)), "action"),
    (lambda f: dataclasses.replace(f, terminated=np.ones(16, bool), truncated=np.ones(16, bool)), "flags"),
    (lambda f: dataclasses.replace(f, trunc_obs=np.zeros((1, 4), np.float32)), "flags"),
    (lambda f: dataclasses.replace(f, trunc_obs=np.zeros((0, 3), np.float32)), "shape"),
    (lambda f: dataclasses.replace(f, terminated=f.terminated.astype(np.int8)), "flags"),
    (lambda f: dataclasses.replace(f, obs=None), "length"),
])
def test_admission_names_each_kind_of_bad_input(tagged_fragments, mutate, reason):
    cfg, spec, frags = tagged_fragments
    f = frags[0] if not frags[0].truncated.any() else frags[1]
    adm = Admission(spec, 2, 4, Duplicates.ignore)
    bad = mutate(f)
    assert adm.admit(bad, True, learner_version=0) == reason
    assert adm.stats.rejected == {reason: bad.id.length} and adm.stats.admitted_steps == 0  # counted as claimed


def test_non_finite_final_observations_are_refused(tagged_fragments):
    # the bootstrap observation (last_obs) and the final observation of a truncated step (trunc_obs) are fed to
    # the learner's critic like obs: a NaN or Inf in either is refused as non_finite, with the right dtype and
    # shape (a float64 array of NaNs is refused as shape before finiteness is looked at)
    _, spec, frags = tagged_fragments
    f = next(f for f in frags if not f.truncated.any())
    nan_last = f.last_obs.copy()
    nan_last[0] = np.nan
    truncated = np.zeros_like(f.truncated)
    truncated[np.flatnonzero(~f.terminated)[0]] = True  # one truncated step, one final observation: well-formed
    final = f.last_obs[None].copy()  # as long as it is finite
    assert validate(dataclasses.replace(f, truncated=truncated, trunc_obs=final), spec, 2, 4, 0) is None
    inf_final = final.copy()
    inf_final[0, -1] = np.inf
    for bad in (dataclasses.replace(f, last_obs=nan_last),
                dataclasses.replace(f, truncated=truncated, trunc_obs=inf_final)):
        assert bad.last_obs.dtype == bad.trunc_obs.dtype == np.float32
        adm = Admission(spec, 2, 4, Duplicates.ignore)
        assert adm.admit(bad, True, learner_version=0) == "non_finite"
        assert adm.stats.rejected == {"non_finite": 16} and adm.stats.admitted_steps == 0


def test_duplicates_ignore_admits_once_charge_admits_again(tagged_fragments):
    _, spec, frags = tagged_fragments
    ign = Admission(spec, 2, 4, Duplicates.ignore)
    assert [ign.admit(frags[0], True, 0), ign.admit(frags[0], False, 0), ign.admit(frags[1], True, 0)] == \
        [None, "duplicate", None]
    assert ign.stats.duplicates_refused == 1 and ign.stats.admitted_steps == 32
    chg = Admission(spec, 2, 4, Duplicates.charge)
    assert [chg.admit(frags[0], True, 0), chg.admit(frags[0], False, 0)] == [None, "charged"]
    assert chg.stats.duplicate_steps_admitted == 16 and chg.stats.admitted_steps == 16
    bad = corrupt(frags[2], "nan")
    assert [chg.admit(bad, True, 0), chg.admit(bad, False, 0)] == ["non_finite", "duplicate"]  # rejected once
    assert chg.stats.rejected == {"non_finite": 16}


def test_arrivals_are_classified_by_stream_and_the_seen_set_is_bounded(tagged_fragments):
    _, _, frags = tagged_fragments
    led = ledger_for(frags, window=1)
    a, b = frags[0], frags[4]  # same env instance, consecutive rollouts
    assert (a.id.env_index, b.id.t_start) == (b.id.env_index, a.id.t_end + 1)
    for f, want in [(a, FIRST), (a, DUPLICATE), (b, FIRST), (a, TOO_OLD)]:
        cls = led.classify(f)
        led.arrive(f, cls)
        assert cls == want  # a is forgotten once b arrives (window 1): refused rather than risk a double
    assert led.duplicates == 1 and led.too_old == 1
    assert all(len(s.order) <= 1 for s in led.streams.values())
    # an arrival no stream sent cannot be attributed: another incarnation, a misaligned or unsent interval
    for bogus in (dataclasses.replace(a.id, incarnation=8), dataclasses.replace(a.id, actor_id=0),
                  dataclasses.replace(a.id, t_start=a.id.t_start + 1, t_end=a.id.t_end + 1),
                  dataclasses.replace(a.id, t_start=64, t_end=79)):
        assert led.classify(dataclasses.replace(a, id=bogus)) == UNATTRIBUTED


def test_too_old_uses_the_largest_forgotten_timestep(tagged_fragments):
    _, _, frags = tagged_fragments
    a, b = frags[0], frags[4]
    c = _shift(frags[4], 16)
    led = ledger_for(frags + [c], window=1)
    for f in (b, a, c):  # reordered: b (t=16) arrives before a (t=0); c forgets a, and b was forgotten before
        led.arrive(f, led.classify(f))
    assert led.classify(b) == TOO_OLD  # a late re-delivery of b is not taken for a first copy


def test_loss_is_detected_from_watermarks_not_from_whoever_lost_it(tagged_fragments):
    _, _, frags = tagged_fragments
    led = ledger_for(frags)  # 8 fragments sent (128 steps)
    for f in frags[:5]:
        led.arrive(f, led.classify(f))
    held = frags[5:7]  # still on the link
    assert led.link_steps(held) == 32 and led.lost(led.link_steps(held)) == 16  # frags[7] never arrived
    assert led.gaps() == {(7, 1): 16, (7, 2): 16, (7, 3): 16}
    led.arrive(frags[5], led.classify(frags[5]))  # a late arrival is no longer counted as on the link
    assert led.link_steps(held) == 16 and led.lost(led.link_steps(held)) == 16


def test_fragments_of_another_length_than_the_rollout_are_refused(tagged_fragments):
    _, spec, frags = tagged_fragments
    f = _join(frags[0], frags[4])  # self-consistent, 32 steps
    assert validate(f, spec, 2, 4, 0) is None
    assert Admission(spec, 2, 4, Duplicates.ignore, rollout_len=16).admit(f, True, 0) == "length"


def _shift(f, dt):
    return dataclasses.replace(f, id=dataclasses.replace(f.id, t_start=f.id.t_start + dt, t_end=f.id.t_end + dt))


_mutations = st.sampled_from(["obs", "actions", "rewards", "terminated", "truncated", "logp", "values", "disc_return",
                              "trunc_obs", "last_obs"])
_junk = st.one_of(
    st.just(None), st.integers(-3, 3), st.floats(allow_nan=True, allow_infinity=True),
    st.builds(lambda n, v: np.full(n, v), st.integers(0, 20), st.floats(allow_nan=True, allow_infinity=True)),
    st.builds(lambda n, m: np.zeros((n, m), dtype=np.int8), st.integers(0, 20), st.integers(0, 5)),
    st.builds(lambda n: np.ones(n, dtype=bool), st.integers(0, 20)),
)
_header = st.sampled_from(["actor_id", "incarnation", "env_index", "episode_id", "episode_t0", "t_start", "t_end",
                           "behavior_version", "schema_version"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=_mutations, junk=_junk, hfield=_header, hval=st.integers(-5, 10**6), which=st.integers(0, 7))
def test_admission_fuzz_never_crashes_and_admits_only_well_formed(tagged_fragments, field, junk, hfield, hval, which):
    _, spec, frags = tagged_fragments
    f = dataclasses.replace(frags[which], **{field: junk})
    g = dataclasses.replace(frags[which], id=dataclasses.replace(frags[which].id, **{hfield: hval}))
    for cand in (f, g):
        adm = Admission(spec, 2, 4, Duplicates.ignore)
        reason = adm.admit(cand, True, learner_version=3)
        if reason is None:
            T = cand.id.t_end - cand.id.t_start + 1
            assert cand.obs.shape == (T,) + spec.obs_shape and np.isfinite(cand.obs).all()
            assert (cand.logp <= 0).all() and np.isfinite(cand.logp).all()
            assert cand.id.behavior_version <= 3 and 0 <= cand.id.actor_id < 2
            assert adm.stats.admitted_steps == T and not adm.stats.rejected
        else:  # refused exactly once, for the steps its header claims, and nothing admitted
            assert adm.stats.rejected == {reason: claimed_steps(cand)} and adm.stats.admitted_steps == 0


# ---- the tagged env and the audit --------------------------------------------------------------------------
def test_audit_catches_a_fragment_attributed_to_the_wrong_env_or_episode(tagged_fragments):
    _, _, frags = tagged_fragments
    f = frags[1]
    done = f.terminated | f.truncated
    inst = 1 * 4 + f.id.env_index
    assert audit_tags(f.obs, inst, f.id.episode_id, f.id.episode_t0, done) == 0
    assert audit_tags(f.obs, inst + 1, f.id.episode_id, f.id.episode_t0, done) == 16
    assert audit_tags(f.obs, inst, f.id.episode_id + 1, f.id.episode_t0, done) > 0
    g = frags[5]  # the next fragment of the same env: joining it to f's slot must be detectable
    assert audit_tags(g.obs, inst, f.id.episode_id, f.id.episode_t0, done) > 0


def test_tagged_env_is_learnable(tmp_path):
    s = run(cfg_of(runner={"name": "sync"}, total_env_steps=40_000, learner={"lr": 3e-3}), tmp_path)
    assert s["transport"]["misattributed"] == 0
    assert s["final_return_mean"] >= 20  # optimal 32; a uniform policy averages ~1


# ---- faults, end to end, on every runner ----------------------------------------------------------------------
TRANSIT = {"drop_p": 0.05, "duplicate_p": 0.1, "reorder_p": 0.1, "delay_p": 0.1, "delay_fragments": 3,
           "corrupt_p": 0.1}
ALL = ["sync", "thread", "process", "ray"]
ASYNC = ["thread", "process", "ray"]  # the runners whose actors can hang or outrun a stalled learner


def on(which: str, /, **over) -> Config:
    """``cfg_of`` on one runner ("process-forkserver": the process runner started through a fork server)."""
    name, _, method = which.partition("-")
    r = {"name": name, **over.pop("runner", {})}
    if method:
        r["start_method"] = method
    return cfg_of(runner=r, **over)


# the end-to-end protocol tests below also run on a recurrent policy acting under action masks (the masked tagged
# env): its fragments carry states and masks, its corruptions include a NaN state and a cleared mask entry
POLICIES = {"mlp": {}, "gru-masked": {"policy": {"recurrent": "gru", "hidden": 8},
                                      "env": {"id": TAGGED_ID, "kwargs": {"masked": True}}}}


@pytest.mark.parametrize("kind", list(POLICIES))
@pytest.mark.parametrize("runner", ALL + ["process-forkserver"])
def test_missing_duplicated_delayed_reordered_and_corrupt_fragments_are_all_accounted(tmp_path, runner, kind):
    s = run(on(runner, chaos={"name": "transit", **TRANSIT}, **POLICIES[kind]), tmp_path)
    t, c = s["transport"], s["chaos"]
    assert s["env_steps"] == 8192 and t["admitted"] > 0
    assert c["duplicated"] > 0 and c["reordered"] > 0 and c["delayed"] > 0 and c["dropped_steps"] > 0
    assert t["duplicates_detected"] == c["duplicated"]
    # detected by the receiving end from per-stream watermarks, compared with what the injector dropped
    assert t["dropped"].get("lost_in_transit", 0) == c["dropped_steps"] > 0
    assert {EXPECTED_REASON[k]: n for k, n in c["corrupted_steps"].items()} == t["rejected"]
    assert len(c["corrupted_steps"]) >= 3
    if kind != "mlp":  # (a NaN state and a cleared mask entry among them: each refused under its own name)
        assert t["rejected"].get("state", 0) > 0 and t["rejected"].get("mask", 0) > 0
    assert t["misattributed"] == 0
    assert balanced(t)


@pytest.mark.parametrize("runner", ["sync", "thread", "process"])
def test_charged_duplicates_are_trained_on_again_without_entering_the_books(tmp_path, runner):
    # duplicates=charge admits a re-delivery again, outside produced: the first copies alone must close the books
    s = run(on(runner, transport={"duplicates": "charge"}, chaos={"name": "dup", "duplicate_p": 0.25}), tmp_path)
    t, c = s["transport"], s["chaos"]
    assert t["duplicates_detected"] == c["duplicated"] > 0
    assert 0 < t["duplicate_steps_admitted"] <= 16 * c["duplicated"]  # charged (some may still be queued at the end)
    assert t["admitted"] <= t["produced"] and sum(t["coverage"].values()) <= t["produced"]
    assert balanced(t) and t["misattributed"] == 0


def test_sync_runner_with_faults_is_reproducible(tmp_path):
    a = run(cfg_of(runner={"name": "sync"}, chaos={"name": "transit", **TRANSIT}, seed=5), tmp_path / "a")
    b = run(cfg_of(runner={"name": "sync"}, chaos={"name": "transit", **TRANSIT}, seed=5), tmp_path / "b")
    assert a["chaos"] == b["chaos"] and a["transport"] == b["transport"]


@pytest.mark.parametrize("kind", list(POLICIES))
@pytest.mark.parametrize("runner", ALL)
def test_scripted_actor_restart_mid_episode(tmp_path, runner, kind):
    # (the process runner's kill is a real SIGKILL of the actor process, in the middle of sending a rollout)
    s = run(on(runner, runner={"actors_max_restarts": 50}, chaos={"name": "kill", "kill_every_steps": 1000},
               **POLICIES[kind]), tmp_path)
    t, c = s["transport"], s["chaos"]
    assert c["kills"] >= 2 and s["actor_restarts"] == c["kills"]
    assert t["dropped"]["actor_crash"] > 0  # the part of the rollout not sent when it crashed
    # what died on the dead actor's link is found by the watermarks, to the step
    assert t["dropped"].get("lost_in_transit", 0) == c["dropped_steps"] + c["lost_held_steps"]
    assert t["misattributed"] == 0  # nothing of a new incarnation was joined to the old one's episode
    assert balanced(t) and s["status"] == "completed"
    if runner in ("process", "ray"):  # the start-up: every slot's first env step (restarts later are not a start),
        su = s["startup"]  # and each actor process's CPU before its loop (laglab.sim --calibrate's start_cpu_s)
        assert su["first_env_step"] <= su["all_actors_stepping"], su
        stepped = [a for a in s["actors_stats"].values() if a["steps"]]  # (a last life may end before it steps)
        assert all(0 < a["start_cpu_s"] < 60 for a in stepped), s["actors_stats"]
        slots = s["startup_actors"]  # each slot's first env step (and on Ray its worker's birth and its actor built)
        assert len(slots["first_env_step"]) == s["actors"]
        assert min(slots["first_env_step"].values()) == pytest.approx(su["first_env_step"], abs=1e-3)
        if runner == "ray":  # (Ray's part of the start CPU, up to the worker taking up laglab's code, is less; it
            # holds Ray's own imports, over 0.05 s of CPU: a stamp at the interpreter's start would not)
            assert all(0.05 < a["boot_cpu_s"] < a["start_cpu_s"] for a in stepped), s["actors_stats"]
            board = t["queue"]["board"]  # the snapshot board's work since its first snapshot (laglab.sim's
            # board_cpu_s): a call asks it once as it starts (no polls without actor.refresh_lag); calls of workers
            # killed before they asked, and flushes, it never saw
            assert 0 < board["answers"] <= t["queue"]["calls"] and board["polls"] == 0, board
            assert board["cpu_s"] > 0 and 0 < board["wall_s"] < s["wall_time_s"] and board["delay_s"] >= 0, board
            # the learner's own time posting each publication after the first (laglab.sim's publish_s): one per
            # update here (broadcast_every 1, no KL cap's extra publications), each a fraction of the run; the board
            # counts the posts it took (a board restarted by a kill counts from its own first)
            q = t["queue"]
            assert q["publishes"] == s["updates"] and 0 < q["publish_s"] < s["wall_time_s"], q
            assert 0 < board["sets"] <= q["publishes"], board
            for k in slots["first_env_step"]:
                assert slots["born"][k] < slots["booted"][k] < slots["built"][k] <= slots["first_env_step"][k], slots


@pytest.mark.parametrize("runner", ASYNC)
def test_hung_actor_is_detected_by_heartbeat_and_replaced(tmp_path, runner):
    s = run(on(runner, runner={"heartbeat_timeout_s": 1.0, "actors_max_restarts": 5},
               chaos={"name": "hang", "hang_every_steps": 2000}), tmp_path)
    t = s["transport"]
    assert s["chaos"]["hangs"] >= 1 and s["actor_restarts"] >= 1
    if runner == "ray":  # a hung call never reports its rollout: its budget is given back, nothing is in hand
        # (every scripted hang is detected, also one as the budget runs out; on an overloaded machine a slow call
        # may be taken for hung as well)
        assert s["chaos"]["hangs_detected"] >= s["chaos"]["hangs"] and s["actor_restarts"] == s["chaos"]["hangs_detected"]
        assert t["dropped"].get("abandoned", 0) == 0
    else:
        assert t["dropped"]["abandoned"] == 64 * s["chaos"]["hangs"]  # its whole rollout (4 envs x 16), untrained
    assert balanced(t) and t["misattributed"] == 0


@pytest.mark.parametrize("runner", ASYNC)
def test_an_actor_that_hangs_as_the_budget_runs_out_is_detected_too(tmp_path, runner):
    # one actor, its scripted hang at the run's last env step: the next thing it is asked (on Ray: to flush
    # what its link holds) is never answered, and the run sees that rather than ending with a hang it never noticed
    s = run(on(runner, actors=1, runner={"heartbeat_timeout_s": 1.0, "actors_max_restarts": 5},
               chaos={"name": "hang", "hang_every_steps": 8192}), tmp_path)
    assert s["env_steps"] == 8192 and s["chaos"]["hangs"] == 1
    # (>=: on an overloaded machine a slow call may be taken for hung as well; before, Ray detected none)
    if runner == "ray":
        assert s["chaos"]["hangs_detected"] >= 1 and s["actor_restarts"] == s["chaos"]["hangs_detected"]
    else:
        assert s["transport"]["dropped"]["abandoned"] >= 64 and s["actor_restarts"] >= 1
    assert balanced(s["transport"])


@pytest.mark.parametrize("runner", ALL)
def test_exhausted_restarts_end_the_run_with_a_clear_error(tmp_path, runner):
    with pytest.raises(ActorFailed, match="actors_max_restarts=1"):
        run(on(runner, runner={"actors_max_restarts": 1}, chaos={"name": "kill", "kill_every_steps": 64}), tmp_path)
    import json
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == "failed" and "actors_max_restarts" in s["error"]
    assert s["transport"]["unaccounted"] == 0  # the books up to the failure close too


@pytest.mark.parametrize("runner", ASYNC)
@pytest.mark.parametrize("policy", ["block", "reject", "drop_oldest"])
def test_queue_policies_under_a_stalled_learner(tmp_path, policy, runner):
    cfg = on(runner, transport={"capacity": 6, "policy": policy}, total_env_steps=4096,
             chaos={"name": "stall", "stall_every_updates": 1, "stall_s": 0.3})
    s = run(cfg, tmp_path)
    t = s["transport"]
    assert t["queue"]["max_depth"] <= 6 and t["queue"]["max_bytes"] <= t["queue"]["max_bytes_bound"]
    assert balanced(t) and s["chaos"]["stalls"] >= 1
    if policy == "block":
        assert t["queue"]["blocked_s"] > 0 and "overflow" not in t["dropped"] and "overflow" not in t["rejected"]
    elif policy == "reject":
        assert t["rejected"]["overflow"] > 0 and "overflow" not in t["dropped"]
    else:
        assert t["dropped"]["overflow"] > 0 and "overflow" not in t["rejected"]


@pytest.mark.parametrize("kind", list(POLICIES))
@pytest.mark.parametrize("runner", ALL)
def test_resume_continues_the_version_sequence(tmp_path, runner, kind):
    a = run(on(runner, learner={"checkpoint_every": 2}, **POLICIES[kind]), tmp_path / "a")
    b = run(on(runner, resume=str(tmp_path / "a"), total_env_steps=16384, **POLICIES[kind]), tmp_path / "b")
    assert b["start_version"] == a["policy_version"] == a["updates"] and b["start_env_steps"] == a["env_steps"]
    df = pd.read_parquet(tmp_path / "b" / "metrics.parquet")
    assert df["learner/version"].iloc[0] == a["policy_version"] + 1
    assert df["env_steps"].iloc[0] > a["env_steps"] and b["env_steps"] <= 16384
    assert b["policy_version"] == b["updates"] == a["policy_version"] + len(df)  # counters carried over
    assert (tmp_path / "a" / "checkpoints" / "latest.pt").exists()
    assert balanced(b["transport"])


# ---- reassembly --------------------------------------------------------------------------------------------
from laglab.fragment import chain_depths, successors  # noqa: E402


def _join(a, b):
    cat = lambda n: np.concatenate([getattr(a, n), getattr(b, n)])  # noqa: E731
    fid = dataclasses.replace(a.id, t_end=b.id.t_end)
    return dataclasses.replace(a, id=fid, obs=cat("obs"), actions=cat("actions"), rewards=cat("rewards"),
                               terminated=cat("terminated"), truncated=cat("truncated"), logp=cat("logp"),
                               values=cat("values"), trunc_obs=cat("trunc_obs"), disc_return=cat("disc_return"),
                               last_obs=b.last_obs)


def test_successors_need_proof_of_adjacency(tagged_fragments):
    _, _, frags = tagged_fragments  # two rollouts of 4 envs: frags[e] is continued by frags[4 + e]
    assert successors(frags).tolist() == [4, 5, 6, 7, -1, -1, -1, -1]
    assert chain_depths(successors(frags)).tolist() == [1, 1, 1, 1, 0, 0, 0, 0]
    # a restarted actor reuses its counters: same actor, env slot and t, new incarnation -> not a continuation
    reborn = dataclasses.replace(frags[4], id=dataclasses.replace(frags[4].id, incarnation=8))
    assert successors([frags[0], reborn]).tolist() == [-1, -1]
    # the next fragment of another env instance of the same actor proves nothing either
    assert successors([frags[0], frags[5]]).tolist() == [-1, -1]
    # an episode id that does not follow from the dones breaks the chain too
    wrong_ep = dataclasses.replace(frags[4], id=dataclasses.replace(frags[4].id, episode_id=frags[4].id.episode_id + 1))
    assert successors([frags[0], wrong_ep]).tolist() == [-1, -1]


def test_successors_never_join_across_a_time_gap(tagged_fragments):
    _, _, frags = tagged_fragments
    # the next fragment of frags[0]'s stream (same incarnation, env instance, actor, and the episode id its dones
    # lead to) but one rollout late: the rollout in between was lost, so nothing in the batch continues frags[0]
    gapped = _shift(frags[4], 16)
    assert gapped.id.t_start == frags[0].id.t_end + 1 + 16 and gapped.id.episode_id == frags[4].id.episode_id
    assert successors([frags[0], frags[4]]).tolist() == [1, -1]  # without the gap it is joined
    assert successors([frags[0], gapped]).tolist() == [-1, -1]
    assert successors([gapped, frags[0]]).tolist() == [-1, -1]
    # among the other envs' fragments, whose adjacent successors are still joined
    assert successors(frags[:4] + [gapped] + frags[5:]).tolist() == [-1, 5, 6, 7, -1, -1, -1, -1]


@pytest.mark.parametrize("estimator", ["gae", "vtrace"])
def test_chained_fragments_get_the_targets_of_one_long_sequence(tagged_fragments, estimator):
    cfg, spec, frags = tagged_fragments
    cfg = dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, advantage=dataclasses.replace(
        cfg.algo.advantage, estimator=estimator, lam=0.9, rho_bar=2.0, c_bar=1.0)))
    learner = Learner(cfg, spec)
    e = next(e for e in range(4) if not (frags[e].terminated | frags[e].truncated)[-1])  # a continues into b
    # behavior probabilities 0.9 and 0.15 against a near-uniform current policy: importance ratios of about
    # 0.55 and 3.3, so rho_bar=2 and c_bar=1 both clip and the traces are really cut
    far = lambda f: dataclasses.replace(  # noqa: E731
        f, logp=np.log(np.where(np.arange(16) % 2 == 0, 0.9, 0.15)).astype(np.float32))
    a, b = far(frags[e]), far(frags[4 + e])
    with torch.no_grad():
        cur = learner.model.logp_entropy(torch.from_numpy(a.obs.copy()), torch.from_numpy(a.actions.copy()))[0].numpy()
    ratios = np.exp(cur - a.logp)
    assert ratios.max() > 2.5 and ratios.min() < 0.6
    adv, ret = learner.advantages([b, a])  # order in the batch does not matter
    long_adv, long_ret = learner.advantages([_join(a, b)])
    np.testing.assert_allclose(adv[:, 1].numpy(), long_adv[:16, 0].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(adv[:, 0].numpy(), long_adv[16:, 0].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ret[:, 1].numpy(), long_ret[:16, 0].numpy(), rtol=1e-5, atol=1e-6)
    alone_adv, _ = learner.advantages([a])  # without its successor, a is bootstrapped from V(last obs)
    assert abs(float(alone_adv[-1, 0]) - float(long_adv[15, 0])) > 1e-6


@pytest.mark.parametrize("runner", ASYNC)
@pytest.mark.parametrize("policy", ["reject", "drop_oldest"])
def test_duplicates_discarded_by_the_queue_are_not_counted_as_lost_data(tmp_path, policy, runner):
    # the first delivery of a fragment decides its fate; an evicted or refused re-delivery is a duplicate
    cfg = on(runner, transport={"capacity": 4, "policy": policy},
                 chaos={"name": "dup", "duplicate_p": 0.5, "stall_every_updates": 2, "stall_s": 0.2})
    s = run(cfg, tmp_path)
    t, c = s["transport"], s["chaos"]
    assert t["duplicates_detected"] == c["duplicated"] > 0
    assert t["dropped"].get("overflow", 0) + t["rejected"].get("overflow", 0) > 0
    assert balanced(t)


@pytest.mark.parametrize("runner,seed", [("thread", 15), ("thread", 16), ("thread", 17), ("thread", 19),
                                         ("process", 15), ("process", 16), ("ray", 15)])
def test_lossy_transport_and_tight_throttle_never_starve_the_learner(tmp_path, runner, seed):
    # 20% of fragments lost or refused, each actor at most two rollouts ahead: without credit grants (and
    # with actors waiting for credit after the budget is spent) these seeds stopped with "no data" errors
    s = run(on(runner, seed=seed, actors=4, total_env_steps=6000, actor={"envs_per_actor": 2, "rollout_len": 16,
                                                                      "max_lead_steps": 64},
                   learner={"batch_size": 128, "minibatches": 2, "epochs": 1},
                   chaos={"name": "lossy", "drop_p": 0.1, "corrupt_p": 0.1},
                   # (a starved learner waits out the timeout; Ray's actors alone can take longer than 5 s to
                   # start on a loaded two-core machine: CI saw it once at load 15)
                   runner={"actor_timeout_s": 20.0 if runner == "ray" else 5.0}),
            tmp_path)
    assert s["status"] == "completed" and s["transport"]["balanced"]
    assert s["env_steps"] > 6000 - 4 * 32  # the actors used the budget rather than waiting forever
