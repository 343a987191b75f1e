"""Progress lines for a terminal the notebook does not reach.

A study notebook runs inside a papermill kernel: its tqdm bars go into the notebook (one updating bar per run),
not to the terminal that started `./reproduce.sh`. That script sets `DPPO_PROGRESS_FILE` and follows the file, so
each study's runs and steps (with their ETA) show live there; without the variable `note` does nothing.
"""

from __future__ import annotations

import os
import time


def note(line: str) -> None:
    """Append one timestamped line to $DPPO_PROGRESS_FILE (no-op when unset)."""
    path = os.environ.get("DPPO_PROGRESS_FILE")
    if path:
        with open(path, "a") as f:
            f.write(f"[{time.strftime('%H:%M:%S')}] {line}\n")


class Throttle:
    """Callable that is True at most once every `every_s` seconds (and on its first call)."""

    def __init__(self, every_s: float):
        self.every_s, self.last = every_s, -float("inf")

    def __call__(self) -> bool:
        now = time.monotonic()
        if now - self.last < self.every_s:
            return False
        self.last = now
        return True
