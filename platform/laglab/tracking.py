"""Tracking: the run dir as a metrics store, Weights & Biases, and the console progress (a live bar on a
terminal, see :mod:`laglab.console`; a plain line in the log every ``console_every_s``).

Local files (pandas sees exactly what W&B shows):
- ``metrics.parquet``: one row per learner update, every scalar (``charts/``, ``losses/``, ``lag/``,
  ``transport/``, ``learner/``);
- ``histograms.parquet``: long format, one row per (update, metric) every ``hist_every`` updates, with the
  raw values;
- ``actors.parquet``: one row per (update, actor);
- ``calls.parquet`` (``runner=ray``): one row per answered rollout call, its moments on the run's clock (the
  ``wall_time`` clock; :meth:`Tracker.add_call`): about ``env_steps / (envs_per_actor x rollout_len)`` rows, the
  first :data:`CALLS_MAX_ROWS` of them kept (summary.json ``calls``: how many were kept and how many not);
- ``episodes.parquet``: one row per finished episode;
- all of them rewritten every ``flush_every_s`` seconds, so a crashed run keeps its rows;
- ``summary.json``: written at the end, also when the run fails or is interrupted (``status`` says which).

Return figures have one definition: the rolling mean of the last ``return_window`` finished episodes.
``final_return_mean`` is its value at the end; ``best_return_mean`` its maximum over the run, evaluated after
every finished episode once the window is full (so best >= final; equal to final when the run finished fewer
episodes than the window).

W&B gets the same scalar rows (at most one per ``log_interval_s``; each carries ``update`` so it can be
matched to its parquet row), the histograms, per-actor keys ``actor/<i>/...``, and the episodes as a table
at the end. ``env_steps`` is the x-axis of every metric.
"""
from __future__ import annotations

import array
import collections
import json
import logging
import math
import netrc
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Deque, Dict, Iterable, List, Mapping, Optional

import numpy as np

from . import timeline
from .actor import ActorStats, Episode
from .config import TrackingConfig
from .console import LiveBar, log_third_party_to, run_log_file

log = logging.getLogger("laglab")


