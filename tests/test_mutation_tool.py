"""tools/mutation.py's scoring: what counts as killed, equivalent, open, on a made-up report of one module."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("mutation_tool", ROOT / "tools" / "mutation.py")
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)


def test_a_crash_inside_the_mutated_module_counts_as_killed_any_other_error_stays_open():
    mod = {"path": "platform/laglab/shm.py", "tests": ["tests/test_shm.py"]}
    path = ROOT / mod["path"]
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if "def write" in t)
    crash = f'Fatal Python error: Segmentation fault\n\n  File "{path}", line {line + 5} in write\n'
    elsewhere = 'Fatal Python error: Segmentation fault\n\n  File "/usr/lib/python3.11/threading.py", line 1 in run\n'
    r = lambda i, status, out="": {"gremlin_id": f"g{i}", "line_number": line, "operator": "op",  # noqa: E731
                                   "description": f"change {i}", "status": status, "error_output": out}
    results = [r(0, "zapped"), r(1, "timeout"), r(2, "survived"), r(3, "survived"), r(4, "error", crash),
               r(5, "error", elsewhere), r(6, "error", "ImportError: no module named x")]
    key = lambda i: f"shm | {path.read_text().splitlines()[line - 1].strip()} | op: change {i}"  # noqa: E731
    row = tool.score_module("shm", mod, results, {key(3): "a reason"})
    assert (row["total"], row["killed"], row["equivalent"], row["survived"], row["errors"]) == (7, 3, 1, 1, 2)
    assert row["score"] == round(3 / 6, 4)
    assert key(4) in row["killed_mutants"] and key(3) in row["equivalent_mutants"]
    assert sorted(row["open_survivors"]) == sorted([key(2), f"{key(5)} [error]", f"{key(6)} [error]"])
