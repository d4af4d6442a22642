"""The simulator's validation report (analysis.sim_validation): its table's arithmetic, its compact data's
bookkeeping, and the committed report regenerating from the repo."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from analysis import report, scale, sim_validation as sv

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "reports" / "sim_validation"


def _run(actors: int, repeat: int, pred: float, real: float, lag_pred: float = 1.0, lag_real: float = 1.0,
         p95_pred: float = 2.0, p95_real: float = 2.0, **kw) -> dict:
    return {"set": "s", "runner": "process", "latency": "uniform", "actors": actors, "repeat": repeat,
            "started": f"2026-12-06T08:0{repeat}:00", "commit": "abc1234", "cpu_busy": 0.01, "pred_sps": pred,
            "pred_lag_mean": lag_pred, "pred_lag_p95": p95_pred, "real_sps": real, "real_lag_mean": lag_real,
            "real_lag_p95": p95_real, "real_cpu_us": 70.0, "cal_cpu_us": 68.0, "own_sps": real, **kw}


def test_cell_table_medians_ranges_and_goal():
    runs = pd.DataFrame([_run(8, 0, 105, 100), _run(8, 1, 105, 100), _run(8, 2, 105, 120),  # one cell, 3 runs
                         _run(16, 0, 200, 200, lag_pred=1.2, lag_real=1.0),                  # lag 20% off
                         _run(32, 0, 300, 300, p95_pred=4, p95_real=2)])                     # p95 2 versions off
    t = sv.cell_table(runs).set_index("actors")
    assert t.loc[8, "runs"] == 3
    assert t.loc[8, "sps pred"] == 105 and t.loc[8, "sps real"] == 100   # medians
    assert t.loc[8, "sps err"] == pytest.approx(0.05)                      # the median run's error
    assert t.loc[8, "sps err per run"] == "-12.5% .. +5.0%"                # the runs' own errors, 105/120 - 1
    assert not t.loc[8, "goal"]                                            # one run's error > 10% fails the cell
    assert t.loc[8, "goal, median"]                                        # ... but not its median run (+5%)
    assert t.loc[8, "lag err"] == pytest.approx(0.0)
    assert t.loc[8, "_sps_worst"] == pytest.approx(0.125)
    assert t.loc[16, "lag err per run"] == "+20.0%" and not t.loc[16, "goal"]
    assert t.loc[32, "p95 diff per run"] == "+2" and not t.loc[32, "goal"]
    ok = sv.cell_table(pd.DataFrame([_run(4, 0, 104, 100, lag_pred=0.95, p95_pred=3)])).iloc[0]
    assert ok["goal"]  # 4% SPS, -5% lag, one version: within the goal
    assert not t.loc[16, "goal, median"] and not t.loc[32, "goal, median"]  # one run: the median is the run
    assert "goal met in 0 of 3 cells by every run, in 1 by the median" in sv.worst(t.reset_index())
    two = sv.cell_table(pd.DataFrame([_run(8, 0, 100, 100, lag_pred=1.0, lag_real=1.0, p95_pred=2, p95_real=2),
                                      _run(8, 1, 100, 100, lag_pred=1.0, lag_real=0.8, p95_pred=2, p95_real=2),
                                      _run(8, 2, 100, 100, lag_pred=1.0, lag_real=0.8, p95_pred=2, p95_real=2)])).iloc[0]
    assert two["lag err"] == pytest.approx(0.25) and not two["goal, median"]  # the median run's lag 25% off
    paired = sv.cell_table(pd.DataFrame([_run(8, 0, 110, 100), _run(8, 1, 90, 100), _run(8, 2, 300, 300)])).iloc[0]
    assert paired["sps err"] == pytest.approx(0.0)  # per-run errors +10%, -10%, 0: paired, not median(pred)/median(real)


def test_the_whole_run_and_the_workers_start_beside_the_goal():
    # where a set recorded them: the whole run's SPS error per run, and the start's spread and mean (medians over
    # the cell's runs); a set without the mean shows its spread alone, and one without the whole run neither
    start = {"pred_sps_run": 110.0, "real_sps_run": 100.0, "pred_start_spread": 1.0, "real_start_spread": 2.0}
    runs = pd.DataFrame([_run(8, 0, 100, 100, **start, pred_start_mean=3.0, real_start_mean=4.0),
                         _run(8, 1, 100, 100, **{**start, "pred_sps_run": 95.0}, pred_start_mean=5.0,
                              real_start_mean=6.0)])
    t = sv.cell_table(runs).iloc[0]
    assert t["run sps err per run"] == "-5.0% .. +10.0%"
    assert (t["start spread pred"], t["start spread real"]) == (1.0, 2.0)
    assert (t["start mean pred"], t["start mean real"]) == (4.0, 5.0)
    assert "| 4.00 s | 5.00 s |" in sv._md(sv.cell_table(runs)[["start mean pred", "start mean real"]])
    older = sv.cell_table(pd.DataFrame([_run(8, 0, 100, 100, **start)])).iloc[0]
    assert older["start spread pred"] == 1.0 and pd.isna(older["start mean pred"])
    assert pd.isna(sv.cell_table(pd.DataFrame([_run(8, 0, 100, 100)])).iloc[0]["start mean real"])


def test_a_drawn_lag_is_judged_over_the_cells_runs():
    # 10 runs of one cell whose mean lag is a draw: 6 at 0.4875, 4 at 0.6 (mean 0.5325); each prediction the mean of
    # its seeds' draws (0.5 in every run: within 6.1% of the runs' mean, the goal met over the runs though 4 runs
    # are 16.7% off one by one); a cell of 4 runs, or with a prediction that kept no draws, is not judged this way
    lags = [0.4875] * 6 + [0.6] * 4
    draws = dict(pred_lag_draws=0.5, pred_lag_draws_min=0.4875, pred_lag_draws_max=0.55)
    runs = pd.DataFrame([_run(4, i, 100, 100, lag_pred=0.4875, lag_real=x, **draws) for i, x in enumerate(lags)]
                        + [_run(8, i, 100, 100, **draws) for i in range(4)])
    t = sv.drawn_table(runs)
    assert list(t["actors"]) == [4]
    r = t.iloc[0]
    assert r["lag real, mean"] == pytest.approx(0.5325) and r["lag pred, mean"] == pytest.approx(0.5)
    assert r["lag err of means"] == pytest.approx(0.5 / 0.5325 - 1)
    e_lo, e_hi = (float(x.rstrip("%")) / 100 for x in r["err 95% CI"].split(" .. "))
    # the error's interval: the runs resampled (the model's side is one figure): 0.5 over the mean of 10 runs of
    # 0.4875 or 0.6, which resamples lie between (0.5 / 0.6 - 1 = -16.7% and 0.5 / 0.4875 - 1 = +2.6%)
    assert -0.167 < e_lo < r["lag err of means"] < e_hi < 0.026
    assert r["goal, over runs"] == "not shown"  # (the interval reaches past -10%: not shown met, nor missed)
    assert r["real higher"] == "4/10" and r["real range"] == "0.487 .. 0.600"
    assert r["pred draws range"] == "0.487 .. 0.550"
    lo, hi = (float(x) for x in r["real 95% CI"].split(" .. "))
    assert 0.4875 < lo < 0.5325 < hi < 0.6  # the bootstrap over the runs: inside their range, about their mean
    assert not sv.cell_table(runs[runs["actors"] == 4]).iloc[0]["goal"]  # run by run: missed
    far = runs.assign(pred_lag_draws=0.40)  # 25% under the runs' mean: the whole interval outside the goal
    assert sv.drawn_table(far).iloc[0]["goal, over runs"] == "**missed**"
    close = runs.assign(real_lag_mean=[0.50, 0.51] * 5 + [1.0] * 4)  # within 1-2% in every resample
    assert sv.drawn_table(close).iloc[0]["goal, over runs"] == "met"
    assert list(sv.drawn_table(runs[runs["repeat"] < 5])["runs"]) == [5]  # 5 runs are judged this way, 4 not
    one_missing = runs.copy()
    one_missing.loc[3, "pred_lag_draws"] = float("nan")  # (a prediction without its draws: the cell is not judged)
    assert sv.drawn_table(one_missing).empty
    assert sv.drawn_table(runs.drop(columns=["pred_lag_draws"])).empty
    # a draw below every run: the state the runs are counted above is the least of runs and draws
    assert sv.drawn_table(runs.assign(pred_lag_draws_min=0.40)).iloc[0]["real higher"] == "10/10"


def test_re_prediction_columns_are_their_own_table():
    runs = pd.DataFrame([_run(8, 0, 150, 100, re_sps=103.0, re_lag_mean=1.0, re_lag_p95=2.0)])
    assert not sv.cell_table(runs).iloc[0]["goal"]
    assert sv.cell_table(runs, pred="re").iloc[0]["goal"]
    assert sv.cell_table(runs, pred="re").iloc[0]["sps err per run"] == "+3.0%"


def test_add_replaces_a_set_and_keeps_the_others(tmp_path):
    sv.add(tmp_path, "a", {"role": "x"}, [_run(8, 0, 105, 100, set="a")], {"uniform_a8/r0": {"predicted_from": {}}})
    sv.add(tmp_path, "b", {"role": "y"}, [_run(8, 0, 90, 100, set="b")], {"uniform_a8/r0": {"predicted_from": {"u": 1}}})
    sv.add(tmp_path, "a", {"role": "x2"}, [_run(4, 0, 50, 50, set="a"), _run(4, 1, 50, 50, set="a")], {})
    runs, sets = sv.load(tmp_path)
    assert sorted(runs.groupby("set").size().items()) == [("a", 2), ("b", 1)]
    assert sets["a"]["role"] == "x2"
    costs = json.loads((tmp_path / sv.COSTS).read_text())
    assert list(costs) == ["b/uniform_a8/r0"]  # set a's old costs went with its old runs
    with pytest.raises(ValueError, match="without pred_sps"):
        sv.add(tmp_path, "c", {}, [{k: v for k, v in _run(8, 0, 1, 1).items() if k != "pred_sps"}], {})


def test_bad_compact_data_is_refused_with_what_is_wrong(tmp_path, capsys):
    sv.add(tmp_path, "a", {"role": "x"}, [_run(8, 0, 105, 100, set="a")], {})
    (tmp_path / sv.SETS).write_text("{}")
    assert report.main([str(tmp_path)]) == 2
    assert "set a is not described in sets.json" in capsys.readouterr().err
    pd.read_parquet(tmp_path / sv.RUNS).drop(columns=["real_sps"]).to_parquet(tmp_path / sv.RUNS, index=False)
    (tmp_path / sv.SETS).write_text(json.dumps({"a": {}}))
    assert report.main([str(tmp_path)]) == 2
    assert "no column real_sps" in capsys.readouterr().err
    assert report.main([str(tmp_path), "--out", str(tmp_path / "x")]) == 2  # (options the rebuild would ignore)
    assert "takes no --out" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_the_committed_report_regenerates_from_the_repo(tmp_path):
    """reports/sim_validation/report.md is what its compact data gives (rebuilt through analysis.report's CLI on a
    copy): a change to the table's code or to the data without a rebuild fails here."""
    copy = tmp_path / "sim_validation"
    shutil.copytree(COMMITTED, copy)
    (copy / "report.md").unlink()
    assert report.main([str(copy)]) == 0
    assert (copy / "report.md").read_text() == (COMMITTED / "report.md").read_text()
    runs, sets = sv.load(COMMITTED)
    costs = json.loads((COMMITTED / sv.COSTS).read_text())
    assert {sv.run_key(r) for _, r in runs.iterrows()} == set(costs)  # every prediction's costs are there
    assert all("predicted_from" in c for c in costs.values())
    roles = [m["role"] for m in sets.values()]
    assert "development set" in roles and any(r.startswith("held out") for r in roles)


