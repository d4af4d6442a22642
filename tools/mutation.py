#!/usr/bin/env python
"""Mutation score of the core: pytest-gremlins over each module of mutation/modules.toml with its own tests.

    python tools/mutation.py                      # every module (long: not in CI)
    python tools/mutation.py --module algo --module fragment

Each mutant is named stably by its module, the stripped text of its line, the operator and the change (plus
``#n`` when that line text holds the same change more than once), never by line number or gremlin id. A surviving
mutant is *equivalent* if mutation/equivalent.toml lists it with a reason, else it *survived*.

score = killed / (total - equivalent), killed counting timeouts. mutation/score.json keeps each module's
figures, its killed mutants and its open survivors; a run exits 1 if a module scores below 90%, if a mutant that
score.json records as killed now survives, or if a survivor is neither equivalent nor already open in score.json
(so the score can only go up). It rewrites score.json for the modules it ran (--no-write to leave it).
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import time
import tomllib
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "mutation" / "modules.toml"
EQUIVALENT = ROOT / "mutation" / "equivalent.toml"
SCORE = ROOT / "mutation" / "score.json"
REPORT = ROOT / "coverage" / "gremlins" / "gremlins.json"  # where pytest-gremlins writes its JSON report
THRESHOLD = 0.90


def scope_lines(path: Path, names: List[str]) -> set:
    """Line numbers of the functions / methods named (``f`` or ``Class.method``) in a source file."""
    tree = ast.parse(path.read_text())
    lines: set = set()

    found: set = set()

    def visit(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if name in names and not isinstance(child, ast.ClassDef):
                    found.add(name)
                    first = min([d.lineno for d in child.decorator_list] + [child.lineno])
                    lines.update(range(first, child.end_lineno + 1))
                visit(child, name + ".")

    visit(tree, "")
    if set(names) - found:
        sys.exit(f"{path}: no function {', '.join(sorted(set(names) - found))} (scope in mutation/modules.toml)")
    return lines


def mutant_keys(module: str, results: List[dict], source: List[str]) -> List[Tuple[str, dict]]:
    """(stable key, result) per gremlin: module | line text | operator: change [#n]."""
    seen: Counter = Counter()
    out = []
    for r in sorted(results, key=lambda r: (r["line_number"], r["operator"], r["description"], r["gremlin_id"])):
        text = source[r["line_number"] - 1].strip()
        base = f"{module} | {text} | {r['operator']}: {r['description']}"
        seen[base] += 1
        out.append((base if seen[base] == 1 else f"{base} #{seen[base]}", r))
    return out


def load_equivalent() -> Dict[str, str]:
    if not EQUIVALENT.exists():
        return {}
    data = tomllib.loads(EQUIVALENT.read_text())
    out = {}
    for e in data.get("equivalent", []):
        key = f"{e['module']} | {e['line']} | {e['mutation']}"
        if not e.get("reason", "").strip():
            sys.exit(f"mutation/equivalent.toml: {key} has no reason")
        out[key] = e["reason"]
    return out


def run_module(name: str, mod: dict, workers: int, timeout_s: int) -> List[dict]:
    """Run pytest-gremlins on one module with its tests; the raw per-gremlin results."""
    if REPORT.exists():
        REPORT.unlink()
    cmd = ["nice", "-n", "10", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *mod["tests"]]
    if mod.get("k"):
        cmd += ["-k", mod["k"]]
    cmd += ["--gremlins", f"--gremlin-targets={mod['path']}", "--gremlin-report=json",
            f"--gremlin-mutant-timeout={timeout_s}"]
    if workers > 1:
        cmd += [f"--gremlin-workers={workers}"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "platform"), str(ROOT)]))
    log = ROOT / "coverage" / f"mutation-{name}.log"  # the tool's own output, as it goes
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"[{name}] {' '.join(cmd[3:])}  (log: {log.relative_to(ROOT)})", flush=True)
    with open(log, "w") as out:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    if not REPORT.exists():
        sys.exit(f"[{name}] pytest-gremlins wrote no report (exit {proc.returncode}); see {log}")
    return json.loads(REPORT.read_text())["results"]


