"""Admission at the edges of each rule, on fragments built by hand (discrete and continuous): the last valid
value of each header field and the first invalid one, and the counters each outcome moves."""
import dataclasses

import numpy as np
import pytest

from laglab.admission import Admission, claimed_steps, validate
from laglab.config import Duplicates
from laglab.envs import EnvSpec
from laglab.fragment import Fragment, FragmentId

DISCRETE = EnvSpec((3,), True, 2)
BOX = EnvSpec((3,), False, 2, np.full(2, -1, np.float32), np.full(2, 1, np.float32))
T = 4


def frag(spec=DISCRETE, **header):
    h = dict(actor_id=1, incarnation=0, env_index=3, episode_id=0, episode_t0=0, t_start=0, t_end=T - 1,
             behavior_version=2)
    h.update(header)
    n = h["t_end"] - h["t_start"] + 1
    cont = {} if spec.discrete else dict(mean=np.zeros((n, 2), np.float32), log_std=np.zeros((n, 2), np.float32))
    return Fragment(id=FragmentId(**h), obs=np.zeros((n, 3), np.float32),
                    actions=np.ones(n, np.int64) if spec.discrete else np.zeros((n, 2), np.float32),
                    rewards=np.ones(n, np.float32), terminated=np.zeros(n, bool), truncated=np.zeros(n, bool),
                    logp=np.zeros(n, np.float32), values=np.zeros(n, np.float32),
                    trunc_obs=np.zeros((0, 3), np.float32), disc_return=np.zeros(n, np.float32),
                    last_obs=np.zeros(3, np.float32), **cont)


def check(f, spec=DISCRETE, version=2):
    return validate(f, spec, 2, 4, learner_version=version)  # actors 0..1, env instances 0..3


@pytest.mark.parametrize("spec", [DISCRETE, BOX])
def test_the_last_valid_value_of_each_field_passes(spec):
    assert check(frag(spec), spec) is None
    assert check(frag(spec, actor_id=0, env_index=0), spec) is None
    assert check(frag(spec, t_start=5, t_end=5, episode_t0=0), spec) is None  # one step long
    assert check(frag(spec), spec, version=2) is None  # behavior version equal to the learner's


@pytest.mark.parametrize("header,reason", [
    (dict(actor_id=2), "identity"), (dict(actor_id=-1), "identity"),
    (dict(env_index=4), "identity"), (dict(env_index=-1), "identity"),
    (dict(incarnation=-1), "identity"), (dict(episode_id=-1), "identity"), (dict(episode_t0=-1), "identity"),
    (dict(t_start=-1, t_end=2), "identity"),
    (dict(behavior_version=3), "future_version"),
    (dict(schema_version=1), "schema"),
])
def test_the_first_invalid_value_of_each_field_is_refused(header, reason):
    assert check(frag(**header)) == reason


def test_an_interval_that_ends_before_it_starts_is_refused():
    f = frag()
    assert check(dataclasses.replace(f, id=dataclasses.replace(f.id, t_start=4, t_end=3))) == "identity"


def test_discrete_rules():
    f = frag()
    assert check(dataclasses.replace(f, actions=np.array([0, 1, 1, 0], np.int64))) is None
    assert check(dataclasses.replace(f, actions=np.array([0, 1, 2, 0], np.int64))) == "action"  # n_actions = 2
    assert check(dataclasses.replace(f, actions=np.array([0, -1, 1, 0], np.int64))) == "action"
    assert check(dataclasses.replace(f, actions=np.ones(T, np.int32))) == "shape"
    assert check(dataclasses.replace(f, actions=np.ones((T, 1), np.int64))) == "shape"
    assert check(dataclasses.replace(f, logp=np.array([0.0, -1.0, -2.0, -0.1], np.float32))) is None  # p = 1 is fine
    assert check(dataclasses.replace(f, logp=np.array([0.0, 1e-3, -2.0, -0.1], np.float32))) == "logp"


def test_continuous_rules():
    f = frag(BOX)
    ok = lambda g: check(g, BOX)  # noqa: E731
    assert ok(dataclasses.replace(f, logp=np.full(T, 3.0, np.float32))) is None  # a density may exceed 1
    assert ok(dataclasses.replace(f, actions=np.zeros((T, 3), np.float32))) == "shape"
    assert ok(dataclasses.replace(f, actions=np.zeros((T, 2), np.float64))) == "shape"
    assert ok(dataclasses.replace(f, mean=None)) == "shape"
    assert ok(dataclasses.replace(f, log_std=None)) == "shape"
    assert ok(dataclasses.replace(f, mean=np.zeros((T, 1), np.float32))) == "shape"
    assert ok(dataclasses.replace(f, log_std=np.zeros((T, 1), np.float32))) == "shape"
    inf = np.zeros((T, 2), np.float32)
    inf[1, 1] = np.inf
    for name in ("actions", "mean", "log_std"):
        assert ok(dataclasses.replace(f, **{name: inf})) == "action"
    assert ok(dataclasses.replace(f, logp=np.full(T, np.nan, np.float32))) == "logp"


