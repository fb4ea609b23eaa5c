"""Run ids and the names of run branches: a run's private branch says when the run started, so other runs can tell
when it is dead (`commit.branch.drop_stale_branches`). Here, below the commit protocol, because creating a table
stages its first snapshot on such a branch too.
"""

from __future__ import annotations

import re
import time
import uuid

BRANCH_PREFIX = "icefloe_run_"
_STARTED = re.compile(r"^(\d{10,})_")  # a run id begins with its start, in whole seconds since the epoch


def new_run_id(started: float | None = None) -> str:
    """A unique run id that says when the run started (so other runs can tell when its branch is dead)."""
    return f"{int(time.time() if started is None else started)}_{uuid.uuid4().hex[:12]}"


def run_started(run_id: str) -> float | None:
    """When the run started (epoch seconds), or None for an id that does not say (e.g. an older icefloe's)."""
    match = _STARTED.match(run_id)
    return float(match.group(1)) if match else None


def branch_name(run_id: str) -> str:
    """The private branch of one run (and what `drop_stale_branches` recognizes)."""
    return f"{BRANCH_PREFIX}{run_id}"
