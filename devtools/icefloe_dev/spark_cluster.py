"""A Spark standalone cluster on this machine, and the deployed EMR job submitted to it with `spark-submit`.

The master and each worker are separate JVMs (`spark-class ...deploy.master.Master` / `...deploy.worker.Worker` from
the pip `pyspark`, which has no sbin/ scripts); each worker starts its executors as further JVMs, each with its own
Python workers. So code, files and state the driver has are not there unless Spark ships them: what EMR Serverless
does too, and what `local[*]` (driver and executors in one JVM) cannot show.

`emr_job_submit` turns the StartJobRun request the Pulumi program renders (entry point, arguments,
`SparkSubmitParameters`) into a `spark-submit` command for this cluster, replacing only what cannot be the same here:
the master, the artifacts' `s3://` paths by local copies, EMR's own Iceberg jar by the pinned one, the catalog's
endpoints (a moto server), and the job's size (EMR's 2-core, 8 GiB executors do not fit a small worker). Two things
EMR Serverless does for the driver are done by hand, since a standalone cluster runs Python drivers in client mode
(the driver is the local spark-submit process): the archive is unpacked as ./deps in the driver's working directory,
and the `spark.emr-serverless.driverEnv.*` settings become the driver's environment.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from .processes import LocalService, ServiceError, free_ports

EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
DRIVER_ENV = "spark.emr-serverless.driverEnv."
SPARK_LOCAL = "spark-local"  # a job's SPARK_LOCAL_DIRS, in its driver's directory
# The job's size on this machine: one core per worker, executors that fit a worker of WORKER_MEMORY.
WORKER_MEMORY = "1g"
LOCAL_JOB_SIZE = {
    "spark.driver.cores": "1",
    "spark.driver.memory": "1g",
    "spark.executor.cores": "1",
    "spark.executor.memory": "768m",
}


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _spark_env() -> dict[str, str]:
    return {"SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_DAEMON_MEMORY": "256m"}


class SparkMaster(LocalService):
    name = "spark-master"

    def __init__(self, state_dir: Path, workers: int, startup_timeout: float = 120.0) -> None:
        super().__init__(state_dir, startup_timeout)
        self.workers = workers
        self.port, self.ui_port = free_ports(2)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        master = "org.apache.spark.deploy.master.Master"
        return [str(spark_home() / "bin" / "spark-class"), master, "--host", "127.0.0.1", "--port", str(self.port),
                "--webui-port", str(self.ui_port)]  # fmt: skip

    def environment(self) -> dict[str, str]:
        return _spark_env()

    def state(self) -> dict:
        """The master's view (its web UI's JSON): workers, applications, cores in use."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as answer:
            return json.loads(answer.read())

    def probe(self) -> str | None:
        try:
            alive = self.state().get("aliveworkers", 0)
        except (OSError, ValueError) as error:
            return f"the Spark master did not answer ({error})"
        return None if alive >= self.workers else f"{alive} of {self.workers} workers registered"


class SparkWorker(LocalService):
    def __init__(
        self, state_dir: Path, master: SparkMaster, index: int, cores: int = 1, env: dict[str, str] | None = None
    ) -> None:
        self.name = f"spark-worker-{index}"
        super().__init__(state_dir, 120.0)
        self.master, self.cores, self.env = master, cores, dict(env or {})
        self.work_dir = self.state_dir / f"{self.name}-work"
        (self.ui_port,) = free_ports(1)

    def command(self) -> list[str]:
        worker = "org.apache.spark.deploy.worker.Worker"
        return [str(spark_home() / "bin" / "spark-class"), worker, self.master.url, "--host", "127.0.0.1",
                "--cores", str(self.cores), "--memory", WORKER_MEMORY, "--work-dir", str(self.work_dir),
                "--webui-port", str(self.ui_port)]  # fmt: skip

    def environment(self) -> dict[str, str]:
        return _spark_env() | self.env  # its executors inherit it

    def probe(self) -> str | None:
        return None  # the master counts the workers that registered

    def executor_pids(self) -> dict[str, int]:
        """{executor id: pid} of the executor JVMs this worker started that are running now."""
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except (OSError, IndexError, ValueError):
                continue  # ended meanwhile
            if parent == self.pid and EXECUTOR_CLASS.encode() in argv:
                found[argv[argv.index(b"--executor-id") + 1].decode()] = int(entry.name)
        return found


