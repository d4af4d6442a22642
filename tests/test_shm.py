"""The process runner's shared memory on its own, in one process (no children): the slot layout of every kind of
fragment, slots and their partitions, the seqlocked block's versions and retries, the status rows, the shared
budget and its lock, and the sweep of segments left by killed runs. test_process and test_lifetime check the same
pieces across real processes, at many times the cost."""
import dataclasses
import fcntl
import os
import time

import numpy as np
import pytest

from laglab import shm
from laglab.envs import EnvSpec
from laglab.fragment import Fragment, FragmentId
from laglab.shm import (FragmentLayout, RunLife, SeqBlock, SharedCounter, SlotPool, StatusBlock, leftover_segments,
                        new_token, segment_name, sweep_stale)

T = 5
DISCRETE = EnvSpec((3,), True, 4)
MASKED = EnvSpec((3,), True, 4, masked=True)
BOX = EnvSpec((2, 3), False, 2, np.full(2, -1, np.float32), np.full(2, 1, np.float32))
STATE = (2, 8)  # an LSTM's (h, c) of 8 units


@pytest.fixture
def names():
    token = new_token()
    made = []

    def name(what):
        n = segment_name(token, what)
        made.append(n)
        return n
    yield name
    for n in made:
        try:
            os.unlink(os.path.join("/dev/shm", n))
        except FileNotFoundError:
            pass


def make_frag(spec, seed=0, k=2, state=None, t0=0):
    """A fragment whose every array holds distinct values (so a field read from the wrong offset shows)."""
    rng = np.random.default_rng(seed)
    obs = spec.obs_shape
    trunc = np.zeros(T, bool)
    trunc[[1, 3][:k]] = True
    f = dict(id=FragmentId(actor_id=1, incarnation=3, env_index=0, episode_id=0, episode_t0=0, t_start=t0,
                           t_end=t0 + T - 1, behavior_version=0),
             obs=rng.normal(size=(T,) + obs).astype(np.float32),
             actions=(rng.integers(0, spec.n_actions, T) if spec.discrete
                      else rng.normal(size=(T, spec.n_actions)).astype(np.float32)),
             rewards=rng.normal(size=T).astype(np.float32), terminated=np.eye(T, dtype=bool)[4], truncated=trunc,
             logp=-rng.random(T).astype(np.float32), values=rng.normal(size=T).astype(np.float32),
             trunc_obs=rng.normal(size=(k,) + obs).astype(np.float32), disc_return=rng.normal(size=T).astype(np.float32),
             last_obs=rng.normal(size=obs).astype(np.float32))
    if not spec.discrete:
        f.update(mean=rng.normal(size=(T, spec.n_actions)).astype(np.float32),
                 log_std=rng.normal(size=(T, spec.n_actions)).astype(np.float32))
    if spec.masked:
        f.update(masks=rng.random((T, spec.n_actions)) < 0.5)
    if state is not None:
        f.update(state=rng.normal(size=state).astype(np.float32), final_state=rng.normal(size=state).astype(np.float32))
    return Fragment(**f)


ARRAYS = ("obs", "actions", "rewards", "terminated", "truncated", "logp", "values", "trunc_obs", "disc_return",
          "last_obs", "mean", "log_std", "masks", "state", "final_state")


def same(a, b):
    for name in ARRAYS:
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.dtype == y.dtype and x.shape == y.shape, name
            np.testing.assert_array_equal(x, y, err_msg=name)


def test_names_say_whose_segment_it_is_and_tokens_are_fresh():
    a, b = new_token(), new_token()
    assert a != b and len(a) == 8 and set(a) <= set("0123456789abcdef")
    assert segment_name(a, "slots") == f"laglab-{os.getpid()}-{a}-slots"


@pytest.mark.parametrize("spec,state,extra", [(DISCRETE, None, set()), (BOX, None, {"mean", "log_std"}),
                                              (MASKED, None, {"masks"}), (DISCRETE, STATE, {"state", "final_state"})])
def test_a_layout_gives_each_array_its_own_aligned_room(spec, state, extra):
    lay = FragmentLayout(spec, T, state)
    base = {"obs", "actions", "rewards", "disc_return", "terminated", "truncated", "logp", "values", "trunc_obs",
            "last_obs"}
    assert {f.name for f in lay.fields} == base | extra
    end = 0
    for f in lay.fields:  # in order, each after the last one's end, on a 16-byte boundary
        assert f.offset % 16 == 0 and f.offset >= end
        end = f.offset + f.nbytes
    assert lay.slot_bytes % 64 == 0 and end <= lay.slot_bytes < end + 64
    by = {f.name: f for f in lay.fields}
    assert by["obs"].shape == (T,) + spec.obs_shape and by["obs"].nbytes == 4 * T * int(np.prod(spec.obs_shape))
    assert by["actions"].dtype == (np.int64 if spec.discrete else np.float32)
    assert by["trunc_obs"].shape == (T,) + spec.obs_shape and by["last_obs"].shape == spec.obs_shape
    if state is not None:
        assert by["state"].shape == state and by["final_state"].shape == state
    with pytest.raises(dataclasses.FrozenInstanceError):  # a layout is fixed once made (actors share it)
        lay.fields[0].offset = 0


