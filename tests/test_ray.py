"""runner=ray on a real multi-node cluster on one machine (ray.cluster_utils.Cluster: a head and two worker
nodes): actors spread over the nodes, a node removed mid-run, the books exact; and the refusal without Ray.
(The protocol tests in test_protocol.py also run on runner=ray, against a local instance.)"""
import importlib.util

import pandas as pd
import pytest

from laglab.config import ConfigError
from laglab.run import run
from laglab.tagged import TAGGED_ID

from test_protocol import balanced, on

ray = pytest.importorskip("ray")


@pytest.fixture()
def cluster():
    """A head node with no CPU for actors and two worker nodes with 2 CPUs and a "rollout" resource each (so
    four one-CPU actors must use both)."""
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    import conftest

    root = conftest.ray_root()  # (not /tmp/ray, where Ray keeps every session for good)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False, "temp_dir": root})
    nodes = [c.add_node(num_cpus=2, resources={"rollout": 100}, temp_dir=root) for _ in range(2)]
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False, logging_level="warning")
    try:
        yield c, nodes
    finally:
        ray.shutdown()
        c.shutdown()


def test_actors_spread_over_the_nodes_and_a_lost_node_costs_nothing_but_its_actors(cluster, tmp_path, monkeypatch):
    import threading

    import laglab.runners.ray as R

    c, nodes = cluster
    reports, twelfth, node_gone = {"n": 0}, threading.Event(), threading.Event()
    take = R._Runner.take

    def take_and_wait_for_the_fault(self, w, res):  # the fault, scripted: after the 12th report, a node goes
        ok = take(self, w, res)
        reports["n"] += 1
        if reports["n"] == 12:
            twelfth.set()
            node_gone.wait(60)  # (the receiver holds still while the test removes it)
        return ok

    monkeypatch.setattr(R._Runner, "take", take_and_wait_for_the_fault)
    out = {}
    cfg = on("ray", actors=4, total_env_steps=16384,
             runner={"resource": "rollout", "actors_max_restarts": 10, "heartbeat_timeout_s": 30.0})
    trainer = threading.Thread(target=lambda: out.update(s=run(cfg, tmp_path)), daemon=True)
    trainer.start()
    assert twelfth.wait(120)
    c.remove_node(nodes[0])  # (node operations on the main thread, as Ray wants)
    c.add_node(num_cpus=2, resources={"rollout": 100})  # a replacement joins, as an autoscaler would bring one
    node_gone.set()
    trainer.join(300)
    s = out["s"]
    t = s["transport"]
    assert s["status"] == "completed" and s["env_steps"] == 16384
    # actors ran on at least two worker nodes (two 2-CPU nodes for four 1-CPU actors; the lost node's actors may
    # not have answered yet when it went, then they started on the replacement) and never on the head
    assert len(t["queue"]["ray_nodes"]) >= 2
    assert s["actor_restarts"] >= 2  # the lost node's two actors, restarted with new incarnations elsewhere
    assert t["misattributed"] == 0 and balanced(t)
    assert s["env_id"] == TAGGED_ID
    assert s["cpu"]["actor_nice"] == 15, s["cpu"]  # (what the workers said in ready(): Ray's worker_niceness)
    su = s["startup"]  # the workers' first env step is on the learner's timeline (laglab.sim --calibrate's startup_s)
    assert su["learner"] < su["first_env_step"] < su["first_fragment"], su


