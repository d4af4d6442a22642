"""The first run as a new user makes it: every import the package makes is a declared dependency (checked
against pyproject.toml, so a package that happens to be installed here cannot hide a missing declaration),
and ``python train.py`` in a real pseudo-terminal, where the live progress bar runs."""
import ast
import json
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from terminal import run_in_terminal

ROOT = Path(__file__).resolve().parents[1]
# import name -> distribution, for packages whose metadata does not say (or is not installed to ask)
KNOWN = {"hydra": "hydra-core", "yaml": "pyyaml", "gymnasium": "gymnasium"}


def _norm(req: str) -> str:
    return re.split(r"[<>=!~\[; ]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def third_party_imports(folder: Path, lazy: bool = False):
    """{top-level module: [file:line, ...]} for absolute imports that are neither stdlib nor our own
    (``lazy``: only those made inside a function, i.e. only when that code runs)."""
    out = {}
    for f in folder.rglob("*.py"):
        tree = ast.parse(f.read_text(), str(f))
        in_function = {id(n) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                       for n in ast.walk(fn)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            if lazy and id(node) not in in_function:
                continue
            for n in names:
                top = n.split(".")[0]
                if top not in sys.stdlib_module_names and top != "laglab":
                    out.setdefault(top, []).append(f"{f.relative_to(ROOT)}:{node.lineno}")
    return out


def test_every_import_of_the_package_is_a_declared_dependency():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_norm(d) for d in meta["dependencies"]}
    dists = packages_distributions()
    imports = third_party_imports(ROOT / "platform")
    assert {"torch", "numpy", "hydra", "rich"} <= set(imports)  # the scan sees the package's real imports
    # an optional extra's package (ray for runner=ray, moviepy for --video) may only be imported lazily, where
    # the feature runs: a missing extra then stops that feature with its message, never the first run
    extras = {_norm(d) for reqs in meta["optional-dependencies"].values() for d in reqs}
    lazy = third_party_imports(ROOT / "platform", lazy=True)
    missing = {}
    for top, where in imports.items():
        provided = {d.lower().replace("_", "-") for d in dists.get(top, [])} | {KNOWN.get(top, top)}
        if provided & declared:
            continue
        if provided & extras and sorted(lazy.get(top, [])) == sorted(where):
            continue
        missing[top] = where
    assert not missing, f"imported but not declared in [project].dependencies: {missing}"
    assert {"ray", "moviepy"} <= set(lazy)  # the extras' imports were seen, and judged lazy


def test_the_check_fails_for_an_undeclared_import(tmp_path):
    pkg = tmp_path / "platform" / "x"
    pkg.mkdir(parents=True)
    (pkg / "m.py").write_text("import rich.progress\nimport json\nfrom laglab import config\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert set(third_party_imports(tmp_path / "platform")) == {"rich"}
    finally:
        ROOT = saved


def test_train_py_in_a_pseudo_terminal_shows_progress_and_completes(tmp_path):
    out = tmp_path / "run"
    rc, text = run_in_terminal(["train.py", "total_env_steps=20000", "tracking.wandb.mode=disabled",
                                f"hydra.run.dir={out}"], timeout=300)
    assert rc == 0, text[-3000:]
    assert "laglab" in text and "20,000" in text and "sps" in text  # the live bar drew (total and info)
    assert "Traceback" not in text
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "completed" and s["env_steps"] <= 20000
