"""Runners start and supervise actors and move their fragments to the learner."""
from __future__ import annotations

from typing import Any, Callable, Dict

from ..config import RunnerKind
from . import sync, thread

RUNNERS: Dict[RunnerKind, Callable[..., Dict[str, Any]]] = {
    RunnerKind.thread: thread.run,
    RunnerKind.sync: sync.run,
}
