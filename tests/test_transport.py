"""Bounded queue and policy store, driven step by step (no sleeps)."""
import threading

import numpy as np
import pytest

from laglab.config import Overflow
from laglab.fragment import Fragment, FragmentId
from laglab.policy import ActorCritic, Snapshot
from laglab.envs import EnvSpec
from laglab.transport import Closed, FragmentQueue, PolicyStore


def frag(i, T=4, obs_dim=3):
    fid = FragmentId(actor_id=0, incarnation=1, env_index=0, episode_id=0, episode_t0=i * T,
                     t_start=i * T, t_end=i * T + T - 1, behavior_version=0)
    z = np.zeros(T, np.float32)
    return Fragment(fid, np.full((T, obs_dim), i, np.float32), np.zeros(T, np.int64), z, np.zeros(T, bool),
                    np.zeros(T, bool), z, z, np.zeros((0, obs_dim), np.float32), z, np.zeros(obs_dim, np.float32))


def test_reject_refuses_new_fragment_when_full_and_counts_it():
    seen = []
    q = FragmentQueue(capacity=2, max_bytes=10**9, policy=Overflow.reject, on_discard=lambda *a: seen.append(a[1:]))
    assert q.try_put(frag(0)) and q.try_put(frag(1), first=False)
    assert q.first_steps() == 4  # only first copies count as transitions in flight
    assert q.try_put(frag(2))  # handled: refused by policy
    assert q.depth == 2 and q.stats.rejected_steps == {"overflow": 4} and seen == [(True, "rejected", "overflow")]
    assert [q.get(0)[0].id.t_start for _ in range(2)] == [0, 4]  # FIFO, the new one was refused


def test_drop_oldest_evicts_from_the_head():
    q = FragmentQueue(capacity=2, max_bytes=10**9, policy=Overflow.drop_oldest)
    for i in range(5):
        assert q.try_put(frag(i))
    assert q.depth == 2 and q.stats.dropped_steps == {"overflow": 12} and q.first_steps() == 8
    assert [q.get(0)[0].id.t_start for _ in range(2)] == [12, 16]


def test_byte_bound_is_enforced_like_the_item_bound():
    one = frag(0).nbytes
    q = FragmentQueue(capacity=100, max_bytes=2 * one + 1, policy=Overflow.drop_oldest)
    for i in range(6):
        q.try_put(frag(i))
        assert q.bytes <= 2 * one + 1
    assert q.depth == 2 and q.stats.max_bytes <= 2 * one + 1
    small = FragmentQueue(10, one - 1)
    assert small.try_put(frag(0)) and small.depth == 0  # a fragment larger than the whole budget is refused
    assert small.stats.rejected_steps == {"too_large": 4}


def test_block_waits_for_room_then_proceeds():
    q = FragmentQueue(capacity=1, max_bytes=10**9, policy=Overflow.block)
    q.put(frag(0))
    assert not q.try_put(frag(1)) and q.depth == 1  # block: no room, nothing changed
    entered, done = threading.Event(), threading.Event()

    def producer():
        entered.set()
        q.put(frag(1), poll_s=0.01)
        done.set()

    t = threading.Thread(target=producer)
    t.start()
    entered.wait()
    assert not done.wait(0.05)  # still blocked: the queue is full
    assert q.depth == 1
    assert q.get(1.0)[0].id.t_start == 0
    assert done.wait(5.0)
    t.join()
    assert q.get(1.0)[0].id.t_start == 4
    assert q.stats.blocked_s > 0


def test_close_wakes_blocked_producer_and_counts_leftovers_as_dropped():
    q = FragmentQueue(capacity=1, max_bytes=10**9, policy=Overflow.block)
    q.put(frag(0))
    raised = []

    def producer():
        try:
            q.put(frag(1), poll_s=0.01)
        except Closed:
            raised.append(True)

    t = threading.Thread(target=producer)
    t.start()
    assert q.close() == 4
    t.join(5.0)
    assert raised == [True]
    assert q.stats.dropped_steps == {"shutdown": 4}
    assert q.get(0) is None