class SparkCluster:
    """A master and `workers` workers of `cores` cores each, on loopback, logs and work dirs under `state_dir`.

    The workers' environment is this process's (the AWS credentials a job's executors use come from there, as an
    EMR job's come from its role), plus `env`.
    """

    def __init__(self, state_dir: Path, workers: int = 2, cores: int = 1, env: dict[str, str] | None = None) -> None:
        self.state_dir = Path(state_dir)
        self.master = SparkMaster(self.state_dir, workers)
        self.workers = [SparkWorker(self.state_dir, self.master, i, cores, env) for i in range(workers)]

    @property
    def url(self) -> str:
        return self.master.url

    def start(self) -> SparkCluster:
        self.master.launch()
        try:
            for worker in self.workers:
                worker.launch()
            self.master.wait_until_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.master.stop()

    def executor_pids(self) -> dict[str, int]:
        return {executor: pid for worker in self.workers for executor, pid in worker.executor_pids().items()}

    def running_applications(self) -> list[dict]:
        return list(self.master.state().get("activeapps", []))

    def remove_finished_applications(self) -> None:
        """Delete the work directories of the applications that ended: each executor fetched its own copy of the
        job's jars and archive there (about 400 MB per job and worker). Spark's own `spark.worker.cleanup` would do
        it only on a timer."""
        for app in self.master.state().get("completedapps", []):
            for worker in self.workers:
                shutil.rmtree(worker.work_dir / app["id"], ignore_errors=True)

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# -- the deployed job ----------------------------------------------------------------------------------------------


def parse_submit_parameters(parameters: str) -> dict[str, str]:
    """`--conf k=v --conf k=v ...` (the StartJobRun's SparkSubmitParameters) as a mapping, order kept."""
    words = shlex.split(parameters)
    conf: dict[str, str] = {}
    for flag, setting in zip(words[::2], words[1::2], strict=True):
        if flag != "--conf":
            raise ServiceError(f"SparkSubmitParameters: expected --conf, found {flag!r}")
        key, value = setting.split("=", 1)
        conf[key] = value
    return conf


@dataclass
class SubmittedJob:
    """A spark-submit command, its environment and working directory (the driver's ./deps is there)."""

    command: list[str]
    env: dict[str, str]
    cwd: Path
    conf: dict[str, str]

    def remove_copies(self) -> None:
        """Delete what the ended job copied into its directory (Spark's local files: its copy of the archive,
        unpacked; about 400 MB), keeping its output."""
        (self.cwd / "deps").unlink(missing_ok=True)  # a link to the archive's one unpacked copy
        shutil.rmtree(self.cwd / SPARK_LOCAL, ignore_errors=True)


def extract_all(tar: tarfile.TarFile, into: Path) -> None:
    """Every member of `tar` unpacked into `into`, none landing outside it: tarfile's `data` filter where this Python
    has it (3.11.4 on), else the same check by hand (Debian 12's Python is 3.11.2: `extractall(filter=...)` was a
    TypeError there)."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(into, filter="data")
        return
    root = into.resolve()
    for member in tar.getmembers():
        target = (root / member.name).resolve()
        linked = [(target.parent / member.linkname).resolve()] if member.issym() else []
        linked += [(root / member.linkname).resolve()] if member.islnk() else []
        if member.isdev() or any(not path.is_relative_to(root) for path in [target, *linked]):
            raise ServiceError(f"{member.name} in {tar.name} would unpack outside {into} (or is a device)")
    tar.extractall(into)


def unpack_archive(archive: Path, into: Path) -> Path:
    """The bundle as EMR unpacks it (`spark.archives=...#deps`): `into`/deps. Unpacked once per archive, beside it
    (about 400 MB and half a minute on a loaded machine), and linked into each driver's directory: the drivers run
    the same bundle, and none writes to it but Python's byte-code cache."""
    unpacked = archive.with_name(f"{archive.name}.deps")
    if not unpacked.is_dir():
        partial = archive.with_name(f"{archive.name}.deps.partial")
        shutil.rmtree(partial, ignore_errors=True)  # a run stopped mid-unpack
        partial.mkdir(parents=True)
        with tarfile.open(archive) as tar:
            extract_all(tar, partial)
        partial.rename(unpacked)
    deps = into / "deps"
    if not deps.exists():
        into.mkdir(parents=True, exist_ok=True)
        deps.unlink(missing_ok=True)  # a link to a copy since removed
        deps.symlink_to(unpacked.resolve(), target_is_directory=True)
    return deps


