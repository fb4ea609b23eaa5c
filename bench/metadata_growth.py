"""Continuous mode's metadata after 10,000 micro-batches: does anything grow without bound?

Each micro-batch is what the continuous loop commits, through Iceberg's Java API (no Spark job, so 10,000 take
minutes, not hours): a branch created at main's head, an append on it of one data file (a 1 KiB Parquet file's
metadata; no bytes are written) carrying the checkpoint summary of a 64-partition topic (offsets, leader epochs, an
upsert table's partition clocks, the known records of a broker without topic ids, the throughput), main
fast-forwarded to it, the branch dropped; then, as after every micro-batch that finds maintenance not due,
`maintenance.bound_snapshots`. Sampled every `--every` batches: snapshots, refs, metadata.json bytes, metadata-log
entries, the head's manifest list bytes and manifest count, the head's summary bytes, and the files and bytes left in
the table's metadata directory (manifest lists and metadata files no longer referenced are deleted by the expiry and
by `write.metadata.delete-after-commit.enabled`).
Results: bench/results/metadata_growth.{json,md}. Run: `.venv/bin/python bench/metadata_growth.py [--batches 10000]`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

from icefloe.commit.checkpoint import Checkpoint, Throughput
from icefloe.jvm_gateway import jvm_gateway
from icefloe.operate import maintenance
from icefloe.session import spark_session
from icefloe.spec import CatalogSpec, TableSpec
from icefloe.table.iceberg import DEFAULT_PROPERTIES, IcebergTable

RESULTS = Path(__file__).parent / "results"
PARTITIONS = 64


def local(path: str) -> Path:
    return Path(urlparse(path).path)


def checkpoint(index: int) -> Checkpoint:
    return Checkpoint(
        "bench_growth",
        {p: 1_000_000 * index + p for p in range(PARTITIONS)},
        f"{int(time.time())}_0123456789ab",
        None,  # a broker without topic ids: the known records are recorded too
        throughput=Throughput(5, 60, int(time.time() * 1000), False),
        leader_epochs=dict.fromkeys(range(PARTITIONS), 7),
        clocks=dict.fromkeys(range(PARTITIONS), 1795000000000 + index),
        known_records={p: (1_000_000 * index + p - 5, 1_795_000_000_000 + index) for p in range(PARTITIONS)},
    )


def sample(java, index: int, began: float) -> dict:
    metadata = java.operations().current()
    head = java.currentSnapshot()
    directory = local(metadata.metadataFileLocation()).parent
    files = list(directory.iterdir())
    manifests = head.allManifests(java.io())
    return {
        "batches": index,
        "snapshots": metadata.snapshots().size(),
        "refs": metadata.refs().size(),
        "metadata_json_bytes": local(metadata.metadataFileLocation()).stat().st_size,
        "metadata_log_entries": metadata.previousFiles().size(),
        "manifest_list_bytes": local(head.manifestListLocation()).stat().st_size,
        "manifests": manifests.size(),
        "summary_bytes": len(json.dumps(dict(head.summary()))),
        "metadata_dir_files": len(files),
        "metadata_dir_bytes": sum(f.stat().st_size for f in files),
        "seconds": round(time.monotonic() - began, 1),
    }


def micro_batches(spark, count: int, every: int) -> list[dict]:
    from icefloe.table.catalog import CATALOG

    table = IcebergTable(spark, "bench.growth")
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {CATALOG}.bench")
    properties = ", ".join(f"'{k}'='{v}'" for k, v in DEFAULT_PROPERTIES.items())
    spark.sql(f"CREATE TABLE {table.full_name} (n bigint) USING iceberg TBLPROPERTIES ({properties})")
    spec = TableSpec(source_cluster="bench", topic="bench_growth")
    jvm = jvm_gateway(spark)
    java = table.java()
    location = java.location()
    java.newFastAppend().set("icefloe.offsets", "{}").commit()  # the table's first, empty snapshot
    samples, began = [], time.monotonic()
    for index in range(1, count + 1):
        java.refresh()
        main = java.currentSnapshot().snapshotId()
        branch = f"icefloe_run_{int(time.time())}_{index:012d}"
        java.manageSnapshots().createBranch(branch, main).commit()
        data = (
            jvm.org.apache.iceberg.DataFiles.builder(java.spec())
            .withPath(f"{location}/data/{index:08d}.parquet")
            .withFormat("PARQUET")
            .withFileSizeInBytes(1024)
            .withRecordCount(5)
            .build()
        )
        append = java.newAppend().appendFile(data).toBranch(branch)
        for key, value in checkpoint(index).to_summary().items():
            append = append.set(key, value)
        append.commit()
        java.manageSnapshots().fastForwardBranch("main", branch).commit()
        java.manageSnapshots().removeBranch(branch).commit()
        maintenance.bound_snapshots(table, spec, java)
        if index % every == 0 or index == 1:
            samples.append(sample(java, index, began))
            print(samples[-1], flush=True)
            write(count, samples)  # so far: a run stopped early still leaves what it measured
    return samples


def write(count: int, samples: list[dict]) -> None:
    report = {"batches": count, "partitions": PARTITIONS, "kept": maintenance.CONTINUOUS_SNAPSHOTS_KEPT,
              "samples": samples}  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "metadata_growth.json").write_text(json.dumps(report, indent=1))
    (RESULTS / "metadata_growth.md").write_text(render(report))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=10_000)
    parser.add_argument("--every", type=int, default=500, help="sample every N batches")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="icefloe-growth-"))
    try:
        spark = spark_session(CatalogSpec(), work)
        samples = micro_batches(spark, args.batches, args.every)
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(render({"batches": args.batches, "partitions": PARTITIONS, "kept": maintenance.CONTINUOUS_SNAPSHOTS_KEPT,
                  "samples": samples}))  # fmt: skip


def render(report: dict) -> str:
    columns = [
        ("batches", "micro-batches"),
        ("snapshots", "snapshots"),
        ("refs", "refs"),
        ("metadata_json_bytes", "metadata.json bytes"),
        ("metadata_log_entries", "metadata-log"),
        ("manifest_list_bytes", "manifest list bytes"),
        ("manifests", "manifests"),
        ("summary_bytes", "head summary bytes"),
        ("metadata_dir_files", "metadata dir files"),
        ("metadata_dir_bytes", "metadata dir bytes"),
        ("seconds", "elapsed s"),
    ]
    last = report["samples"][-1]
    peak = max(s["metadata_json_bytes"] for s in report["samples"])
    lines = [
        f"# Continuous mode: table metadata over micro-batches ({last['batches']:,} of {report['batches']:,} measured)",
        "",
        f"Each micro-batch as the continuous loop commits it (branch, append of one data file with a "
        f"{report['partitions']}-partition checkpoint summary, fast-forward, branch dropped, then "
        f"`bound_snapshots` with {report['kept']} kept), through Iceberg's Java API on the local catalog "
        "(`bench/metadata_growth.py`).",
        "",
        f"After {last['batches']:,}: {last['snapshots']} snapshots, {last['refs']} ref(s), metadata.json "
        f"{last['metadata_json_bytes']:,} bytes (peak {peak:,}), {last['manifests']} manifests in the head's list "
        f"({last['manifest_list_bytes']:,} bytes), {last['metadata_dir_files']} files in the metadata directory.",
        "",
        "| " + " | ".join(title for _, title in columns) + " |",
        "|" + "---:|" * len(columns),
    ]
    for row in report["samples"]:
        lines.append("| " + " | ".join(f"{row[key]:,}" if isinstance(row[key], int) else str(row[key])
                                       for key, _ in columns) + " |")  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