def test_policy_store_publishes_newer_versions_only_and_wakes_waiters():
    spec = EnvSpec((3,), True, 2)
    model = ActorCritic(spec, (4,))
    store = PolicyStore(Snapshot.make(0, model, np.zeros(3), np.ones(3)))
    got = []
    t = threading.Thread(target=lambda: got.append(store.wait_newer(0, timeout=5.0).version))
    t.start()
    store.publish(Snapshot.make(1, model, np.zeros(3), np.ones(3)))
    t.join(5.0)
    assert got == [1] and store.latest().version == 1
    with pytest.raises(ValueError):
        store.publish(Snapshot.make(0, model, np.zeros(3), np.ones(3)))  # an older version


def test_credit_grants_wake_throttled_actors_without_a_new_version():
    spec = EnvSpec((3,), True, 2)
    model = ActorCritic(spec, (4,))
    store = PolicyStore(Snapshot.make(0, model, np.zeros(3), np.ones(3), {7: 10}))
    gen = store.generation
    woke = threading.Event()
    t = threading.Thread(target=lambda: (store.wait_change(gen, timeout=5.0), woke.set()))
    t.start()
    store.grant({7: 42})
    t.join(5.0)
    assert woke.is_set() and store.credits() == {7: 42} and store.latest().version == 0
    store.publish(Snapshot.make(1, model, np.zeros(3), np.ones(3), {7: 50}))
    assert store.credits() == {7: 50}  # a publication carries its own credits


def test_the_queue_counts_what_passes_and_fills_to_exactly_its_bounds():
    one = frag(0).nbytes
    q = FragmentQueue(capacity=3, max_bytes=2 * one, policy=Overflow.reject)
    assert q.try_put(frag(0)) and q.try_put(frag(1), first=False) and q.try_put(frag(2))
    assert q.depth == 2 and q.bytes == 2 * one  # exactly full in bytes: the third is refused
    assert q.stats.rejected_steps == {"overflow": 4}
    assert (q.stats.put_fragments, q.stats.put_steps, q.stats.max_depth, q.stats.max_bytes) == (2, 8, 2, 2 * one)
    assert q.first_steps() == 4
    f, first, age = q.get(0)
    assert f.id.t_start == 0 and first is True and 0.0 <= age < 60.0 and q.first_steps() == 0
    f, first, _ = q.get(0)
    assert first is False and q.first_steps() == 0 and q.bytes == 0
    assert (q.stats.got_fragments, q.stats.got_steps) == (2, 8) and q.get(0) is None
    by_items = FragmentQueue(capacity=2, max_bytes=10 * one, policy=Overflow.reject)
    assert by_items.try_put(frag(0)) and by_items.try_put(frag(1)) and by_items.try_put(frag(2))
    assert by_items.depth == 2 and by_items.stats.rejected_steps == {"overflow": 4}
    exact = FragmentQueue(capacity=5, max_bytes=one, policy=Overflow.reject)
    assert exact.try_put(frag(0)) and exact.depth == 1  # a fragment of exactly max_bytes fits


def test_evicting_a_duplicate_does_not_change_the_first_copies_in_flight():
    q = FragmentQueue(capacity=2, max_bytes=1 << 20, policy=Overflow.drop_oldest)
    q.try_put(frag(0), first=False)
    q.try_put(frag(1), first=None)
    q.try_put(frag(2))
    assert q.first_steps() == 4 and q.depth == 2 and q.stats.dropped_steps == {"overflow": 4}
    q.try_put(frag(3))
    assert q.first_steps() == 8 and q.bytes == 2 * frag(0).nbytes
    assert q.close() == 8 and q.first_steps() == 0 and q.bytes == 0 and q.depth == 0 and q.closed


