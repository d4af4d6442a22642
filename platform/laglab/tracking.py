"""The run dir as a metrics store: ``metrics.parquet`` (one row per learner update), ``episodes.parquet``
(one row per finished episode), ``summary.json``; plus a periodic console line."""
from __future__ import annotations

import collections
import json
import logging
import math
import os
import threading
import time
from pathlib import Path
from typing import Any, Deque, Dict, Iterable, List, Optional

import pandas as pd

from .actor import Episode

log = logging.getLogger("laglab")


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=_jsonable))
    os.replace(tmp, path)


def _jsonable(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, (set, tuple)):
        return list(x)
    return str(x)


def _write_parquet(rows: List[Dict[str, Any]], path: Path) -> None:
    tmp = path.with_suffix(".tmp.parquet")
    pd.DataFrame(rows).to_parquet(tmp, index=False)
    os.replace(tmp, path)


class Tracker:
    def __init__(self, run_dir: Path, window: int = 20, flush_every: int = 50, console_every_s: float = 5.0,
                 total_env_steps: Optional[int] = None):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.window = window
        self.flush_every = flush_every
        self.console_every_s = console_every_s
        self.total = total_env_steps
        self.t0 = time.perf_counter()
        self._lock = threading.Lock()
        self._recent: Deque[float] = collections.deque(maxlen=window)
        self.episodes: List[Dict[str, Any]] = []
        self.rows: List[Dict[str, Any]] = []
        self.best_return_mean = -math.inf
        self._last_console = self.t0

    def wall(self) -> float:
        return time.perf_counter() - self.t0

    def add_episodes(self, episodes: Iterable[Episode], env_steps: int) -> None:
        w = self.wall()
        with self._lock:
            for ep in episodes:
                self._recent.append(ep.ret)
                self.episodes.append({"wall_time": w, "env_steps": env_steps, "actor": ep.actor_id,
                                      "env_index": ep.env_index, "return": ep.ret, "length": ep.length})

    def return_mean(self) -> float:
        with self._lock:
            return float(sum(self._recent) / len(self._recent)) if self._recent else float("nan")

    def n_episodes(self) -> int:
        with self._lock:
            return len(self.episodes)

    def log_update(self, metrics: Dict[str, float], env_steps: int) -> Dict[str, Any]:
        ret = self.return_mean()
        with self._lock:
            full_window = len(self._recent) >= self.window
        if full_window and ret > self.best_return_mean:
            self.best_return_mean = ret
        row = {"update": len(self.rows) + 1, "env_steps": env_steps, "wall_time": self.wall(),
               "episodic_return_mean": ret, "episodes": self.n_episodes()}
        row.update(metrics)
        row["charts/sps"] = env_steps / max(row["wall_time"], 1e-9)
        self.rows.append(row)
        if self.flush_every and len(self.rows) % self.flush_every == 0:
            self.flush()
        now = time.perf_counter()
        if now - self._last_console >= self.console_every_s:
            self._last_console = now
            total = f"/{self.total}" if self.total else ""
            log.info("steps %d%s  sps %.0f  return %.1f  lag %.2f  queue %s  kl %.4f", env_steps, total,
                     row["charts/sps"], ret, row.get("lag/mean", float("nan")), row.get("transport/queue_depth", "-"),
                     row.get("losses/approx_kl", float("nan")))
        return row

    def flush(self) -> None:
        if self.rows:
            _write_parquet(self.rows, self.run_dir / "metrics.parquet")
        with self._lock:
            eps = list(self.episodes)
        if eps:
            _write_parquet(eps, self.run_dir / "episodes.parquet")

    def finish(self, summary: Dict[str, Any]) -> Dict[str, Any]:
        self.flush()
        if not self.rows:  # an empty but readable table, so no run leaves a dir without metrics
            pd.DataFrame({"update": [], "env_steps": [], "wall_time": []}).to_parquet(
                self.run_dir / "metrics.parquet", index=False)
        best = self.best_return_mean
        summary = dict(summary)
        summary.setdefault("final_return_mean", self.return_mean())
        summary["best_return_mean"] = best if math.isfinite(best) else summary["final_return_mean"]
        summary["episodes"] = self.n_episodes()
        write_json_atomic(self.run_dir / "summary.json", summary)
        return summary
