"""The EMR job run rendered as spark-submit for the local cluster: only the master, the artifacts' paths, EMR's
Iceberg jar, the catalog's endpoints and the job's size differ from what the program renders (tests/cluster runs it)."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from icefloe.table.catalog import EMR_ICEBERG_JAR
from icefloe_dev.spark_cluster import (
    LOCAL_JOB_SIZE,
    SubmittedJob,
    emr_job_submit,
    parse_submit_parameters,
    unpack_archive,
)

pytest.importorskip("pulumi")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "Pulumi.example.yaml"


def test_the_submit_keeps_the_emr_job_but_for_master_paths_endpoints_and_size(tmp_path):
    from pulumi_mocks import run_program

    program = run_program(EXAMPLE)
    request = json.loads(program.of_type("aws:scheduler/schedule:Schedule")[0].inputs["target"]["input"])
    driver = request["JobDriver"]["SparkSubmit"]
    emr = parse_submit_parameters(driver["SparkSubmitParameters"])
    archive = tmp_path / "deps.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        (tmp_path / "marker.py").write_text("")
        tar.add(tmp_path / "marker.py", arcname="./marker.py")
    uris = [driver["EntryPoint"], emr["spark.archives"].split("#")[0], *emr["spark.jars"].split(",")[1:]]
    local = {uri: tmp_path / f"copy-{i}" for i, uri in enumerate(uris)}
    local[emr["spark.archives"].split("#")[0]] = archive
    endpoints = {"spark.sql.catalog.icefloe.glue.endpoint": "http://127.0.0.1:1"}

    job = emr_job_submit(
        request,
        "spark://127.0.0.1:7",
        local,
        {EMR_ICEBERG_JAR: [Path("/j/iceberg.jar")]},
        endpoints,
        tmp_path / "driver",
        {"HOME": "/root"},
    )

    assert job.command[:3] == [job.command[0], "--master", "spark://127.0.0.1:7"]
    assert job.command[-len(driver["EntryPointArguments"]) - 1 :] == [
        str(local[driver["EntryPoint"]]),
        *driver["EntryPointArguments"],
    ]
    changed = {k for k in emr if emr[k] != job.conf.get(k)}
    assert changed - set(LOCAL_JOB_SIZE) == {"spark.jars", "spark.archives"} | {k for k in emr if "driverEnv" in k}
    assert job.conf["spark.jars"].split(",") == [
        "/j/iceberg.jar",
        *(str(local[u]) for u in emr["spark.jars"].split(",")[1:]),
    ]
    assert job.conf["spark.archives"] == f"{archive}#deps" and (tmp_path / "driver" / "deps" / "marker.py").exists()
    assert set(job.conf) - set(emr) == set(endpoints)
    # The driver's environment: what EMR gives its driver container (driverEnv), here the driver process's.
    assert job.env["PYTHONPATH"] == "./deps" and job.env["PYSPARK_PYTHON"] == emr["spark.executorEnv.PYSPARK_PYTHON"]
    assert job.env["PYSPARK_DRIVER_PYTHON"] == emr["spark.emr-serverless.driverEnv.PYSPARK_DRIVER_PYTHON"]


def test_the_archive_is_unpacked_once_for_all_the_drivers_and_a_job_removes_only_its_own_copies(tmp_path):
    archive = tmp_path / "deps.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        (tmp_path / "marker.py").write_text("")
        tar.add(tmp_path / "marker.py", arcname="./marker.py")

    first, second = unpack_archive(archive, tmp_path / "driver-1"), unpack_archive(archive, tmp_path / "driver-2")

    assert first.resolve() == second.resolve() and (second / "marker.py").exists()
    (tmp_path / "driver-1" / "spark-local" / "copy").mkdir(parents=True)
    SubmittedJob([], {}, tmp_path / "driver-1", {}).remove_copies()
    assert not first.exists() and not (tmp_path / "driver-1" / "spark-local").exists()
    assert (second / "marker.py").exists()  # the other driver's bundle is still there
