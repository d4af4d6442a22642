"""The queue lab: the fixture (the real FragmentQueue on a virtual clock) against the fluid model, its books and
bad input; the page in a real browser (Playwright driving the system Chromium), clicked and typed into."""
import shutil
from pathlib import Path

import numpy as np
import pytest

from analysis.queue_lab import LabError, age_at_departure, backlog, main, run_fixture, write_lab

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("arrival", [4.0, 2.0])
def test_unbounded_fixture_follows_the_fluid_model_at_whole_times(arrival):
    fx = run_fixture(arrival, 3.0, q0=4, horizon=8)
    whole = fx.samples[np.isclose(fx.samples["t"] % 1, 0)]
    # discrete arrivals every 1/a and services every 1/s meet the fluid line at whole times (both rates are whole)
    assert whole["depth"].tolist() == backlog(whole["t"].to_numpy(), arrival, 3.0, 4).tolist()
    dep = fx.departures
    # FIFO: while a backlog is left, each departure's age is the fluid model's age of the item leaving then; once
    # the fluid queue is empty (its age 0), a discrete fragment still waits for the next service instant (< 1/s)
    busy = dep["t"] < 4 if arrival < 3 else dep["t"] >= 0
    assert np.allclose(dep["age"][busy], age_at_departure(dep["t"][busy].to_numpy(), arrival, 3.0, 4))
    assert (dep["age"][~busy] < 1 / 3).all() and ((~busy).sum() > 0) == (arrival < 3)
    assert len(dep) == min(24, 4 + int(arrival * 8))  # one departure per service instant while there is work


def test_fixture_books_balance_under_every_policy():
    for policy in ("block", "reject", "drop_oldest"):
        fx = run_fixture(4.0, 3.0, q0=4, horizon=12, capacity=6, policy=policy, steps=8)
        t = fx.totals
        assert t["max_depth"] <= 6 and (fx.samples["depth"] <= 6).all()
        # every fragment made is served, still queued, dropped, refused or still in a blocked producer's hands
        assert t["made"] == t["served"] + t["depth_end"] + t["dropped_fragments"] + t["rejected_fragments"] \
            + t["waiting_producers_end"], policy
        lost = t["dropped_fragments"] + t["rejected_fragments"]
        assert (lost == 0) == (policy == "block"), policy
        assert t["max_bytes"] <= 6 * t["bytes_per_fragment"]


def test_block_hides_the_wait_outside_the_queue():
    # the queue's own age stops at capacity / service, but the policy lag goes past what that wait explains: the
    # fragments were made before their producers blocked, under older versions (a buffer out of the queue's sight)
    fx = run_fixture(4.0, 3.0, q0=4, horizon=20, capacity=6, policy="block", actors=4)
    dep = fx.departures
    assert dep["age"].max() <= 6 / 3 + 1e-9
    late = dep[dep["t"] > 10]
    assert (late["lag"] > 6 + 1).all()  # 6 queued ahead of it cannot explain the lag: the wait outside does
    drop = run_fixture(4.0, 3.0, q0=4, horizon=20, capacity=6, policy="drop_oldest", actors=4)
    assert drop.departures["lag"].max() <= 6  # dropping the oldest bounds lag by the queue's capacity


def test_versions_follow_the_learner_updates():
    fx = run_fixture(2.0, 3.0, q0=4, horizon=8, per_update=2)
    assert fx.totals["versions"] == fx.totals["served"] // 2
    assert (fx.departures["lag"] >= 0).all()


@pytest.mark.parametrize("kw,name", [({"arrival": 0.0}, "--arrival"), ({"service": -3.0}, "--service"),
                                     ({"capacity": 0}, "--capacity"), ({"actors": 0}, "--actors"),
                                     ({"q0": 1.5}, "--q0"), ({"horizon": float("nan")}, "--horizon"),
                                     ({"policy": "drop_newest"}, "--policy")])
def test_fixture_refuses_bad_input_naming_the_option(kw, name):
    args = {"arrival": 4.0, "service": 3.0, **kw}
    with pytest.raises(LabError, match=name):
        run_fixture(**args)


