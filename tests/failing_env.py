"""A gymnasium env that cannot be built inside an actor process (for the child-start-failure tests): made in
the learner process it works, made in any other process (a multiprocessing child, a Ray worker) it raises,
like an import missing only there."""
import os

import gymnasium as gym
import numpy as np


class FailInChild(gym.Env):
    def __init__(self):
        if os.getpid() != int(os.environ.get("FAILING_ENV_LEARNER_PID", "-1")):
            raise RuntimeError("simulated: this simulator cannot start in an actor process")
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}


os.environ.setdefault("FAILING_ENV_LEARNER_PID", str(os.getpid()))  # the first importer: the learner

if "FailInChild-v0" not in gym.registry:
    gym.register("FailInChild-v0", entry_point=FailInChild)