@pytest.mark.parametrize("name,bad", [
    ("obs", np.zeros((T, 3), np.float64)), ("obs", np.zeros((T, 4), np.float32)),
    ("last_obs", np.zeros(3, np.float64)), ("last_obs", [0.0, 0.0, 0.0]),
    ("trunc_obs", np.zeros((0, 3), np.float64)), ("trunc_obs", np.zeros(3, np.float32)),
    ("trunc_obs", np.zeros((0, 4), np.float32)), ("trunc_obs", None),
    ("rewards", np.ones(T, np.float64)), ("values", np.zeros((T, 1), np.float32)),
    ("disc_return", np.zeros(T, np.float64)),
    ("logp", np.zeros(T, np.float64)), ("logp", np.zeros((T, 1), np.float32)),
    ("terminated", np.zeros((T, 1), bool)), ("truncated", np.zeros((T, 1), bool)),
])
def test_each_array_of_the_wrong_shape_or_dtype_is_refused_as_shape(name, bad):
    assert check(dataclasses.replace(frag(), **{name: bad})) == "shape"


@pytest.mark.parametrize("name", ["obs", "rewards", "values", "disc_return"])
def test_non_finite_arrays_are_refused(name):
    f = frag()
    a = getattr(f, name).copy()
    a.reshape(-1)[-1] = np.nan
    assert check(dataclasses.replace(f, **{name: a})) == "non_finite"


def test_flags():
    f = frag()
    trunc = np.array([False, True, False, False])
    assert check(dataclasses.replace(f, truncated=trunc, trunc_obs=np.zeros((1, 3), np.float32))) is None
    assert check(dataclasses.replace(f, truncated=trunc)) == "flags"  # no final observation for it
    assert check(dataclasses.replace(f, truncated=trunc.astype(np.uint8),
                                     trunc_obs=np.zeros((1, 3), np.float32))) == "flags"
    assert check(dataclasses.replace(f, terminated=trunc, truncated=trunc,
                                     trunc_obs=np.zeros((1, 3), np.float32))) == "flags"


def test_counters_of_each_outcome():
    f, g = frag(), frag(t_start=4, t_end=7)
    adm = Admission(DISCRETE, 2, 4, Duplicates.charge, rollout_len=T)
    assert adm.admit(f, True, 2) is None and adm.admit(g, True, 2) is None
    st = adm.stats
    assert (st.admitted_fragments, st.admitted_steps, st.bytes_admitted) == (2, 8, f.nbytes + g.nbytes)
    assert adm.admit(f, False, 2) == "charged"
    assert (st.admitted_fragments, st.admitted_steps, st.duplicate_steps_admitted) == (3, 8, 4)
    assert st.bytes_admitted == 2 * f.nbytes + g.nbytes and st.duplicates_refused == 0
    assert adm.admit(frag(actor_id=7), None, 2) == "identity" and st.unattributed == 4
    assert adm.admit(f, None, 2) == "unattributed" and st.unattributed == 8
    long = frag(t_start=0, t_end=7)
    assert adm.admit(long, True, 2) == "length" and st.rejected == {"length": 8}
    assert Admission(DISCRETE, 2, 4, Duplicates.ignore).admit(long, True, 2) is None  # no rollout length given
    assert st.admitted_fragments == 3 and st.duplicates_refused == 0
    ign = Admission(DISCRETE, 2, 4, Duplicates.ignore)
    assert ign.admit(f, False, 2) == "duplicate" and ign.stats.duplicates_refused == 1
    assert ign.stats.admitted_fragments == 0 and ign.stats.bytes_admitted == 0


def test_claimed_steps_of_a_broken_header_is_zero():
    assert claimed_steps(frag()) == T
    assert claimed_steps(dataclasses.replace(frag(), id=None)) == 0


@pytest.mark.parametrize("name,bad", [("rewards", np.ones(T - 1, np.float32)), ("obs", np.zeros((T + 1, 3), np.float32)),
                                      ("obs", None), ("logp", [0.0] * T), ("values", np.array(0.0, np.float32))])
