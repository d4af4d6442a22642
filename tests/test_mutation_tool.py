"""tools/mutation.py's scoring: what counts as killed, equivalent, open, on a made-up report of one module."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("mutation_tool", ROOT / "tools" / "mutation.py")
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)


def test_killed_equivalent_and_open_mutants_and_the_score():
    mod = {"path": "platform/laglab/shm.py", "tests": ["tests/test_shm.py"]}
    path = ROOT / mod["path"]
    lines = path.read_text().splitlines()
    line = next(i for i, t in enumerate(lines, 1) if "def write" in t)
    r = lambda i, status, out="": {"gremlin_id": f"g{i}", "line_number": line, "operator": "op",  # noqa: E731
                                   "description": f"change {i}", "status": status, "error_output": out}
    results = [r(0, "zapped"), r(1, "timeout"), r(2, "survived"), r(3, "survived"),
               r(4, "error", "Fatal Python error: Segmentation fault"), r(5, "error", "ImportError: no module named x")]
    key = lambda i: f"shm | {lines[line - 1].strip()} | op: change {i}"  # noqa: E731
    row = tool.score_module("shm", mod, results, {key(3): "a reason"})
    # a mutant the tests could not run to a verdict (even a crash) is neither killed nor excused
    assert (row["total"], row["killed"], row["equivalent"], row["survived"], row["errors"]) == (6, 2, 1, 1, 2)
    assert row["score"] == round(2 / 5, 4)
    assert sorted(row["killed_mutants"]) == [key(0), key(1)] and row["equivalent_mutants"] == [key(3)]
    assert sorted(row["open_survivors"]) == sorted([key(2), f"{key(4)} [error]", f"{key(5)} [error]"])


def test_the_same_change_twice_on_one_line_gets_a_stable_second_name():
    src = ["x = a + b + c"]
    rs = [{"gremlin_id": g, "line_number": 1, "operator": "arithmetic", "description": "+ to -"} for g in ("b", "a")]
    keys = [k for k, _ in tool.mutant_keys("m", rs, src)]
    assert keys == ["m | x = a + b + c | arithmetic: + to -", "m | x = a + b + c | arithmetic: + to - #2"]
    assert [r["gremlin_id"] for _, r in tool.mutant_keys("m", rs, src)] == ["a", "b"]  # by id, not report order
