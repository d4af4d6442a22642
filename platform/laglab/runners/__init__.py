"""Runners start and supervise actors and move their fragments to the learner. Imported on demand, so an
actor process loads only what it runs (no torch)."""
from __future__ import annotations

import importlib
from typing import Any, Callable, Dict

from ..config import RunnerKind


def get(kind: RunnerKind) -> Callable[..., Dict[str, Any]]:
    return importlib.import_module(f"{__name__}.{RunnerKind(kind).value}").run