@pytest.mark.parametrize("spec,state", [(DISCRETE, None), (BOX, None), (MASKED, None), (BOX, STATE)])
def test_every_kind_of_fragment_round_trips_through_a_slot_beside_its_neighbours(names, spec, state):
    pool = SlotPool(FragmentLayout(spec, T, state), actors=2, per_actor=3, name=names("slots"), create_new=True)
    try:
        frags = [make_frag(spec, seed=s, k=s % 3, state=state) for s in range(6)]
        for s, f in enumerate(frags):  # every slot written before any is read: no slot overlaps another
            assert pool.write(s, f) == len(f.trunc_obs)
        for s, f in enumerate(frags):
            g = pool.read(s, f.id, len(f.trunc_obs))
            same(g, f)
            assert g.id == f.id and not g.obs.flags.writeable
            v = pool.views(s)
            for name in ARRAYS:  # private copies: nothing read shares the slot's memory
                if getattr(g, name) is not None:
                    assert not np.shares_memory(getattr(g, name), v[name]), name
    finally:
        pool.close(unlink=True)


@pytest.mark.parametrize("extra", ["mean", "masks", "state"])
def test_arrays_the_layout_has_no_room_for_are_left_out_not_written_elsewhere(names, extra):
    spec = {"mean": BOX, "masks": MASKED, "state": DISCRETE}[extra]
    f = make_frag(spec, state=STATE if extra == "state" else None)
    plain = dataclasses.replace(f, **({"mean": None, "log_std": None} if extra == "mean" else
                                      {"state": None, "final_state": None} if extra == "state" else {"masks": None}))
    lay = FragmentLayout(dataclasses.replace(spec, masked=False) if extra == "masks" else spec, T)
    if extra == "mean":
        lay.fields = [x for x in lay.fields if x.name not in ("mean", "log_std")]
    pool = SlotPool(lay, 1, 1, names("slots"), True)
    try:
        pool.write(0, f)
        same(pool.read(0, f.id, 2), plain)
    finally:
        pool.close(unlink=True)


def test_each_slot_view_sits_inside_its_own_slot(names):
    """Where the views point, by address: slot s's field f starts at base + s * slot_bytes + f.offset, after the
    state bytes, and ends inside slot s (a wrong offset that a write and a read share would round-trip anyway)."""
    lay = FragmentLayout(BOX, T, STATE)
    pool = SlotPool(lay, actors=2, per_actor=2, name=names("slots"), create_new=True)
    try:
        start = np.frombuffer(pool.shm.buf, np.uint8).__array_interface__["data"][0]
        assert pool.state.__array_interface__["data"][0] == start and pool._base >= pool.n
        for s in range(pool.n):
            lo = start + pool._base + s * lay.slot_bytes
            for f in lay.fields:
                addr = pool.views(s)[f.name].__array_interface__["data"][0]
                assert addr == lo + f.offset and addr + f.nbytes <= lo + lay.slot_bytes, (s, f.name)
        assert pool._base + pool.n * lay.slot_bytes <= pool.shm.size
    finally:
        pool.close(unlink=True)


def test_a_reader_of_another_process_sees_what_was_written(names):
    """(``create_new=False`` attaches: the same bytes, nothing reset)"""
    lay = FragmentLayout(BOX, T)
    a = SlotPool(lay, 2, 2, names("slots"), True)
    b = SlotPool(lay, 2, 2, a.name, False)
    try:
        f = make_frag(BOX, seed=7)
        a.write(3, f)
        assert b.state[3] == 1
        same(b.read(3, f.id, 2), f)
        assert a.state[3] == 0
    finally:
        b.close(unlink=False)
        a.close(unlink=True)


def test_the_truncation_count_read_back_is_clamped_to_the_rollout(names):
    pool = SlotPool(FragmentLayout(DISCRETE, T), 1, 1, names("slots"), True)
    try:
        f = make_frag(DISCRETE, k=2)
        pool.write(0, f)
        assert len(pool.read(0, f.id, 99).trunc_obs) == T  # a header claiming more than T final observations
        pool.write(0, f)
        assert len(pool.read(0, f.id, -3).trunc_obs) == 0
        pool.write(0, f)
        np.testing.assert_array_equal(pool.read(0, f.id, 2).trunc_obs, f.trunc_obs)
    finally:
        pool.close(unlink=True)


