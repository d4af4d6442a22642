"""W&B dashboards as code: a saved workspace view (and, for a sweep, a report) with the panels laglab's metrics
need, built with ``wandb-workspaces`` (pip install -e ".[dashboard]").

    python -m laglab.dashboard --entity E --project P [--group G] [--by algo.name actor.fixed_lag]
    python -m laglab.dashboard --entity E --project P --group G --report --runs multirun/<date>/<time> \
        --summary reports/<study>/summary.csv
    python -m laglab.dashboard --entity E --project P --dry-run        # build offline, print the JSON

Sections: return (against env steps and wall clock), lag (version-lag histogram, min/mean/max, KL(behavior ||
current), kept fraction, importance-sampling ESS), transport (queue depth and bytes, data-age histogram, admitted /
dropped / rejected and each by reason: lag, kl, refresh, shutdown, non_finite, ..., in flight, unaccounted), learner (waiting vs computing, per-fragment time, updates/s), losses,
and per-actor panels (one line per actor). ``--group`` shows one sweep (train.py -m logs a sweep as one W&B group),
grouped by the swept keys (``--by``, or read from ``--runs``: the keys whose values differ between its runs).
``--report`` builds a W&B report from the same panels and a report's summary table (``--summary``).

Saving needs a W&B account (``wandb login``); ``--dry-run`` builds the same objects offline and prints their JSON.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple


@dataclass(frozen=True)
class Panel:
    title: str
    y: Tuple[str, ...] = ()  # metric keys, exactly as laglab logs them
    regex: Optional[str] = None  # or every key matching this (per-actor keys, per-reason counters)
    x: str = "env_steps"


SECTIONS: Dict[str, List[Panel]] = {
    "Return": [Panel("episodic return (last 20) vs env steps", ("charts/episodic_return_mean",)),
               Panel("episodic return vs wall clock", ("charts/episodic_return_mean",), x="_runtime"),
               Panel("env steps per second", ("charts/sps",))],
    "Lag": [Panel("version lag of trained data (histogram)", ("lag/version_lag",)),
            Panel("version lag min / mean / max", ("lag/min", "lag/mean", "lag/max")),
            Panel("KL(behavior || current)", ("lag/kl_behavior",)),
            Panel("kept fraction (max_policy_lag, max_kl_behavior)", ("lag/kept_frac",)),
            Panel("importance-sampling ESS (fraction of the batch)", ("lag/is_ess",))],
    "Transport": [Panel("queue depth (fragments)", ("transport/queue_depth",)),
                  Panel("queue bytes", ("transport/queue_bytes",)),
                  Panel("data age in the queue (histogram, s)", ("transport/age_s",)),
                  Panel("data age mean / max (s)", ("transport/age_s_mean", "transport/age_s_max")),
                  Panel("admitted / dropped / rejected (transitions)",
                        ("transport/admitted", "transport/dropped", "transport/rejected")),
                  Panel("dropped, by reason (transitions)", regex=r"transport/dropped/.*"),
                  Panel("rejected, by reason (transitions)", regex=r"transport/rejected/.*"),
                  Panel("in flight and its parts", regex=r"transport/in_flight.*"),
                  Panel("unaccounted (must stay 0)", ("transport/unaccounted",))],
    "Learner": [Panel("waiting for data vs computing (s per update)", ("learner/wait_s", "learner/compute_s")),
                Panel("share of time waiting", ("learner/wait_frac",)),
                Panel("time on arriving fragments (s per update)", ("learner/offer_s",)),
                Panel("updates per second", ("learner/updates_per_s",))],
    "Losses": [Panel("policy loss", ("losses/policy_loss",)), Panel("value loss", ("losses/value_loss",)),
               Panel("entropy", ("losses/entropy",)), Panel("approx KL (k3)", ("losses/approx_kl",)),
               Panel("clip fraction", ("losses/clip_frac", "losses/dual_clip_frac")),
               Panel("explained variance", ("losses/explained_variance",))],
    "Actors": [Panel("env steps per second, per actor", regex=r"actor/\d+/sps"),
               Panel("versions behind the learner, per actor", regex=r"actor/\d+/lag"),
               Panel("time in env steps (s), per actor", regex=r"actor/\d+/env_s"),
               Panel("time in inference (s), per actor", regex=r"actor/\d+/infer_s"),
               Panel("time throttled (s), per actor", regex=r"actor/\d+/throttle_s"),
               Panel("time blocked on the queue (s), per actor", regex=r"actor/\d+/blocked_s"),
               Panel("time loading snapshots (s), per actor", regex=r"actor/\d+/snapshot_s")],
}


def swept_keys(runs_dir: Path) -> List[str]:
    """The config keys whose values differ between the runs under ``runs_dir`` (a Hydra sweep dir), but the seed."""
    import yaml

    vals: Dict[str, set] = {}
    config: Dict = {}
    files = sorted(Path(runs_dir).rglob(".hydra/overrides.yaml"))
    seen: Dict[str, int] = {}
    for ov in files:
        for item in yaml.safe_load(ov.read_text()) or []:
            k, _, v = str(item).lstrip("+~").partition("=")
            if not k.startswith(("hydra.", "tracking.")):
                vals.setdefault(k, set()).add(v)
                seen[k] = seen.get(k, 0) + 1
        cfg_file = ov.parent / "config.yaml"
        if not config and cfg_file.is_file():
            config = yaml.safe_load(cfg_file.read_text()) or {}
    for k, n in seen.items():  # set on some runs only: the others ran its default, another value
        if n < len(files):
            vals[k].add("<default>")
    if not vals:
        raise ValueError(f"{runs_dir}: no run dirs with .hydra/overrides.yaml under it")
    out = []
    for k in sorted(k for k, v in vals.items() if len(v) > 1 and k != "seed"):  # (seeds pool within a group)
        node = config.get(k) if "." not in k else None
        if isinstance(node, dict):  # a config group (algo=vtrace): group runs by what names the choice
            k = f"{k}.name" if "name" in node else f"{k}.id" if "id" in node else k
        out.append(k)
    return out


def _line(p: Panel):
    import wandb_workspaces.reports.v2 as wr

    kw = {"metric_regex": p.regex} if p.regex else {"y": list(p.y)}
    return wr.LinePlot(title=p.title, x=p.x, **kw)


def workspace(entity: str, project: str, group: Optional[str] = None, by: Sequence[str] = (),
              name: str = "laglab"):
    """The saved view: one section per entry of SECTIONS; a sweep group filtered and grouped by its swept keys."""
    import wandb_workspaces.workspaces as ws

    sections = [ws.Section(name=s, panels=[_line(p) for p in panels], is_open=s in ("Return", "Lag"))
                for s, panels in SECTIONS.items()]
    settings = ws.RunsetSettings(filters=[ws.Metric("Group") == group] if group else "",
                                 groupby=[ws.Config(k) for k in by])
    return ws.Workspace(entity=entity, project=project, name=f"{name} {group}" if group else name,
                        sections=sections, runset_settings=settings)


def report(entity: str, project: str, group: Optional[str], by: Sequence[str], summary_md: str = "",
           offline: bool = False):
    """A W&B report of a sweep: the summary table of analysis.report, then one panel grid per section.
    ``offline``: the run sets name no project (wandb-workspaces looks a named project up on the server)."""
    import wandb_workspaces.reports.v2 as wr

    import wandb_workspaces.workspaces as ws

    rs = wr.Runset(entity="" if offline else entity, project="" if offline else project, name=group or "runs",
                   filters=[ws.Metric("Group") == group] if group else "",
                   groupby=[f"config.{k}" for k in by])  # (a report's grouping keys name their section: config.)
    blocks = [wr.H1(f"laglab sweep {group}" if group else "laglab runs"),
              wr.P("Built by python -m laglab.dashboard --report: laglab's panels, grouped by the swept keys "
                   f"({', '.join(by) or 'none'}).")]
    if summary_md:
        blocks += [wr.H2("Summary (analysis.report)"), wr.MarkdownBlock(text=summary_md)]
    for s, panels in SECTIONS.items():
        blocks += [wr.H2(s), wr.PanelGrid(runsets=[rs], panels=[_line(p) for p in panels])]
    return wr.Report(project=project, entity=entity, title=f"laglab: {group or project}", blocks=blocks)


def to_json(obj) -> dict:
    """The object as the W&B API would receive it (built offline)."""
    return json.loads(obj._to_model().model_dump_json(by_alias=True, exclude_none=True))


def keys_used() -> Tuple[List[str], List[str]]:
    """(exact metric keys, regexes) every panel reads: the test checks them against a real run's history."""
    exact = sorted({k for ps in SECTIONS.values() for p in ps for k in p.y})
    regex = sorted({p.regex for ps in SECTIONS.values() for p in ps if p.regex})
    return exact, regex


