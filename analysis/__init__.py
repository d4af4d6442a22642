"""laglab analysis: run dirs -> one tidy table -> measures per run -> statistics per group -> figures -> report.

Reads run dirs only (never imports the runners). Installed with the project (``pip install -e .``), so from
anywhere::

    import analysis
    runs = analysis.load_runs(["multirun/2026-12-01/10-00-00"])      # one row per run, measures included
    curves = analysis.curves(["multirun/2026-12-01/10-00-00"])       # long: run_id, env_steps, return, ...
    table = analysis.summarize(runs, by=["cfg.algo.name", "cfg.actor.fixed_lag"],
                               baseline={"cfg.actor.fixed_lag": "0"})  # IQM [CI], ΔAUC, PoI per group

and the report: ``python -m analysis.report <run or sweep dirs...> --out <dir>``.
"""
from .compare import cost_differences, normalized_aggregates, select, summarize, varying_keys
from .load import AnalysisError
from .runs import curves, load_runs

__all__ = ["load_runs", "curves", "summarize", "cost_differences", "normalized_aggregates", "select",
           "varying_keys", "AnalysisError"]
