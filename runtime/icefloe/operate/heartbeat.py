"""A continuous job's heartbeat per table: when it last checked the table and what it saw.

Written as `<state dir>/heartbeat/<database.table>.json` when a batch starts (`running`), when it ends (`committed`,
`up-to-date`, `yielded` to other runs that committed first, `waiting` for an unreachable source or catalog,
`failed` on a bad record or config: a continuous job suspends the table) and when a continuous job stops cleanly (`stopped`), with the process id and host. `icefloe status` reads it to tell a job that checks an idle table ("idle") from one
that stopped, died or hangs ("stuck"); on AWS the per-batch metric line (`icefloe.operate.metrics`) is the heartbeat.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

RUNNING = "running"
FAILED = "failed"
STOPPED = "stopped"


@dataclass(frozen=True)
class Heartbeat:
    table: str
    checked_at: float  # epoch seconds
    outcome: str  # running | committed | up-to-date | yielded | waiting | failed | stopped
    detail: str = ""  # what it saw: the batch's result, or why it waits or failed
    offsets: dict[str, int] = field(default_factory=dict)  # the table's next offsets as the job last saw them
    pid: int = field(default_factory=os.getpid)
    host: str = field(default_factory=socket.gethostname)

    def age(self, now: float | None = None) -> float:
        return max(0.0, (time.time() if now is None else now) - self.checked_at)

    def process_alive(self) -> bool | None:
        """Whether the writing process still runs (None when it ran on another host: unknown from here)."""
        if self.host != socket.gethostname():
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # alive, owned by someone else
            return True
        return True

    def as_dict(self, now: float | None = None) -> dict:
        data = asdict(self)
        data["checked_at"] = dt.datetime.fromtimestamp(self.checked_at, dt.UTC).isoformat(timespec="seconds")
        data["age_seconds"] = round(self.age(now), 1)
        data["process_alive"] = self.process_alive()
        return data


def heartbeat_path(state_dir: Path, identifier: str) -> Path:
    return state_dir / "heartbeat" / f"{identifier}.json"


def write_heartbeat(state_dir: Path, beat: Heartbeat) -> None:
    """Replace the table's heartbeat atomically (a reader never sees half a file)."""
    path = heartbeat_path(state_dir, beat.table)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps(asdict(beat), sort_keys=True))
    partial.replace(path)


def read_heartbeat(state_dir: Path, identifier: str) -> Heartbeat | None:
    path = heartbeat_path(state_dir, identifier)
    try:
        return Heartbeat(**json.loads(path.read_text()))
    except (FileNotFoundError, ValueError, TypeError):  # none yet, or not one of ours
        return None