def write_json_atomic(path: Path, obj: Any) -> None:
    """Strict JSON (NaN and infinities become null: ``NaN`` is not JSON)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(_finite(obj), indent=2, sort_keys=True, default=_jsonable, allow_nan=False))
    os.replace(tmp, path)


def _finite(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    return [_finite(v) for v in x] if isinstance(x, (list, tuple)) else x


def _jsonable(x: Any) -> Any:
    if hasattr(x, "item"):
        return _finite(x.item())
    if isinstance(x, (set, tuple)):
        return list(x)
    return str(x)


def _write_parquet(rows: List[Dict[str, Any]] | Dict[str, Any], path: Path) -> None:  # (rows, or columns)
    import pandas as pd  # (not on the start-up path: the first write comes after the first updates)

    tmp = path.with_suffix(".tmp.parquet")
    pd.DataFrame(rows).to_parquet(tmp, index=False)
    os.replace(tmp, path)


CALL_COLUMNS = ("actor", "incarnation", "version", "board_version", "asked", "answered", "stepping", "ended",
                "received")
CALLS_MAX_ROWS = 200_000  # calls.parquet keeps the first this many calls (9 columns of 8 bytes: 14 MB in memory; a
# rewrite at each flush takes tens of ms): a run of 1,000 workers of 128-step rollouts reaches it at 25.6M steps


# ---- W&B -------------------------------------------------------------------------------------------------
def has_wandb_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        rc = netrc.netrc(os.environ.get("NETRC") or os.path.expanduser("~/.netrc"))
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False
    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].rstrip("/")
    return rc.authenticators(host) is not None


def resolve_wandb_mode(mode: str) -> str:
    """``auto``: online when W&B credentials are configured, otherwise offline."""
    if mode != "auto":
        return mode
    return "online" if has_wandb_credentials() else "offline"


BACKGROUND_AFTER_S = 5.0  # a background W&B start waits at most this long for the actors to be started


class WandbSink:
    """One W&B run. ``background``: ``wandb.init`` runs in a thread while the run starts (an offline init takes
    1-2 s of W&B's own start-up, which no run needs to wait for), once the actors are started (its Python work
    holds the GIL the learner's thread needs to start them: 0.08 s on CartPole's path to the first env step) or
    after :data:`BACKGROUND_AFTER_S`; rows logged before it is up wait in memory and go first. An offline init
    that fails in the background costs W&B only: the run goes on (its metrics are in
    the run dir) and ``describe()`` says why. Online inits stay in the foreground: a failure there is a config
    error before anything starts."""

    def __init__(self, cfg: TrackingConfig, run_dir: Path, config: Dict[str, Any], job_type: str,
                 group: Optional[str], background: bool = False):
        self.cfg = cfg
        self.mode = resolve_wandb_mode(cfg.wandb.mode)
        self.run: Any = None
        self.error: Optional[str] = None
        self._pending: List[tuple] = []  # (row, hists) logged before the run was up
        self._ready = threading.Event()
        self._released = False  # the run is ending: a background start waits for the actors no longer
        w = cfg.wandb
        self._kwargs = dict(project=w.project, entity=w.entity, group=w.group or group, name=w.name,
                            tags=list(w.tags) or None, job_type=job_type, config=config, dir=str(run_dir),
                            reinit="finish_previous")
        if background and self.mode == "offline":
            threading.Thread(target=self._start_in_background, name="laglab-wandb-init", daemon=True).start()
        else:
            try:
                self._start()
            finally:
                self._ready.set()

    def _start(self) -> None:
        import wandb

        self.wandb = wandb
        settings = wandb.Settings(init_timeout=self.cfg.wandb.init_timeout_s, silent=True)
        try:
            self.run = wandb.init(mode=self.mode, settings=settings, **self._kwargs)
        except Exception as e:  # noqa: BLE001 - no network / bad credentials must not cost the run
            if self.cfg.wandb.mode != "auto" or self.mode == "offline":
                raise
            log.warning("W&B online init failed (%s); logging offline instead", e)
            self.mode = "offline"
            self.run = wandb.init(mode="offline", settings=settings, **self._kwargs)
        self.run.define_metric("env_steps")
        self.run.define_metric("*", step_metric="env_steps")
        if self.mode == "offline":
            why = " (auto: no W&B credentials configured)" if self.cfg.wandb.mode == "auto" else ""
            log.info("laglab: W&B is offline%s; upload this run later with: wandb sync %s", why,
                     Path(self.run.dir).parent)

    def _start_in_background(self) -> None:
        try:
            timeline.wait("actors_started", BACKGROUND_AFTER_S, unless=lambda: self._released)
            self._start()
        except BaseException as e:  # noqa: BLE001 - W&B's own errors have no common base class
            self.run = None
            self.error = f"{type(e).__name__}: {e}".strip().splitlines()[0]
            log.warning("laglab: W&B did not start (%s); the run goes on without it (its metrics are in %s)",
                        self.error, self._kwargs["dir"])
        finally:
            self._ready.set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Until the W&B run is up (or failed to start); False if ``timeout`` passed first. A background start
        still waiting for the actors (a run that ends before they start, or whose runner marks no such moment)
        starts at once."""
        if not self._ready.is_set():
            self._released = True
            timeline.wake()
        return self._ready.wait(timeout)

    def describe(self) -> Dict[str, Any]:
        """Where the W&B run is: mode, files dir, id, the dir ``wandb sync`` takes, and the URL when online (or,
        when it did not start, why)."""
        if self.run is None:
            return {"mode": self.mode, "error": self.error or "W&B did not start"}
        files = Path(self.run.dir)
        out = {"mode": self.mode, "dir": str(files), "id": self.run.id,
               "run_path": str(files.parent if files.name == "files" else files)}
        if self.mode == "online":
            out["url"] = self.run.url
        return out

    def log(self, row: Mapping[str, Any], hists: Mapping[str, np.ndarray]) -> None:
        if not self._ready.is_set():  # W&B is still starting: keep the row (the hists are the caller's arrays)
            self._pending.append((dict(row), {k: np.array(v, copy=True) for k, v in hists.items()}))
            return
        self._drain()
        self._log(row, hists)

    def _drain(self) -> None:
        pending, self._pending = self._pending, []
        if self.run is not None:
            for row, hists in pending:
                self._log(row, hists)

    def _log(self, row: Mapping[str, Any], hists: Mapping[str, np.ndarray]) -> None:
        if self.run is None:
            return
        data = dict(row)
        for k, v in hists.items():
            if len(v):
                data[k] = self.wandb.Histogram(np.asarray(v))
        try:
            self.run.log(data)
        except Exception as e:  # noqa: BLE001 - W&B failing mid-run costs W&B only (the run dir has every row)
            self.error = f"{type(e).__name__}: {e}".strip().splitlines()[0]
            log.warning("laglab: W&B stopped logging (%s); the run goes on (its metrics are in the run dir)",
                        self.error)
            self.run = None

    def finish(self, summary: Dict[str, Any], episodes: List[Dict[str, Any]], exit_code: int) -> None:
        if not self.wait(self.cfg.wandb.init_timeout_s + 30):
            log.warning("laglab: W&B has not started after %.0f s; this run's W&B record is incomplete",
                        self.cfg.wandb.init_timeout_s + 30)
            return
        self._drain()
        if self.run is None:
            return
        if episodes:
            import pandas as pd

            df = pd.DataFrame(episodes)
            self.run.log({"env_steps": int(df["env_steps"].iloc[-1]),
                          "charts/episodes_table": self.wandb.Table(dataframe=df)})
        for k, v in summary.items():
            if isinstance(v, (int, float, str, bool)):
                self.run.summary[k] = v
        self.run.finish(exit_code=exit_code)


