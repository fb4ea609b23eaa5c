"""Per-batch metrics as CloudWatch embedded metric format (EMF) lines: no API call, no extra permission.

With `icefloe run --metrics emf` (what the deployed jobs run) the job prints one JSON line per table after every
batch attempt to stdout; EMR Serverless ships the driver's stdout to the stack's CloudWatch Logs group, where
CloudWatch extracts the metrics (namespace `icefloe`, dimension `Table` = `database.table`). A line comes after every
attempt, including up-to-date and failed ones, so it is also the job's heartbeat on AWS: the stack's lag alarm
treats a window without any line as breaching.

Metrics: RecordsCommitted (rows written), BadRecords (skipped or sent to the DLQ), BatchFailed (1 when the attempt
failed), MaintenanceFailed (1, only when maintenance after a committed batch failed: the batch stands),
BatchDuration (s), LagRecords and LagSeconds (after the batch, when the broker answered), BytesWritten
(data and delete files the commit added), RecordsLost (deleted before they were read, `onDataLoss: warn`).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from typing import TextIO

NAMESPACE = "icefloe"
DIMENSION = "Table"
UNITS = {
    "RecordsCommitted": "Count",
    "BadRecords": "Count",
    "BatchFailed": "Count",
    "MaintenanceFailed": "Count",
    "BatchDuration": "Seconds",
    "LagRecords": "Count",
    "LagSeconds": "Seconds",
    "BytesWritten": "Bytes",
    "RecordsLost": "Count",
}


@dataclass(frozen=True)
class BatchMetrics:
    table: str
    topic: str
    status: str  # committed | up-to-date | yielded | waiting | failed
    duration_s: float
    records_committed: int = 0
    bad_records: int = 0
    records_lost: int = 0
    lag_records: int | None = None
    lag_seconds: float | None = None
    bytes_written: int | None = None
    run_id: str = ""
    error: str = ""
    maintenance_error: str = ""  # maintenance after the batch failed (reported apart: the batch stands)

    def values(self) -> dict[str, float]:
        """Metric name -> value; metrics not measured this time are left out (EMF forbids declaring them empty)."""
        values = {
            "RecordsCommitted": self.records_committed,
            "BadRecords": self.bad_records,
            "BatchFailed": 1 if self.status in ("waiting", "failed") else 0,
            "MaintenanceFailed": 1 if self.maintenance_error else None,  # only on a failure: a quiet line stays short
            "BatchDuration": round(self.duration_s, 3),
            "RecordsLost": self.records_lost,
            "LagRecords": self.lag_records,
            "LagSeconds": None if self.lag_seconds is None else round(self.lag_seconds, 1),
            "BytesWritten": self.bytes_written,
        }
        return {name: value for name, value in values.items() if value is not None}


def emf_document(metrics: BatchMetrics, timestamp_ms: int | None = None) -> dict:
    """One EMF log event: the `_aws` metadata, the dimension and metric values at the root, context as properties."""
    values = metrics.values()
    return {
        "_aws": {
            "Timestamp": int(time.time() * 1000) if timestamp_ms is None else timestamp_ms,
            "CloudWatchMetrics": [
                {
                    "Namespace": NAMESPACE,
                    "Dimensions": [[DIMENSION]],
                    "Metrics": [{"Name": name, "Unit": UNITS[name]} for name in values],
                }
            ],
        },
        DIMENSION: metrics.table,
        **values,
        # Properties: searchable in Logs Insights, not metrics.
        "Topic": metrics.topic,
        "Status": metrics.status,
        "RunId": metrics.run_id,
        **({"Error": metrics.error} if metrics.error else {}),
        **({"MaintenanceError": metrics.maintenance_error} if metrics.maintenance_error else {}),
    }


def emit(metrics: BatchMetrics, stream: TextIO | None = None) -> None:
    """Print the EMF line (one line: CloudWatch Logs takes each line as one event)."""
    print(json.dumps(emf_document(metrics), separators=(",", ":")), file=stream or sys.stdout, flush=True)