def test_the_committed_scaling_study_regenerates_and_reads_its_rows(tmp_path):
    """reports/scale rebuilds byte for byte through analysis.report; its findings follow the rows: the first count
    with the learner >= 95% busy, and seed 004's rule (KL within the band at a measured lag, SPS still +10%)."""
    copy = tmp_path / "scale"
    shutil.copytree(ROOT / "reports" / "scale", copy)
    (copy / "report.md").unlink()
    assert report.main([str(copy)]) == 0
    assert (copy / "report.md").read_text() == (ROOT / "reports" / "scale" / "report.md").read_text()
    rows = pd.DataFrame({"preset": "p", "actors": [1, 2, 4, 8], "sps": [100.0, 200.0, 215.0, 215.0],
                         "learner_util": [0.5, 0.96, 0.99, 1.0], "kl_pred": [0.01, 0.02, 0.02, 0.05],
                         "kl_extrapolated": [False, False, False, False]})
    assert scale.findings(rows, 0.03) == ["p: the learner saturates by N = 2; seed 004's rule recommends N = 2"]
    assert scale.findings(rows.assign(kl_pred=0.04), 0.03)[0].endswith("no N in range meets seed 004's rule")
    assert scale.ray_findings(rows, {"board_cpu_s": 1e-3}) == []  # (a study without Ray columns)
    ray = rows.assign(sps_ray=[90.0, 180.0, 190.0, 200.0], learner_util_ray=[0.4, 0.9, 0.97, 0.99],
                      board_util_ray=[0.1, 0.3, 0.6, 0.2], steps_per_call=128)
    assert scale.ray_findings(ray, {"board_cpu_s": 1e-3}) == [
        "p on Ray: the learner saturates by N = 4; 200 SPS at N = 8 (0.93x the process runner's; within 1% of it "
        "from N = 8); the board at most 60% busy (alone it would cap near 1.28e+05 SPS: 128 steps a call, 1.00 ms an "
        "answer)"]
    flat = ray.assign(sps_ray=[90.0, 199.0, 200.0, 200.0])
    assert "within 1% of it from N = 2" in scale.ray_findings(flat, {"board_cpu_s": 1e-3})[0]
    assert scale.ray_findings(ray, {})[0].endswith("the board at most 60% busy")  # (no board cost: no cap)


@pytest.mark.parametrize("cost, says", [("unknown_name=1", ("no such cost unknown_name", "start_wait_sd_s")),
                                        ("start_wait_sd_s=soon", ("--cost takes NAME=SECONDS",)),
                                        ("start_wait_sd_s=nan", ("--cost takes NAME=SECONDS",))])
def test_a_what_ifs_bad_cost_is_refused_in_one_line(cost, says):
    """sim_validate --repredict --cost: a name the model does not have, or a value that is not a number, exits 2
    with what is wrong (it ended in a traceback from inside the model)."""
    import subprocess
    import sys
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sim_validate.py"), "--repredict", str(COMMITTED),
                        "--cost", cost], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and all(x in p.stderr for x in says) and "Traceback" not in p.stderr, p.stderr[-2000:]