def test_each_actor_writes_only_in_its_partition_and_a_dead_ones_comes_back_whole(names):
    pool = SlotPool(FragmentLayout(DISCRETE, T), actors=3, per_actor=2, name=names("slots"), create_new=True)
    try:
        assert pool.n == 6 and [list(pool.partition(a)) for a in range(3)] == [[0, 1], [2, 3], [4, 5]]
        assert (pool.state == 0).all()
        f = make_frag(DISCRETE)
        assert pool.free_slot(1) == 2
        pool.write(2, f)
        assert pool.free_slot(1) == 3 and pool.free_slot(0) == 0 and pool.free_slot(2) == 4
        pool.write(3, f)
        assert pool.free_slot(1) is None  # full: the actor waits, it never borrows a neighbour's slot
        pool.write(5, f)
        assert pool.free_slot(2) == 4
        pool.read(2, f.id, 2)
        assert pool.free_slot(1) == 2
        assert pool.reclaim(1) == 1 and pool.free_slot(1) == 2 and pool.state[3] == 0
        assert pool.state[5] == 1 and pool.reclaim(0) == 0  # the others' slots untouched
    finally:
        pool.close(unlink=True)


def test_a_seqblock_starts_unpublished_and_hands_out_the_newest_publication(names):
    blk = SeqBlock(5, "float32", names("snap"), True)
    other = SeqBlock(5, "float32", blk.name, False)
    try:
        assert blk.version() == -1 and other.version() == -1 and int(blk.head[0]) == 0
        for v in (0, 1, 2):
            blk.publish(np.full(5, 10.0 + v, np.float32), v)
            assert int(blk.head[0]) == 2 * (v + 1)  # even between publications
            version, data = other.read()
            assert version == v and (data == 10.0 + v).all()
        assert int(blk.head[1]) == 1  # three flips from buffer 0: the third publication is in buffer 1
        np.testing.assert_array_equal(blk.bufs[0], np.full(5, 11.0, np.float32))  # the one before, kept intact
        out = np.zeros(5, np.float32)
        assert other.read(out)[1] is out
    finally:
        other.close(unlink=False)
        blk.close(unlink=True)


def test_a_reader_retries_a_copy_a_publication_overtook(names):
    blk = SeqBlock(4, "int64", names("snap"), True)
    try:
        blk.publish(np.full(4, 1), 1)
        copies = []

        def overtaken(dst, src):  # the first copy is overtaken by a publication mid-way
            np.copyto(dst, src)
            copies.append(dst.copy())
            if len(copies) == 1:
                blk.publish(np.full(4, 2), 2)
        version, data = blk.read(copy=overtaken)
        assert len(copies) == 2 and version == 2 and (data == 2).all()
    finally:
        blk.close(unlink=True)


def test_a_reader_waits_out_a_write_in_progress_unless_the_writer_is_gone(names):
    blk = SeqBlock(3, "float32", names("snap"), True)
    try:
        blk.publish(np.ones(3, np.float32), 4)
        blk.head[0] += 1  # a writer mid-publication
        asks = []

        def alive():
            asks.append(1)
            if len(asks) == 3:
                blk.head[0] += 1  # ... that finishes
            return True
        assert blk.read(spin_s=0, alive=alive)[0] == 4 and len(asks) == 3
        blk.head[0] += 1
        with pytest.raises(SystemExit):  # the writer died mid-write: the reader stops instead of hanging
            blk.read(spin_s=0, alive=lambda: False)
    finally:
        blk.close(unlink=True)


def test_status_rows_belong_to_one_actor_each(names):
    st = StatusBlock(3, names("status"), True)
    other = StatusBlock(3, st.name, False)
    try:
        assert all(v == 0.0 for v in st.row(2).values()) and set(st.row(0)) == set(StatusBlock.FIELDS)
        st.set(1, steps=128, env_s=0.25)
        st.set(2, steps=7)
        assert other.get(1, "steps") == 128.0 and other.row(1)["env_s"] == 0.25 and other.row(2)["steps"] == 7.0
        assert other.row(0)["steps"] == 0.0 and other.row(1)["episodes"] == 0.0
    finally:
        other.close(unlink=False)
        st.close(unlink=True)


def test_the_shared_budget_reserves_exactly_up_to_its_total(names):
    c = SharedCounter(names("budget"), True, actors=2, total=100, used=10)
    other = SharedCounter(c.name, False, actors=2)
    try:
        assert (c.total, c.used, c.stopped) == (100, 10, False)
        assert other.reserve(0, 60) and c.used == 70 and c.reserved(0) == 60 and c.reserved(1) == 0
        assert c.has_room(30) and not c.has_room(31)
        assert c.reserve(1, 31) is False and c.used == 70  # refused: nothing reserved
        assert c.reserve(1, 30) and c.used == 100 and c.reserved(1) == 30
        assert not c.reserve(0, 1)
        other.release(1, 20)
        assert c.used == 80 and c.reserved(1) == 10 and c.reserved(0) == 60
        c.stop()
        assert other.stopped
    finally:
        other.close(unlink=False)
        c.close(unlink=True)