def summary_table(summary_csv: Path) -> str:
    """A report's summary.csv (``python -m analysis.report ... --out <dir>`` writes <dir>/summary.csv) as a
    markdown table."""
    import pandas as pd

    table = pd.read_csv(summary_csv)
    cols = [str(c) for c in table.columns]
    cell = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    rows += ["| " + " | ".join(cell(v) for v in r) + " |" for r in table.itertuples(index=False)]
    return "\n".join(rows)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m laglab.dashboard", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entity", required=True)
    ap.add_argument("--project", required=True)
    ap.add_argument("--group", help="a sweep's W&B group (train.py -m: the sweep dir)")
    ap.add_argument("--by", nargs="*", default=None, help="config keys to group runs by (default: swept keys of --runs)")
    ap.add_argument("--runs", help="the sweep dir on disk: its swept keys group the runs")
    ap.add_argument("--summary", help="--report: a report's summary.csv (python -m analysis.report <sweep> --out D "
                                      "writes D/summary.csv), shown as the report's table")
    ap.add_argument("--report", action="store_true", help="also build a W&B report")
    ap.add_argument("--name", default="laglab", help="the workspace view's name")
    ap.add_argument("--dry-run", action="store_true", help="build offline and print the JSON; save nothing")
    a = ap.parse_args(argv)
    try:
        import wandb_workspaces  # noqa: F401
    except ImportError:
        print('laglab.dashboard: needs wandb-workspaces: pip install -e ".[dashboard]"', file=sys.stderr)
        return 2
    try:
        by = a.by if a.by is not None else (swept_keys(Path(a.runs)) if a.runs else [])
        summary = summary_table(Path(a.summary)) if a.report and a.summary else ""
    except (ValueError, FileNotFoundError) as e:
        print(f"laglab.dashboard: {e}", file=sys.stderr)
        return 2
    view = workspace(a.entity, a.project, a.group, by, a.name)
    rep = report(a.entity, a.project, a.group, by, summary, offline=a.dry_run) if a.report else None
    if a.dry_run:
        out = {"workspace": to_json(view)}
        if rep is not None:
            out["report"] = to_json(rep)
        print(json.dumps(out, indent=1))
        return 0
    try:
        view.save()
        print(f"workspace: {view.url}")
        if rep is not None:
            rep.save()
            print(f"report: {rep.url}")
    except Exception as e:  # noqa: BLE001 - the W&B API's errors (no login, no network, no such entity)
        print(f"laglab.dashboard: could not save to W&B ({type(e).__name__}: {e}); it needs a W&B account "
              "(wandb login) and network; --dry-run builds the same objects offline", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
