"""The books' parts on their own, against counts worked out by hand: the budget, a ledger's streams,
watermarks, the bounded seen-set, retirement, and the balance identity."""
from types import SimpleNamespace as NS

from laglab.accounting import (DUPLICATE, FIRST, TOO_OLD, UNATTRIBUTED, Balance, Budget, Ledger, counters,
                               merged)


def test_budget_reserves_whole_rollouts_up_to_the_total_and_takes_releases_back():
    b = Budget(10, used=2)
    assert b.has_room(8) and not b.has_room(9)
    assert b.reserve(8) and b.used == 10
    assert b.reserve(1) is False and b.used == 10  # a refused reservation takes nothing
    assert b.has_room(0) and not b.has_room(1)
    b.release(3)
    assert b.used == 7 and b.has_room(3) and not b.has_room(4)


def _frag(inc, env, t_start, T=4, actor=5):
    return NS(id=NS(incarnation=inc, env_index=env, t_start=t_start, t_end=t_start + T - 1, actor_id=actor),
              length=T)


def _ledger(window=2):
    led = Ledger(rollout_len=4, envs_per_actor=2, dedup_window=window)
    inc = led.new_incarnation(5)
    return led, inc


def test_incarnations_are_numbered_from_one_or_by_the_allocator():
    led = Ledger(4, 2)
    assert [led.new_incarnation(0), led.new_incarnation(3)] == [1, 2]
    assert led.owner == {1: 0, 2: 3}
    n = iter([40, 41])
    led = Ledger(4, 2, allocate=lambda: next(n))
    assert led.new_incarnation(1) == 40 and led.owner == {40: 1}
    led = Ledger(4, 2)
    assert [led.new_incarnation(0) for _ in range(500)] == list(range(1, 501))  # a long run restarts a lot


def test_producer_counts_and_watermarks():
    led, inc = _ledger()
    led.produced_rollout(8)
    assert (led.produced, led.in_hand) == (8, 8)
    led.sent(inc, 0, 3, 4)
    led.sent(inc, 1, 3, 4)
    assert led.in_hand == 0 and led.streams[(inc, 0)].sent == 4
    led.mark_sent(inc, 0, 7)
    led.mark_sent(inc, 0, 5)  # a watermark never moves back
    assert led.streams[(inc, 0)].sent == 8
    assert led.sent_by_incarnation() == {inc: 12}
    led.unsent(0, "shutdown")
    assert "shutdown" not in led.dropped
    led.produced_rollout(4)
    led.unsent(4, "actor_crash")
    assert led.in_hand == 0 and led.dropped == {"actor_crash": 4}


def test_arrivals_are_classified_and_the_seen_set_is_bounded():
    led, inc = _ledger(window=2)
    led.produced_rollout(16)
    for t in (0, 4, 8, 12):
        led.sent(inc, 0, t + 3, 4)
    first = [_frag(inc, 0, t) for t in (0, 4, 8)]
    for f in first:
        assert led.classify(f) == FIRST
        led.arrive(f, FIRST)
    s = led.streams[(inc, 0)]
    assert s.arrived == 12 and list(s.order) == [4, 8] and s.seen == {4, 8} and s.floor == 0
    assert led.classify(_frag(inc, 0, 4)) == DUPLICATE
    assert led.classify(_frag(inc, 0, 0)) == TOO_OLD  # forgotten, at the floor
    assert led.has_arrived(_frag(inc, 0, 0)) and led.has_arrived(_frag(inc, 0, 8))
    assert not led.has_arrived(_frag(inc, 0, 12)) and not led.has_arrived(_frag(inc, 1, 0))
    led.arrive(_frag(inc, 0, 4), DUPLICATE)
    led.arrive(_frag(inc, 0, 0), TOO_OLD)
    assert (led.duplicates, led.too_old) == (1, 1)
    # the floor is the largest timestep forgotten, whatever order they arrived in
    led.arrive(_frag(inc, 0, 12), FIRST)
    assert s.floor == 4 and s.seen == {8, 12}
    assert led.gaps() == {} and led.lost(0) == 0


def test_arrivals_no_stream_sent_are_unattributable():
    led, inc = _ledger()
    led.sent(inc, 0, 7, 8)  # sent through t=7
    assert led.classify(_frag(inc, 0, 4)) == FIRST
    assert led.classify(_frag(inc, 0, 8)) == UNATTRIBUTED  # beyond the watermark
    assert led.classify(_frag(inc, 1, 0)) == UNATTRIBUTED  # a stream that sent nothing
    assert led.classify(_frag(inc + 1, 0, 0)) == UNATTRIBUTED  # an incarnation nobody owns
    assert led.classify(_frag(inc, 0, 0, actor=6)) == UNATTRIBUTED  # another actor claims it
    assert led.classify(_frag(inc, 0, 2)) == UNATTRIBUTED  # not on a rollout boundary
    assert led.classify(_frag(inc, 0, 0, T=3)) == UNATTRIBUTED  # another length than the rollout
    assert led.classify(NS(id=None)) == UNATTRIBUTED  # a header too broken to read
    led.arrive(_frag(inc, 0, 8, T=5), UNATTRIBUTED)
    led.arrive(_frag(inc, 0, 8, T=-2), UNATTRIBUTED)
    led.arrive(NS(id=None), UNATTRIBUTED)
    assert led.unattributed == 5