class Clock:
    """shm's monotonic clock, scripted; sleeps are recorded, never slept."""

    def __init__(self, times):
        self.times, self.sleeps = list(times), []

    def monotonic(self):
        return self.times.pop(0)

    def sleep(self, s):
        self.sleeps.append(s)


def test_a_budget_lock_held_too_long_fails_after_the_whole_wait_instead_of_hanging(names, monkeypatch):
    c = SharedCounter(names("budget"), True, actors=1, total=10)
    fd = os.open(os.path.join("/dev/shm", c.name), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another holder (flock is per open file description)
        clock = Clock([0.0, 5.0, 10.0, 10.5])
        monkeypatch.setattr(shm, "time", clock)
        monkeypatch.setattr(SharedCounter, "LOCK_WAIT_S", 10.0)
        with pytest.raises(RuntimeError, match="budget lock"):
            c.reserve(0, 1)
        # the deadline is 0 + 10: polls at 5 and at exactly 10 wait on, the one at 10.5 gives up
        assert len(clock.sleeps) == 2 and clock.times == [] and c.used == 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        clock.times = [0.0]
        assert c.reserve(0, 1) and c.used == 1 and clock.sleeps == [0.0005] * 2  # free: taken without a wait
    finally:
        os.close(fd)
        c.close(unlink=True)


def test_release_of_nothing_or_of_a_segment_already_gone_is_quiet_and_forgotten(names, monkeypatch):
    shm.release(None, True)
    seg = shm.create(names("x"), 0)
    assert seg.size >= 1  # a zero-byte request still makes a segment
    os.unlink(os.path.join("/dev/shm", seg.name.lstrip("/")))  # removed by someone else (a sweep)
    told = []
    real = shm.resource_tracker.unregister
    monkeypatch.setattr(shm.resource_tracker, "unregister", lambda name, kind: (told.append((name, kind)),
                                                                              real(name, kind)))
    shm.release(seg, True)  # no error, and the tracker forgets it (else it warns of a leak at exit)
    assert told == [(seg._name, "shared_memory")]


def _fake_run(where, pid, token, whats):
    for w in whats:
        open(os.path.join(where, f"laglab-{pid}-{token}-{w}"), "w").close()


def test_the_sweep_removes_dead_runs_only_and_their_life_file_last(tmp_path, monkeypatch):
    monkeypatch.setattr(shm, "SHM_DIR", str(tmp_path))  # a private /dev/shm: other runs' segments are not touched
    pid = 4242
    dead, alive, old, later = "0000dead", "1111a11e", "22220000", "ffff0000"
    _fake_run(tmp_path, pid, dead, ["slots", "life", "snapshot"])
    _fake_run(tmp_path, pid, later, ["slots", "life"])  # a second dead run, after the first in name order
    _fake_run(tmp_path, pid, old, ["slots"])  # a run from before life files: no proof either way
    open(tmp_path / f"laglab-{pid}-{dead}", "w").close()  # not a segment name (no '-<what>'): not the sweep's
    _fake_run(tmp_path, pid, alive, ["slots"])
    life = RunLife(f"laglab-{pid}-{alive}-life")  # held by a live learner (this process)
    try:
        assert f"laglab-{pid}-{dead}-slots" in leftover_segments(pid) and leftover_segments(pid + 1) == []
        removed = sweep_stale()
        for token, whats in ((dead, ("slots", "snapshot", "life")), (later, ("slots", "life"))):
            mine = [r for r in removed if f"-{token}-" in r]
            assert sorted(mine) == sorted(f"laglab-{pid}-{token}-{w}" for w in whats)
            assert mine[-1] == f"laglab-{pid}-{token}-life"  # each run's proof goes last
        assert sorted(os.listdir(tmp_path)) == sorted([f"laglab-{pid}-{dead}", f"laglab-{pid}-{old}-slots",
                                                       f"laglab-{pid}-{alive}-slots", f"laglab-{pid}-{alive}-life"])
    finally:
        life.close(unlink=True)
    assert not (tmp_path / f"laglab-{pid}-{alive}-life").exists()


def test_without_a_dev_shm_there_is_nothing_to_sweep(tmp_path, monkeypatch):
    monkeypatch.setattr(shm, "SHM_DIR", str(tmp_path / "absent"))
    assert leftover_segments() == [] and sweep_stale() == []