# ---- the tracker -----------------------------------------------------------------------------------------
ACTOR_FIELDS = ("steps", "episodes", "version", "env_s", "infer_s", "throttle_s", "blocked_s", "snapshot_s",
                "rollouts", "refreshes", "discarded_steps", "cpu_s", "env_cpu_s", "cpu_wait_s", "snapshot_cpu_s",
                "snapshot_wait_s", "ask_s")


class Tracker:
    def __init__(self, run_dir: Path, cfg: Optional[TrackingConfig] = None, total_env_steps: Optional[int] = None,
                 wandb_config: Optional[Dict[str, Any]] = None, job_type: str = "ppo", group: Optional[str] = None,
                 wandb_background: bool = False):
        self.cfg = cfg or TrackingConfig()
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.window = self.cfg.return_window
        self.total = total_env_steps
        self.t0 = time.perf_counter()
        self._lock = threading.Lock()
        self._recent: Deque[float] = collections.deque(maxlen=self.window)
        self._since_log: List[Episode] = []
        self.episodes: List[Dict[str, Any]] = []
        self.rows: List[Dict[str, Any]] = []
        self.hist_rows: List[Dict[str, Any]] = []
        self.actor_rows: List[Dict[str, Any]] = []
        self.calls = {k: array.array("d") for k in CALL_COLUMNS}  # calls.parquet's columns (add_call)
        self.calls_unkept = 0  # calls past CALLS_MAX_ROWS
        self._calls_written = 0
        self.best_return_mean = -math.inf  # the rolling mean's maximum, at every episode once the window is full
        self._lag_counts: Dict[float, int] = collections.Counter()  # version lag of every trained fragment
        self._last_console = self._last_wandb = -math.inf
        self._last_flush = time.perf_counter()
        self._prev_actor: Dict[int, tuple] = {}
        self.log_s = 0.0  # wall seconds spent in tracking (W&B + parquet + console)
        log_third_party_to(run_log_file(self.run_dir))  # MuJoCo's and Ray's noise: the log file, not the terminal
        # the bar takes its own handle on the terminal before W&B wraps stdout: it never reaches W&B's output.log
        self.progress: Optional[LiveBar] = None
        if self.cfg.progress and sys.stdout.isatty() and total_env_steps:
            self.progress = LiveBar(total_env_steps)
        self.wandb: Optional[WandbSink] = None
        if self.cfg.wandb.mode != "disabled":
            try:
                self.wandb = WandbSink(self.cfg, self.run_dir, wandb_config or {}, job_type, group,
                                       background=wandb_background)
            except BaseException:
                if self.progress:
                    self.progress.close()
                raise
        self.t0 = time.perf_counter()  # the run's clock starts after the sinks are up

    def wall(self) -> float:
        return time.perf_counter() - self.t0

    def epoch_offset(self) -> float:
        """What to add to a wall-clock moment (``time.time()``) to put it on the run's clock: one reading of both
        clocks, to be used for every moment of one report (read per moment, a preemption between the two reads
        would shift one moment and not the others)."""
        return time.perf_counter() - time.time() - self.t0

    def add_call(self, row: Mapping[str, float]) -> None:
        """One answered rollout call (``runner=ray``; the receiver's thread): its actor, incarnation and version,
        and its moments on the run's clock (asked the board, held its answer, took the first env step, ended
        the rollout, and the receiver took its report: after the reports before it). Past CALLS_MAX_ROWS a call
        is counted, not kept."""
        with self._lock:
            if len(self.calls["actor"]) >= CALLS_MAX_ROWS:
                self.calls_unkept += 1
                return
            for k in CALL_COLUMNS:
                self.calls[k].append(float(row[k]))

    def add_episodes(self, episodes: Iterable[Episode], env_steps: int) -> None:
        w = self.wall()
        with self._lock:
            for ep in episodes:
                self._recent.append(ep.ret)
                if len(self._recent) >= self.window:
                    self.best_return_mean = max(self.best_return_mean, sum(self._recent) / len(self._recent))
                self._since_log.append(ep)
                self.episodes.append({"wall_time": w, "env_steps": env_steps, "actor": ep.actor_id,
                                      "env_index": ep.env_index, "return": ep.ret, "length": ep.length})

    def return_mean(self) -> float:
        with self._lock:
            return float(sum(self._recent) / len(self._recent)) if self._recent else float("nan")

    def n_episodes(self) -> int:
        with self._lock:
            return len(self.episodes)

    def _actor_rows(self, update: int, env_steps: int, wall: float, version: int,
                    actors: Mapping[int, ActorStats]) -> List[Dict[str, Any]]:
        rows = []
        for i, s in sorted(actors.items()):
            prev_steps, prev_wall = self._prev_actor.get(i, (0, 0.0))
            self._prev_actor[i] = (s.steps, wall)
            row = {"update": update, "env_steps": env_steps, "wall_time": wall, "actor": i}
            row.update({k: getattr(s, k) for k in ACTOR_FIELDS})
            row["sps"] = (s.steps - prev_steps) / max(wall - prev_wall, 1e-9)
            row["lag"] = version - s.version if s.version >= 0 else float("nan")
            rows.append(row)
        return rows

    def log_update(self, metrics: Dict[str, float], env_steps: int,
                   hists: Optional[Mapping[str, np.ndarray]] = None,
                   actors: Optional[Mapping[int, ActorStats]] = None) -> Dict[str, Any]:
        """Record one learner update (called from the learner's thread)."""
        t_in = time.perf_counter()
        wall = self.wall()
        ret = self.return_mean()
        with self._lock:
            fresh, self._since_log = self._since_log, []
        if hists is not None and "lag/version_lag" in hists:
            lags, counts = np.unique(np.asarray(hists["lag/version_lag"], dtype=np.float64), return_counts=True)
            for v, c in zip(lags.tolist(), counts.tolist()):
                self._lag_counts[v] += c
        update = len(self.rows) + 1
        row: Dict[str, Any] = {"update": update, "env_steps": env_steps, "wall_time": wall,
                               "episodic_return_mean": ret, "charts/episodic_return_mean": ret,
                               "charts/episodes": self.n_episodes(), "charts/sps": env_steps / max(wall, 1e-9)}
        row.update(metrics)
        self.rows.append(row)
        version = int(metrics.get("learner/version", update))
        a_rows = self._actor_rows(update, env_steps, wall, version, actors or {})
        self.actor_rows.extend(a_rows)
        hist_now = bool(hists) and self.cfg.hist_every > 0 and update % self.cfg.hist_every == 0
        if hist_now:
            for name, values in hists.items():
                self.hist_rows.append({"update": update, "env_steps": env_steps, "metric": name,
                                       "values": np.asarray(values, dtype=np.float64).tolist()})
        now = time.perf_counter()
        if now - self._last_flush >= self.cfg.flush_every_s:
            self._last_flush = now
            self.flush()
        if self.wandb and (hist_now or now - self._last_wandb >= self.cfg.log_interval_s):
            self._last_wandb = now
            data = dict(row)
            if fresh:
                data["charts/episodic_return"] = float(np.mean([e.ret for e in fresh]))
                data["charts/episode_length"] = float(np.mean([e.length for e in fresh]))
            for r in a_rows:
                for k in ("sps", "episodes", "version", "lag", "env_s", "infer_s", "throttle_s", "blocked_s",
                          "snapshot_s", "refreshes", "cpu_s"):
                    data[f"actor/{r['actor']}/{k}"] = r[k]
            self.wandb.log(data, hists if hist_now else {})
        elif self.wandb:
            with self._lock:  # keep the episodes for the next logged row
                self._since_log = fresh + self._since_log
        ret_text = f"{ret:.1f}" if math.isfinite(ret) else "-"  # (no episode has finished yet)
        if now - self._last_console >= self.cfg.console_every_s:
            self._last_console = now
            total = f"/{self.total}" if self.total else ""
            log.info("steps %d%s  sps %.0f  return %s  lag %.2f  queue %s  kl %.4f", env_steps, total,
                     row["charts/sps"], ret_text, row.get("lag/mean", float("nan")),
                     row.get("transport/queue_depth", "-"), row.get("losses/approx_kl", float("nan")))
        if self.progress:
            self.progress.update(env_steps, f"sps {row['charts/sps']:,.0f}  return {ret_text}  "
                                            f"lag {row.get('lag/mean', float('nan')):.2f}  "
                                            f"queue {row.get('transport/queue_depth', 0):.0f}")
        self.log_s += time.perf_counter() - t_in
        return row

    def lag_summary(self) -> Dict[str, float]:
        """Version lag of the trained data over the whole run (mean, p95, max: every trained fragment, which
        all hold the same number of transitions) and KL(behavior || current) averaged over the updates."""
        nan = float("nan")
        kl = [r["lag/kl_behavior"] for r in self.rows if "lag/kl_behavior" in r]
        out = {"mean": nan, "p95": nan, "max": nan, "kl_behavior": float(np.maximum(0.0, np.mean(kl))) if kl else nan}
        if self._lag_counts:
            values = np.array(sorted(self._lag_counts))
            counts = np.array([self._lag_counts[v] for v in values])
            out.update(mean=float((values * counts).sum() / counts.sum()),
                       p95=float(np.percentile(np.repeat(values, counts), 95)), max=float(values[-1]))
        return out

    def flush(self) -> None:
        if self.rows:
            _write_parquet(self.rows, self.run_dir / "metrics.parquet")
        if self.hist_rows:
            _write_parquet(self.hist_rows, self.run_dir / "histograms.parquet")
        if self.actor_rows:
            _write_parquet(self.actor_rows, self.run_dir / "actors.parquet")
        with self._lock:
            eps = list(self.episodes)
            n = len(self.calls["actor"])
            calls = {k: np.frombuffer(v, dtype=np.float64)[:n].copy() for k, v in self.calls.items()} \
                if n > self._calls_written else None
        if calls is not None:  # (rewritten only when it grew: a memcpy of the columns under the lock, no rows)
            for k in ("actor", "incarnation", "version", "board_version"):
                calls[k] = calls[k].astype(np.int64)
            _write_parquet(calls, self.run_dir / "calls.parquet")
            self._calls_written = n
        if eps:
            _write_parquet(eps, self.run_dir / "episodes.parquet")

    def finish(self, summary: Dict[str, Any]) -> Dict[str, Any]:
        """Write everything; safe to call on any path (completed, failed, interrupted)."""
        if self.progress:
            self.progress.close()
            self.progress = None
        self.flush()
        if not self.rows:  # an empty but readable table, so no run leaves a dir without metrics
            import pandas as pd

            pd.DataFrame({"update": [], "env_steps": [], "wall_time": []}).to_parquet(
                self.run_dir / "metrics.parquet", index=False)
        with self._lock:
            best = self.best_return_mean
        summary = dict(summary)
        summary.setdefault("final_return_mean", self.return_mean())
        summary["best_return_mean"] = best if math.isfinite(best) else summary["final_return_mean"]
        summary["return_window"] = self.window
        summary["episodes"] = self.n_episodes()
        summary["lag"] = self.lag_summary()
        summary["tracking_s"] = self.log_s
        if self.calls_unkept or len(self.calls["actor"]):
            summary["calls"] = {"kept": len(self.calls["actor"]), "unkept": self.calls_unkept}
        if self.wandb:
            self.wandb.wait(self.cfg.wandb.init_timeout_s + 30)  # (a short run can end while W&B still starts)
            summary["wandb"] = self.wandb.describe()
        write_json_atomic(self.run_dir / "summary.json", summary)
        if self.wandb:
            with self._lock:
                eps = list(self.episodes)
            self.wandb.finish(summary, eps, 0 if summary.get("status") == "completed" else 1)
            self.wandb = None
        return summary