def test_the_watermark_is_exclusive():
    led = Ledger(rollout_len=1, envs_per_actor=1)  # one-step fragments: t_end can equal a watermark
    inc = led.new_incarnation(5)
    led.sent(inc, 0, 7, 8)  # t 0..7 sent: the watermark is 8
    assert led.classify(_frag(inc, 0, 7, T=1)) == FIRST
    assert led.classify(_frag(inc, 0, 8, T=1)) == UNATTRIBUTED


def test_a_skipped_range_counts_as_arrived_and_a_claim_on_it_is_a_duplicate():
    """Ledger.skip: a rollout discarded part-way (actor.refresh_lag) will never be sent; the watermark passes it,
    it counts as arrived (neither lost in transit nor claimable by a later arrival) and never moves back."""
    led, inc = _ledger()  # rollout_len 4
    led.sent(inc, 0, 3, 4)  # t 0..3 sent
    led.skip(inc, 0, 7)  # t 4..7 discarded
    s = led.streams[(inc, 0)]
    assert (s.sent, s.arrived, s.seen) == (8, 4, {4})
    assert led.classify(_frag(inc, 0, 4)) == DUPLICATE  # whatever claims the skipped range is not a first copy
    assert led.classify(_frag(inc, 0, 8)) == UNATTRIBUTED  # past the new watermark
    led.arrive(_frag(inc, 0, 0), FIRST)
    assert led.gaps() == {} and led.lost(0) == 0  # nothing sent is missing
    led.skip(inc, 0, 7)  # at the watermark, or behind it: nothing moves
    led.skip(inc, 0, 2)
    assert (s.sent, s.arrived, s.seen) == (8, 8, {0, 4})
    led.skip(inc, 1, 7)  # a stream that has sent nothing yet, two rollouts: the one discarded is the last
    t = led.streams[(inc, 1)]
    assert (t.sent, t.arrived, t.seen) == (8, 8, {4})
    assert led.classify(_frag(inc, 1, 4)) == DUPLICATE
    one = Ledger(rollout_len=1, envs_per_actor=1)  # one-step rollouts: a skip one step past the watermark
    i = one.new_incarnation(0)
    one.sent(i, 0, 7, 8)
    one.skip(i, 0, 8)
    u = one.streams[(i, 0)]
    assert (u.sent, u.arrived, u.seen) == (9, 1, {8})


def test_loss_is_what_was_sent_and_neither_arrived_nor_is_in_a_link():
    led, inc = _ledger()
    led.sent(inc, 0, 11, 12)  # t 0..11: three fragments sent on env 0
    led.sent(inc, 1, 3, 4)  # one on env 1
    led.arrive(_frag(inc, 0, 0), FIRST)
    assert led.gaps() == {(inc, 0): 8, (inc, 1): 4}
    link = [_frag(inc, 0, 4), _frag(inc, 0, 4), _frag(inc, 0, 0)]  # a copy held twice, one already arrived
    assert led.link_steps(link) == 4 and led.link_steps(link[2:]) == 0
    assert led.lost(led.link_steps(link)) == 8
    led.retire(inc)
    assert led.streams == {} and inc not in led.owner and led.retired_gap == 12
    assert led.lost(0) == 12 and led.classify(_frag(inc, 0, 4)) == UNATTRIBUTED


def test_book_routes_each_fate_to_its_bucket():
    led, _ = _ledger()
    led.book("dropped", "lag", 4)
    led.book("rejected", "shape", 8)
    led.book("rejected", "flags", 0)
    assert led.dropped == {"lag": 4} and led.rejected == {"shape": 8}


def test_the_balance_identity_and_its_metrics():
    bal = Balance(produced=100, admitted=60, dropped={"lag": 10}, rejected={"shape": 4, "flags": 2},
                  in_flight={"in_hand": 8, "link": 4, "queue": 8, "staging": 0})
    assert bal.unaccounted == 4
    m = bal.metrics()
    assert m == {"transport/produced": 100.0, "transport/in_flight": 20.0, "transport/unaccounted": 4.0,
                 "transport/in_flight/in_hand": 8.0, "transport/in_flight/link": 4.0,
                 "transport/in_flight/queue": 8.0, "transport/in_flight/staging": 0.0,
                 "transport/dropped": 10.0, "transport/dropped/lag": 10.0,
                 "transport/rejected": 6.0, "transport/rejected/shape": 4.0, "transport/rejected/flags": 2.0}
    d = bal.as_dict()
    assert d == {"produced": 100, "admitted": 60, "dropped": {"lag": 10}, "rejected": {"flags": 2, "shape": 4},
                 "in_flight": 20, "in_flight_parts": bal.in_flight, "unaccounted": 4, "balanced": False}
    assert list(d["rejected"]) == ["flags", "shape"]
    assert Balance(10, 4, {}, {}, {"queue": 6}).as_dict()["balanced"] is True


def test_counters_and_merged():
    assert counters("x", {}) == {"x": 0.0}
    assert counters("x", {"a": 2, "b": 3}) == {"x": 5.0, "x/a": 2.0, "x/b": 3.0}
    assert merged({"a": 1, "b": 2}, {"a": 3, "c": 0}, {"b": -2}) == {"a": 4}
    assert merged() == {}