def test_command_line_bad_input_is_a_message_not_a_traceback(capsys):
    assert main(["--fixture", "--service", "0"]) == 2
    err = capsys.readouterr().err
    assert "--service must be a number > 0, got 0" in err and "Traceback" not in err
    assert main(["--arrival", "-2"]) == 2


def test_the_page_the_readme_links_is_self_contained_and_written_as_is(tmp_path):
    # README links analysis/queue_lab.html itself (open it from a clone); --lab writes the same page, with --q0
    page = (ROOT / "analysis" / "queue_lab.html").read_text()
    assert "analysis/queue_lab.html" in (ROOT / "README.md").read_text()
    assert "http" not in page.replace("http://www.w3.org/2000/svg", "")  # nothing fetched
    assert main(["--lab", "--out", str(tmp_path / "lab.html")]) == 0
    assert (tmp_path / "lab.html").read_text() == page
    assert main(["--lab", "--q0", "6", "--out", str(tmp_path / "lab6.html")]) == 0
    assert "const Q0 = 6;" in (tmp_path / "lab6.html").read_text()


def _chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_the_page_in_a_browser(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    if not _chromium():
        pytest.skip("headless Chromium not installed")
    page_file = write_lab(tmp_path / "lab.html")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"file://{page_file}")
        text = lambda sel: page.text_content(sel).strip()  # noqa: E731
        num = lambda sel: float(text(sel))  # noqa: E731
        # after Reset nothing runs until both rates are set explicitly
        page.click("#reset")
        assert page.is_disabled("#step") and page.is_disabled("#play") and text("#backlog") == "\u2014"
        page.fill("#arrival", "4")
        assert page.is_disabled("#step")
        page.fill("#service", "3")
        # the prediction is on the page before anything runs
        assert num("#t") == 0 and "grows by 1 per unit time from 4 items" in text("#prediction")
        for k in range(1, 4):
            page.click("#step")
            assert num("#t") == k and num("#backlog") == backlog(k, 4, 3, 4)
        assert num("#age") == float(age_at_departure(np.array([3.0]), 4, 3, 4)[0])  # 1.75
        # an edit keeps the time and recomputes the run from the initial four at the new rates
        page.fill("#arrival", "2")
        assert num("#t") == 3 and num("#backlog") == 1.0
        assert "is empty at t = 4" in text("#prediction")
        page.click("#play")
        assert text("#play") == "Pause"
        page.wait_for_function("+document.getElementById('t').textContent >= 5", timeout=20000)
        page.click("#play")
        assert num("#backlog") == 0 and text("#drain") == "t = 4"
        # a second run: Reset, set rates, predict drainage
        page.click("#reset")
        assert num("#t") == 0 and page.input_value("#arrival") == ""
        page.fill("#arrival", "2")
        page.fill("#service", "3")
        assert "is empty at t = 4" in text("#prediction")
        # bad input: a message naming the rate, no numbers, no NaN drawn, nothing runs
        for bad, says in (("-3", "service must be > 0"), ("0", "service must be > 0"), ("abc", 'got "abc"')):
            page.fill("#service", bad)
            assert says in text("#message") and text("#backlog") == "\u2014" and page.is_disabled("#play")
            assert "NaN" not in page.inner_html("#chart") and "NaN" not in page.inner_text("body")
        page.fill("#service", "3")
        assert text("#message") == "" and num("#backlog") == 4
        browser.close()
    assert errors == []


def test_oversized_runs_and_missing_dirs_are_messages(tmp_path, capsys):
    with pytest.raises(LabError, match="events"):
        run_fixture(4.0, 3.0, horizon=1e5)
    assert main(["--fixture", "--out", str(tmp_path / "no" / "such" / "f.png")]) == 2
    assert "directory does not exist" in capsys.readouterr().err
    assert main(["--lab", "--out", str(tmp_path / "no" / "lab.html")]) == 2
    # nothing served (service slower than the horizon): strict JSON with nulls, not NaN
    assert main(["--fixture", "--service", "0.01", "--horizon", "1", "--json"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    assert out["totals"]["age_mean"] is None