def test_waits_end_at_their_timeout_or_when_stop_says_so():
    spec = EnvSpec((3,), True, 2)
    store = PolicyStore(Snapshot.make(3, ActorCritic(spec, (4,)), np.zeros(3), np.ones(3)))
    assert store.wait_newer(3, timeout=0.01).version == 3  # nothing newer: returns the current one
    assert store.wait_newer(2, timeout=60.0).version == 3  # already newer: no wait
    assert store.wait_newer(3, timeout=60.0, stop=lambda: True).version == 3
    gen = store.generation
    store.wait_change(gen, timeout=60.0, stop=lambda: True)  # returns at once
    store.wait_change(gen - 1, timeout=60.0)
    store.publish(Snapshot.make(3, ActorCritic(spec, (4,)), np.zeros(3), np.ones(3)))  # the same version again
    assert store.generation == gen + 1 and store.latest().version == 3
    q = FragmentQueue(capacity=1, max_bytes=1 << 20)
    q.try_put(frag(0))
    q.wait_room(frag(0).nbytes, timeout=0.01)  # full: waits out the timeout
    assert 0.01 <= q.stats.blocked_s < 60.0
    assert q.try_put(frag(1)) is False  # block: no room, says so
    q.get(0)
    q.put(frag(2))  # put's fragments are first copies unless told otherwise
    assert q.first_steps() == 4


class _Waits:
    """Stands in for a Condition's wait_for: records each predicate, runs ``during`` (what another thread would
    do while the caller waits) and returns the predicate's value, without waiting."""

    def __init__(self, cv, during=lambda: None):
        self.cv, self.during, self.predicates = cv, during, []

    def __call__(self, predicate, timeout=None):
        self.predicates.append(predicate)
        self.during()
        return predicate()


def test_the_wait_predicates_say_exactly_when_a_waiter_may_go():
    # each wait's condition, read in the states around it: a getter may go once an item is there (or the queue
    # closed), a blocked producer once its fragment fits, a store waiter once something newer was published
    q = FragmentQueue(capacity=2, max_bytes=1 << 20)
    seen = []

    def put_meanwhile():
        seen.append(bool(waits.predicates[-1]()))  # nothing there yet: wait on
        q._items.append((frag(5), True, frag(5).nbytes, q.clock()))
        seen.append(bool(waits.predicates[-1]()))  # an item: go

    waits = _Waits(q._cv, during=put_meanwhile)
    q._cv.wait_for = waits
    got = q.get(timeout=60.0)  # empty: it waits, and another thread's put arrives meanwhile
    assert got is not None and got[0].id.t_start == 20 and len(waits.predicates) == 1 and seen == [False, True]
    waits.during = lambda: None
    q.try_put(frag(0))
    assert q.get(timeout=60.0)[0].id.t_start == 0 and len(waits.predicates) == 1  # an item there: no wait
    q.wait_room(frag(0).nbytes, timeout=60.0)  # room for it: the predicate holds
    assert waits.predicates[-1]() is True
    q.try_put(frag(1))
    q.try_put(frag(2))
    assert waits.predicates[-1]() is False  # full now: a producer must wait ...
    q.close()
    assert waits.predicates[-1]() is True  # ... until the queue closes

    spec = EnvSpec((3,), True, 2)
    model = ActorCritic(spec, (4,))
    store = PolicyStore(Snapshot.make(3, model, np.zeros(3), np.ones(3)))
    sw = _Waits(store._cv)
    store._cv.wait_for = sw
    store.wait_change(store.generation, timeout=60.0)
    assert sw.predicates[-1]() is False  # nothing changed yet
    store.grant({0: 1})
    assert sw.predicates[-1]() is True
    store.wait_newer(2, timeout=60.0)
    assert sw.predicates[-1]() is True  # version 3 is newer than 2: no wait
    store.wait_newer(3, timeout=60.0)
    assert sw.predicates[-1]() is False
    store.publish(Snapshot.make(4, model, np.zeros(3), np.ones(3)))
    assert sw.predicates[-1]() is True
