"""laglab analysis: run dirs -> one tidy table -> measures per run -> statistics per group -> figures -> report.

Reads run dirs only (never imports the runners). Run from the repo root::

    python -m analysis.report <run or sweep dirs...> --out <dir>
"""
