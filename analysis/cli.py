"""How the analysis commands end: Ctrl-C is one line and exit 130, not a traceback (their outputs are written
last, so an interrupted command leaves nothing half-written)."""
from __future__ import annotations

import sys
from typing import Callable


def interruptible(main: Callable[[], int], name: str) -> int:
    try:
        return main()
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