def test_an_array_that_is_missing_or_of_another_length_than_the_interval_is_refused_as_length(name, bad):
    assert check(dataclasses.replace(frag(), **{name: bad})) == "length"


def test_a_record_too_broken_to_inspect_is_refused_as_malformed():
    assert check(dataclasses.replace(frag(), id=None)) == "malformed"


MASKED = EnvSpec((3,), True, 3, masked=True)


def masked(actions=(1, 1, 1, 1), masks=None):
    f = frag(MASKED)
    masks = np.ones((T, 3), bool) if masks is None else masks
    return dataclasses.replace(f, actions=np.array(actions, np.int64), masks=masks)


def test_mask_rules_at_their_edges():
    ok = lambda g: check(g, MASKED)  # noqa: E731
    assert ok(masked()) is None
    only_taken = np.zeros((T, 3), bool)
    only_taken[np.arange(T), [0, 2, 1, 2]] = True
    assert ok(masked((0, 2, 1, 2), only_taken)) is None  # the first and the last action, each the only legal one
    forbidden = only_taken.copy()
    forbidden[3] = [True, True, False]  # step 3 has legal actions, just not the one taken
    assert ok(masked((0, 2, 1, 2), forbidden)) == "mask"
    none_legal = only_taken.copy()
    none_legal[1] = False
    assert ok(masked((0, 2, 1, 2), none_legal)) == "mask"
    assert ok(masked((0, 3, 1, 2))) == "action"  # n_actions = 3: checked before the mask is indexed with it
    assert ok(masked((0, -1, 1, 2))) == "action"
    first_only = np.zeros((T, 3), bool)
    first_only[:, 0] = True
    assert ok(masked((0, -1, 0, 0), first_only)) == "action"  # (as an index, -1 would read the last action's entry)
    assert ok(dataclasses.replace(masked(), masks=None)) == "shape"  # a masked env's fragment without masks
    assert ok(masked(masks=np.ones((T, 3), np.uint8))) == "shape"
    assert ok(masked(masks=np.ones((T, 2), bool))) == "shape"
    assert ok(masked(masks=np.ones((T - 1, 3), bool))) == "shape"
    assert ok(masked(masks=np.ones(T * 3, bool))) == "shape"
    assert check(dataclasses.replace(frag(), masks=np.ones((T, 2), bool))) == "shape"  # masks on an unmasked env


STATE = (4,)  # a recurrent policy's state shape


def rec(episode_t0=0, state=None, final_state=None, **arrays):
    f = frag(episode_t0=episode_t0)
    return dataclasses.replace(f, state=np.zeros(STATE, np.float32) if state is None else state,
                               final_state=np.zeros(STATE, np.float32) if final_state is None else final_state,
                               **arrays)


def check_rec(f):
    return validate(f, DISCRETE, 2, 4, learner_version=2, state_shape=STATE)


def test_state_rules_at_their_edges():
    some = np.array([0.5, -1, 0, 2], np.float32)
    done_last = np.array([False, False, False, True])
    done_early = np.array([False, True, False, False])
    assert check_rec(rec()) is None  # an episode's start, from the zero state
    assert check_rec(rec(episode_t0=1, state=some, final_state=some)) is None  # mid-episode: any finite state
    assert check_rec(rec(state=some)) == "state"  # an episode starts from the zero state
    assert check_rec(rec(episode_t0=1, final_state=some, terminated=done_last)) == "state"  # so does the next one
    assert check_rec(rec(episode_t0=1, final_state=some, truncated=done_last)) == "state"
    assert check_rec(rec(episode_t0=1, final_state=some, terminated=done_early)) is None  # (a later episode goes on)
    assert check_rec(rec(episode_t0=1, terminated=done_last)) is None
    for bad in (np.zeros(STATE, np.float64), np.zeros((5,), np.float32), np.zeros((1, 4), np.float32), [0.0] * 4,
                np.array([0, np.nan, 0, 0], np.float32), np.array([0, 0, np.inf, 0], np.float32)):
        assert check_rec(rec(episode_t0=1, state=bad)) == "state", bad
        assert check_rec(rec(episode_t0=1, final_state=bad)) == "state", bad
    assert check_rec(dataclasses.replace(rec(), state=None)) == "state"
    assert check_rec(dataclasses.replace(rec(), final_state=None)) == "state"
    # a feed-forward run refuses a fragment that carries either state
    assert check(rec()) == "state"
    assert check(dataclasses.replace(rec(), state=None)) == "state"
    assert check(dataclasses.replace(rec(), final_state=None)) == "state"
