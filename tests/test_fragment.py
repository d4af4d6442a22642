"""The Fragment record itself: immutable once sealed, its claimed length and byte size, and chain depths."""
import dataclasses

import numpy as np
import pytest

from laglab.fragment import Fragment, FragmentId, chain_depths, successors


def _frag(t_start=0, T=4, sealed=True, incarnation=0, env_index=0, episode_id=0, dones=()):
    fid = FragmentId(actor_id=0, incarnation=incarnation, env_index=env_index, episode_id=episode_id,
                     episode_t0=t_start, t_start=t_start, t_end=t_start + T - 1, behavior_version=0)
    term = np.zeros(T, dtype=bool)
    term[list(dones)] = True
    fields = dict(id=fid, obs=np.zeros((T, 3), np.float32), actions=np.zeros(T, np.int64),
                  rewards=np.ones(T, np.float32), terminated=term, truncated=np.zeros(T, bool),
                  logp=np.full(T, -0.5, np.float32), values=np.zeros(T, np.float32),
                  trunc_obs=np.zeros((0, 3), np.float32), disc_return=np.zeros(T, np.float32),
                  last_obs=np.zeros(3, np.float32))
    return Fragment.sealed(**fields) if sealed else Fragment(**fields)


def test_a_sealed_fragment_cannot_change():
    f = _frag()
    assert isinstance(f, Fragment) and f.id.t_end == 3 and f.rewards.tolist() == [1.0] * 4
    for name in ("obs", "actions", "rewards", "terminated", "logp", "last_obs"):
        with pytest.raises(ValueError):
            getattr(f, name)[0] = 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.rewards = np.zeros(4, np.float32)
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.id.t_end = 99
    assert _frag(sealed=False).rewards.flags.writeable  # only sealing makes the arrays read-only


def test_length_is_the_header_interval_and_never_negative():
    f = _frag(t_start=10, T=5)
    assert f.id.length == 5 and f.length == 5
    broken = dataclasses.replace(f, id=dataclasses.replace(f.id, t_end=7))  # t_end before t_start
    assert broken.id.length == -2 and broken.length == 0


def test_nbytes_counts_every_array_and_a_fixed_header():
    f = _frag(T=4)
    arrays = 4 * 3 * 4 + 4 * 8 + 4 * 4 + 4 + 4 + 4 * 4 + 4 * 4 + 0 + 4 * 4 + 3 * 4  # obs .. last_obs, no mean/std
    assert f.nbytes == arrays + 72
    g = dataclasses.replace(f, mean=np.zeros((4, 2), np.float32), log_std=np.zeros((4, 2), np.float32))
    assert g.nbytes == arrays + 2 * 32 + 72


def test_successors_follow_the_episode_count_through_dones():
    a = _frag(t_start=0, T=4, dones=(1,))  # one episode ends inside a: its successor starts in episode 1
    b = _frag(t_start=4, T=4, episode_id=1)
    assert successors([a, b]).tolist() == [1, -1]
    assert successors([a, dataclasses.replace(b, id=dataclasses.replace(b.id, episode_id=0))]).tolist() == [-1, -1]
    # the same stream in another env slot, or one step off, is not a continuation
    assert successors([a, _frag(t_start=4, episode_id=1, env_index=1)]).tolist() == [-1, -1]
    assert successors([a, _frag(t_start=5, episode_id=1)]).tolist() == [-1, -1]


def test_recurrent_fragments_join_only_when_the_successor_starts_from_the_very_state():
    """The history contract: adjacency by identity is not enough for a recurrent fragment; its successor must start
    from the state it ended in, bit for bit (any behavior version). Otherwise each starts from its own state."""
    end = np.array([0.25, -1.0, 0.0, 3.0], np.float32)
    a = dataclasses.replace(_frag(t_start=0), state=np.zeros(4, np.float32), final_state=end)
    b = _frag(t_start=4)

    def succ(g_state, f_final=end):
        return successors([dataclasses.replace(a, final_state=f_final), dataclasses.replace(b, state=g_state,
                                                                                              final_state=end)]).tolist()

    assert succ(end.copy()) == [1, -1]
    assert successors([a, dataclasses.replace(b, state=end.copy(), final_state=end,
                                              id=dataclasses.replace(b.id, behavior_version=5))]).tolist() == [1, -1]
    assert succ(np.nextafter(end, 1).astype(np.float32)) == [-1, -1]  # one ulp off
    assert succ(np.zeros(4, np.float32)) == [-1, -1]
    assert succ(None) == [-1, -1]  # the successor carries no state
    assert succ(end.copy(), f_final=None) == [-1, -1]  # the predecessor's final state is missing
    assert succ(end.reshape(1, 4).copy()) == [-1, -1]  # the same numbers in another shape
    assert successors([_frag(t_start=0), _frag(t_start=4)]).tolist() == [1, -1]  # feed-forward: identity decides


def test_chain_depths_count_the_fragments_that_follow():
    # chains 0 -> 2 -> 3 and 1 alone, 4 -> 1
    succ = np.array([2, -1, 3, -1, 1])
    assert chain_depths(succ).tolist() == [2, 0, 1, 0, 1]
    # a chain that ends after the last fragment's depth is known still ends at depth 0
    assert chain_depths(np.array([2, -1, -1])).tolist() == [1, 0, 0]
    assert chain_depths(np.array([-1, 0, -1])).tolist() == [0, 1, 0]
    four = [_frag(t_start=4 * i) for i in range(4)]
    assert chain_depths(successors(four[::-1])).tolist() == [0, 1, 2, 3]
    assert chain_depths(np.array([], dtype=np.int64)).tolist() == []