def score_module(name: str, mod: dict, results: List[dict], equivalent: Dict[str, str]) -> dict:
    path = ROOT / mod["path"]
    source = path.read_text().splitlines()
    scope = scope_lines(path, mod["scope"]) if mod.get("scope") else None
    if scope is not None:
        results = [r for r in results if r["line_number"] in scope]
    killed, equiv, survived, errors = [], [], [], []
    for key, r in mutant_keys(name, results, source):
        if r["status"] in ("zapped", "timeout"):
            killed.append(key)
        elif r["status"] == "survived":
            (equiv if key in equivalent else survived).append(key)
        else:  # error: the mutant could not be tested; neither killed nor excused
            errors.append(f"{key} [{r['status']}]")
    total = len(killed) + len(equiv) + len(survived) + len(errors)
    denom = total - len(equiv)
    return {"scored_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "path": mod["path"],
            "tests": mod["tests"], "k": mod.get("k", ""), "scope": mod.get("scope", []),
            "total": total, "killed": len(killed), "equivalent": len(equiv), "survived": len(survived),
            "errors": len(errors), "score": round(len(killed) / denom, 4) if denom else 1.0,
            "killed_mutants": sorted(killed), "equivalent_mutants": sorted(equiv),
            "open_survivors": sorted(survived + errors)}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--module", action="append", help="a module of mutation/modules.toml (repeatable; default all)")
    ap.add_argument("--workers", type=int, default=2, help="parallel gremlin workers (default 2)")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per mutant's test run")
    ap.add_argument("--no-write", action="store_true", help="do not rewrite mutation/score.json")
    ap.add_argument("--from-report", type=Path, metavar="JSON",
                    help="score one --module from a saved pytest-gremlins JSON report instead of running it "
                         "(e.g. after listing equivalent mutants)")
    args = ap.parse_args(argv)
    modules = tomllib.loads(CONFIG.read_text())["modules"]
    names = args.module or list(modules)
    unknown = [n for n in names if n not in modules]
    if unknown:
        ap.error(f"unknown module {', '.join(unknown)}; allowed: {', '.join(modules)}")
    if args.from_report and len(names) != 1:
        ap.error("--from-report scores exactly one --module")
    equivalent = load_equivalent()
    previous = json.loads(SCORE.read_text()) if SCORE.exists() else {"modules": {}}
    failures: List[str] = []
    rows = {}
    for name in names:
        if args.from_report:
            results = json.loads(args.from_report.read_text())["results"]
        else:
            results = run_module(name, modules[name], args.workers, args.timeout)
            keep = ROOT / "coverage" / f"gremlins-{name}.json"  # kept for --from-report
            keep.write_text(REPORT.read_text())
        row = score_module(name, modules[name], results, equivalent)
        rows[name] = row
        before = previous["modules"].get(name, {})
        now_open = set(row["open_survivors"])
        for key in sorted(now_open & set(before.get("killed_mutants", []))):
            failures.append(f"killed before, survives now: {key}")
        for key in sorted(now_open - set(before.get("open_survivors", [])) - set(before.get("killed_mutants", []))):
            failures.append(f"new survivor, not listed as equivalent: {key}")
        if row["score"] < THRESHOLD:
            failures.append(f"{name}: score {row['score']:.1%} < {THRESHOLD:.0%}")
        print(f"[{name}] total {row['total']} killed {row['killed']} equivalent {row['equivalent']} "
              f"survived {row['survived']} errors {row['errors']} score {row['score']:.1%}", flush=True)
    used = {k for r in rows.values() for k in r["equivalent_mutants"]}
    stale = [k for k in equivalent if k.split(" | ")[0] in rows and k not in used]
    print()
    print(f"{'module':<16} {'total':>6} {'killed':>7} {'equiv':>6} {'surv':>5} {'err':>4} {'score':>7}")
    for name, r in rows.items():
        print(f"{name:<16} {r['total']:>6} {r['killed']:>7} {r['equivalent']:>6} {r['survived']:>5} "
              f"{r['errors']:>4} {r['score']:>7.1%}")
    for name, r in rows.items():
        for key in r["open_survivors"]:
            print(f"  open: {key}")
    for k in stale:
        print(f"  stale entry in mutation/equivalent.toml (no such surviving mutant): {k}")
    if not args.no_write:
        merged = dict(previous["modules"])
        merged.update(rows)
        from importlib.metadata import version
        SCORE.write_text(json.dumps({"threshold": THRESHOLD, "command": "python tools/mutation.py",
                                     "tool": f"pytest-gremlins {version('pytest-gremlins')}",
                                     "modules": merged}, indent=1, sort_keys=True) + "\n")
    for f in failures:
        print(f"FAIL {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