def test_a_ray_kill_is_booked_and_the_slot_restarts(cluster, tmp_path, monkeypatch):
    import laglab.runners.ray as R

    state = {"n": 0, "killed": None}
    take = R._Runner.take

    def take_and_kill(self, w, res):  # an operator's ray.kill of a live actor, after its 5th report
        ok = take(self, w, res)
        state["n"] += 1
        if state["n"] == 5:
            state["killed"] = w.inc
            ray.kill(w.handle, no_restart=True)
        return ok

    monkeypatch.setattr(R._Runner, "take", take_and_kill)
    c = on("ray", total_env_steps=8192, runner={"resource": "rollout"})
    s = run(c, tmp_path)
    t = s["transport"]
    assert state["killed"] is not None and s["actor_restarts"] == 1
    assert s["status"] == "completed" and balanced(t) and t["misattributed"] == 0
    # each Ray actor reports its worker process's CPU (what laglab.sim calibrates from): measured, within the run
    stats = [a for a in s["actors_stats"].values() if a["steps"]]
    assert stats and all(0 < a["cpu_s"] < s["wall_time_s"] for a in stats), stats
    # and splits each call's way: the board's answer (asked to held), the rest the snapshot's read and load
    assert all(0 < a["ask_s"] < a["snapshot_s"] for a in stats), [(a["ask_s"], a["snapshot_s"]) for a in stats]
    rows = pd.read_parquet(tmp_path / "actors.parquet")  # (per update too, for a window's figures)
    assert (rows.groupby("actor")["ask_s"].max() > 0).all()
    # each answered call's moments on the run's clock (calls.parquet), in order, and each update's start and the
    # end of its publication (benchmarks/phase_profile.py places the calls against them)
    calls = pd.read_parquet(tmp_path / "calls.parquet")
    per_call = c.actor.envs_per_actor * c.actor.rollout_len  # (each answered call one rollout: what was trained
    assert t["admitted"] <= len(calls) * per_call <= t["produced"]  # came from them, and they were produced)
    assert calls.groupby("actor").size().min() > 0 and calls["actor"].nunique() == c.actors
    assert ((calls["asked"] < calls["answered"]) & (calls["answered"] <= calls["stepping"])
            & (calls["stepping"] < calls["ended"]) & (calls["ended"] < calls["received"])).all()
    assert (calls["received"] - calls["ended"]).max() < 2.0  # (the worker's clock put on the run's: no offset left)
    assert (calls["version"] == calls["board_version"]).all()  # (sync_min_lag 0: it acts with what the board answered)
    assert (calls.sort_values("asked").groupby("incarnation")["version"].diff().dropna() >= 0).all()
    assert calls["incarnation"].nunique() == c.actors + 1  # (every life's calls: the killed one's and its successor's)
    m = pd.read_parquet(tmp_path / "metrics.parquet")
    assert (m["learner/started_t"] < m["learner/published_t"]).all()
    assert (m["learner/published_t"] <= m["wall_time"]).all()
    assert set(m["learner/closed_by"].astype(int)) <= set(calls["incarnation"])  # (whose fragment closed each batch)


def test_runner_ray_without_ray_installed_is_refused_with_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(ConfigError, match=r"runner=ray needs Ray.*pip install -e '\.\[ray\]'"):
        on("ray")


def test_an_actor_that_cannot_start_fails_the_run_with_its_error(tmp_path):
    from laglab.runners.supervisor import ActorFailed
    import conftest

    conftest.ray_up()
    # the env's module is importable where the learner runs, not where the Ray workers run: the run fails at
    # once with the worker's own error text, without restarts
    with pytest.raises(ActorFailed, match="(?s)could not start on Ray.*No module named 'failing_env'"):
        run(on("ray", env={"id": "failing_env:FailInChild-v0"}), tmp_path)
    import json
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == "failed" and "could not start on Ray" in s["error"]


def test_actors_waiting_on_a_stalled_learner_are_not_taken_for_hung(tmp_path):
    import conftest

    conftest.ray_up()
    # the learner stalls 1.5 s at every update with a 4-fragment queue under block: the receiver waits for room
    # far longer than the 1 s heartbeat, while the actors have long answered; none of them may be killed
    s = run(on("ray", transport={"capacity": 4, "policy": "block"}, total_env_steps=4096,
               chaos={"name": "stall", "stall_every_updates": 1, "stall_s": 1.5},
               runner={"heartbeat_timeout_s": 1.0}), tmp_path)
    assert s["chaos"]["stalls"] >= 3 and s["transport"]["queue"]["blocked_s"] > 1.0
    assert s["actor_restarts"] == 0 and s["chaos"]["hangs_detected"] == 0
    assert balanced(s["transport"])