def emr_job_submit(
    request: dict,
    master: str,
    local_paths: dict[str, Path],
    replace_jars: dict[str, list[Path]],
    catalog_conf: dict[str, str],
    driver_dir: Path,
    env: dict[str, str],
    extra_conf: dict[str, str] | None = None,
) -> SubmittedJob:
    """The `spark-submit` of an EMR StartJobRun `request` (API member names), on the standalone cluster at `master`.

    `local_paths`: {s3 URI: local copy} of the uploaded artifacts; `replace_jars`: {a jar path on EMR's image: the
    local jars standing in for it}; `catalog_conf`: settings added for the catalog off AWS (its endpoints);
    `driver_dir`: the driver's working directory, where the archive is unpacked as ./deps; `env`: the driver's
    environment, to which the job's `driverEnv` settings are added.
    """
    driver = request["JobDriver"]["SparkSubmit"]
    conf = parse_submit_parameters(driver["SparkSubmitParameters"])

    def local(uri: str) -> str:
        if uri in local_paths:
            return str(local_paths[uri])
        if uri.startswith("s3://"):
            raise ServiceError(f"no local copy of {uri}")
        return uri

    jars: list[str] = []
    for jar in conf["spark.jars"].split(","):
        jars += [str(p) for p in replace_jars[jar]] if jar in replace_jars else [local(jar)]
    conf["spark.jars"] = ",".join(jars)
    archive_uri, _, alias = conf["spark.archives"].partition("#")
    conf["spark.archives"] = f"{local(archive_uri)}#{alias}"
    unpack_archive(Path(local(archive_uri)), driver_dir)
    driver_env = {key.removeprefix(DRIVER_ENV): conf.pop(key) for key in list(conf) if key.startswith(DRIVER_ENV)}
    # Standalone's executors run the Python the driver names (PYSPARK_PYTHON), as EMR's do.
    conf |= LOCAL_JOB_SIZE | catalog_conf | (extra_conf or {})
    command = [str(spark_home() / "bin" / "spark-submit"), "--master", master]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    command += [local(driver["EntryPoint"]), *driver["EntryPointArguments"]]
    driver_dir.mkdir(parents=True, exist_ok=True)
    # The driver's local files in its directory, not /tmp: spark-submit's copy of the archive (java.io.tmpdir; it
    # is left behind even when the job ends well), the archive unpacked, the shuffle files (SPARK_LOCAL_DIRS; left
    # behind by a driver that is killed).
    local = driver_dir / SPARK_LOCAL
    local.mkdir(parents=True, exist_ok=True)
    local_dirs = {"SPARK_LOCAL_DIRS": str(local), "SPARK_SUBMIT_OPTS": f"-Djava.io.tmpdir={local}"}
    return SubmittedJob(command, {**env, **_spark_env(), **driver_env, **local_dirs}, driver_dir, conf)


