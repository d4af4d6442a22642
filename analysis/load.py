"""Load: any mix of run dirs and multirun (sweep) dirs becomes one tidy pandas table, one row per run: the
resolved config flattened to dotted keys (from ``.hydra/config.yaml``), the command-line overrides, the
summary (status, env steps, SPS, returns, the transport books), the provenance the run recorded, and the
evaluation score (``eval.*``: evaluate.py's newest deterministic score of this run's checkpoints/final.pt
without config overrides, from ``evals.jsonl``) where there is one.

A report dir (``runs.csv`` + ``curves.parquet``, what ``analysis.report`` writes) stands for the runs it was
built from: its compact files are all a report needs to be rebuilt."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Iterable, List

import pandas as pd
import yaml


class AnalysisError(ValueError):
    """A user-caused problem with the runs asked for; the message says what and how to proceed."""


# the compact files of a report dir
RUNS_CSV, CURVES, LAG_COUNTS, REPORT_JSON = "runs.csv", "curves.parquet", "lag_counts.csv", "report.json"


def is_report_dir(p: str | Path) -> bool:
    """A dir holding a report's compact data (runs.csv and curves.parquet)."""
    p = Path(p)
    return (p / RUNS_CSV).is_file() and (p / CURVES).is_file()


NO_SUMMARY = "no summary (killed, or still running)"


def is_run_dir(p: Path) -> bool:
    """A run dir: summary.json, or a run's composed config (.hydra/config.yaml) beside its log or metrics: a
    run killed before it could write its summary (SIGKILL, the machine restarting) or still running."""
    return (p / "summary.json").is_file() or ((p / ".hydra" / "config.yaml").is_file() and any(
        (p / f).exists() for f in ("train.log", "metrics.parquet")))


def find_runs(paths: Iterable[str | Path]) -> List[Path]:
    """Every run dir at or below the given paths, sorted, without repeats: those with a summary.json and those
    without one yet (killed or running; :func:`load_run` gives them the status ``NO_SUMMARY``)."""
    out = set()
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such run or sweep dir")
        if is_report_dir(p) and not (p / "summary.json").exists():
            continue
        if is_run_dir(p):
            out.add(p.resolve())
        else:
            out.update(s.parent.resolve() for s in p.rglob("summary.json"))
            out.update(c.parent.parent.resolve() for c in p.rglob(".hydra/config.yaml") if is_run_dir(c.parent.parent))
    old = [p for p in map(Path, paths) if (p / RUNS_CSV).is_file() and not (p / CURVES).is_file()]
    if not out and old:
        raise FileNotFoundError(f"{old[0]}: a report without its compact data (no {CURVES}; built before reports "
                                "carried their curves): rebuild it from its run dirs")
    if not out and not any(is_report_dir(p) for p in map(Path, paths)):
        raise FileNotFoundError(f"no run dirs (with a summary.json) under {', '.join(map(str, paths))}")
    return sorted(out)


def flatten(d: Dict, prefix: str = "") -> Dict[str, object]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists become strings (so they can be grouped on)."""
    out: Dict[str, object] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        elif isinstance(v, (list, tuple)):
            out[key] = json.dumps(v)
        else:
            out[key] = v
    return out


def run_config(cfg_file: Path, summary: Dict) -> Dict:
    """A run's ``.hydra/config.yaml`` (as composed, before interpolation), with ``actors: auto`` replaced by the
    count the run used (summary.json ``actors``): groups and figures need the number."""
    cfg = yaml.safe_load(Path(cfg_file).read_text()) or {}
    if cfg.get("actors") == "auto" and isinstance(summary.get("actors"), int):
        cfg["actors"] = summary["actors"]
    return cfg


def load_run(run_dir: Path) -> Dict[str, object]:
    run_dir = Path(run_dir)
    sp = run_dir / "summary.json"
    s = json.loads(sp.read_text()) if sp.exists() else {}
    status = s.get("status", "unknown") if sp.exists() else NO_SUMMARY
    row: Dict[str, object] = {"run_dir": str(run_dir), "status": status}
    cfg_file = run_dir / ".hydra" / "config.yaml"
    if cfg_file.exists():
        row.update({f"cfg.{k}": v for k, v in flatten(run_config(cfg_file, s)).items()})
    ov = run_dir / ".hydra" / "overrides.yaml"
    row["overrides"] = " ".join(yaml.safe_load(ov.read_text()) or []) if ov.exists() else ""
    for k, v in s.items():
        if isinstance(v, (int, float, str, bool)) or v is None:
            row[f"summary.{k}"] = v
    t = s.get("transport") or {}
    produced = max(1, int(t.get("produced", 0) or 0))
    row["transport.balanced"] = t.get("balanced")
    for bucket in ("dropped", "rejected"):
        for reason, n in (t.get(bucket) or {}).items():
            row[f"{bucket}_frac.{reason}"] = n / produced
        row[f"{bucket}_frac"] = sum((t.get(bucket) or {}).values()) / produced
    for k, v in flatten(s.get("provenance") or {}).items():
        row[f"provenance.{k}"] = v
    ev = run_dir / "evals.jsonl"  # evaluate.py's scores: the newest of the final checkpoint, as trained
    if ev.exists():
        evals = [json.loads(line) for line in ev.read_text().splitlines() if line.strip()]
        own = (run_dir / "checkpoints" / "final.pt").resolve()
        evals = [e for e in evals if e.get("checkpoint") and Path(e["checkpoint"]).resolve() == own
                 and e.get("mode") == "deterministic" and not e.get("overrides")]
        if evals:
            for k in ("return_mean", "return_std", "episodes", "mode"):
                row[f"eval.{k}"] = evals[-1].get(k)
    return row


def load(paths: Iterable[str | Path]) -> pd.DataFrame:
    """One row per run dir found under ``paths`` (report dirs are not read here); config columns are
    ``cfg.<dotted key>``."""
    return pd.DataFrame([load_run(r) for r in find_runs(paths)])


def metrics(run_dir: str | Path) -> pd.DataFrame:
    """metrics.parquet of one run (one row per learner update; empty for a run killed before its first flush)."""
    p = Path(run_dir) / "metrics.parquet"
    return pd.read_parquet(p) if p.exists() else pd.DataFrame(columns=["update", "env_steps", "wall_time"])


def histograms(run_dir: str | Path) -> pd.DataFrame:
    p = Path(run_dir) / "histograms.parquet"
    return pd.read_parquet(p) if p.exists() else pd.DataFrame(columns=["update", "env_steps", "metric", "values"])
