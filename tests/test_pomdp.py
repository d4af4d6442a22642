"""The partially observed CartPole (env=cartpole_pomdp): CartPole's own dynamics with the velocities removed."""
import gymnasium as gym
import numpy as np

from laglab.envs import CARTPOLE_POMDP_ID


def test_the_pomdp_cartpole_is_cartpole_without_its_velocities():
    full, part = gym.make("CartPole-v1"), gym.make(CARTPOLE_POMDP_ID)
    assert part.observation_space.shape == (2,)
    o_full, _ = full.reset(seed=4)
    o_part, _ = part.reset(seed=4)
    np.testing.assert_array_equal(o_part, o_full[[0, 2]])
    rng = np.random.default_rng(0)
    for _ in range(300):
        a = int(rng.integers(2))
        f, rf, tf, uf, _ = full.step(a)
        p, rp, tp, up, _ = part.step(a)
        np.testing.assert_array_equal(p, f[[0, 2]])
        assert (rp, tp, up) == (rf, tf, uf)
        if tf or uf:
            np.testing.assert_array_equal(part.reset(seed=5)[0], full.reset(seed=5)[0][[0, 2]])