class DeployedStack:
    """What `pulumi up` puts on AWS for the jobs, on a moto server, from the program's run under mocks
    (`icefloe_infra.dry_run.run_program`, with the real bundle builder and jars): the bucket with the uploaded
    objects (bundle, entry point, jars, job config) and the Glue databases; the artifacts copied back from the
    bucket, so a job runs what was uploaded. `submit(table)` renders that table's scheduled StartJobRun as a
    `spark-submit` (`emr_job_submit`) for a master: the cluster's, or `local[N]` to compare."""

    def __init__(self, program, moto, root: Path) -> None:
        from icefloe.session import jvm_lib
        from icefloe.table.catalog import CATALOG, EMR_ICEBERG_JAR

        self.program, self.moto, self.root = program, moto, Path(root)
        s3, glue = moto.client("s3"), moto.client("glue")
        s3.create_bucket(Bucket=program.outputs["bucket"])
        self.local_paths: dict[str, Path] = {}
        for obj in program.of_type("aws:s3/bucketObjectv2:BucketObjectv2"):
            body = obj.inputs.get("content")
            body = body.encode() if body is not None else Path(obj.inputs["source"]["asset"]).read_bytes()
            bucket, key = obj.inputs["bucket"], obj.inputs["key"]
            s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType=obj.inputs["contentType"])
            self.local_paths[f"s3://{bucket}/{key}"] = download(s3, f"s3://{bucket}/{key}", self.root / "artifacts")
        for database in program.of_type("aws:glue/catalogDatabase:CatalogDatabase"):
            inputs = database.inputs
            try:
                glue.create_database(DatabaseInput={"Name": inputs["name"], "LocationUri": inputs["locationUri"]})
            except glue.exceptions.AlreadyExistsException:  # the session's moto server: another module made it
                pass
        self.requests: dict[str, dict] = {}
        for schedule in program.of_type("aws:scheduler/schedule:Schedule"):
            request = json.loads(schedule.inputs["target"]["input"])
            self.requests[request["Name"].removeprefix("icefloe-")] = request
        # EMR's image has Iceberg's Spark runtime (with the AWS SDK it uses) at this path: the pinned jars stand in.
        lib = jvm_lib() / "spark"
        iceberg = sorted([*lib.glob("iceberg-spark-runtime-*.jar"), *lib.glob("iceberg-aws-bundle-*.jar")])
        if len(iceberg) != 2:
            raise ServiceError(f"{lib}: no Iceberg Spark runtime and AWS bundle (run scripts/setup.sh)")
        self.replace_jars = {EMR_ICEBERG_JAR: iceberg}
        prefix = f"spark.sql.catalog.{CATALOG}"
        self.catalog_conf = {
            f"{prefix}.glue.endpoint": moto.endpoint,
            f"{prefix}.s3.endpoint": moto.endpoint,
            f"{prefix}.s3.path-style-access": "true",
            f"{prefix}.client.region": moto.aws_env()["AWS_REGION"],
        }
        self._submitted = 0

    def submit(self, table: str, master: str, extra_conf: dict[str, str] | None = None) -> SubmittedJob:
        """The job of table `table` (its identifier) on `master`, in a new driver directory. The driver's
        environment: this process's less its AWS, Python and Spark settings, plus the moto server's credentials
        and region (as an EMR job's come from its role) and the S3 endpoint the runtime's boto3 reads the job
        config through (AWS_ENDPOINT_URL_S3, boto3's own setting)."""
        self._submitted += 1
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PYTHON", "PYSPARK_", "SPARK_"))}
        env |= self.moto.aws_env() | {"AWS_ENDPOINT_URL_S3": self.moto.endpoint}
        (ui_port,) = free_ports(1)
        return emr_job_submit(
            self.requests[table],
            master,
            self.local_paths,
            self.replace_jars,
            self.catalog_conf,
            self.root / f"driver-{self._submitted}",
            env,
            extra_conf={"spark.ui.port": str(ui_port)} | (extra_conf or {}),
        )


def download(client, uri: str, into: Path) -> Path:
    """An `s3://` object to a local file under `into` (keeping the key's file name)."""
    bucket, key = uri.removeprefix("s3://").split("/", 1)
    path = into / key
    path.parent.mkdir(parents=True, exist_ok=True)
    client.download_file(bucket, key, str(path))
    return path


__all__ = [
    "DeployedStack",
    "SparkCluster",
    "SparkMaster",
    "SparkWorker",
    "SubmittedJob",
    "download",
    "emr_job_submit",
    "parse_submit_parameters",
    "unpack_archive",
]
