"""A local run's class-data-sharing archive (AppCDS): the classes a run loads, some 20,000 of Spark, Scala, Iceberg
and Kafka, mapped from one file instead of looked up across 260 jars, parsed and verified by every fresh JVM again.
A fresh small batch takes about a third less CPU and wall time with it (bench/results/cold_start_cds.md).

One archive per JDK and set of jars, by default in `jvm/cds/` beside the jars (`ICEFLOE_CDS_ARCHIVE`: a file of
your choice, or `off`). The first run that finds none has its JVM write one as it exits, to a file of its own, and
renames it into place once the JVM has exited cleanly: runs at the same time each write their own, a killed run
leaves only its own file (removed by the next run that publishes one, with all but the newest few archives), and no run maps a half-written archive.
A JVM that cannot use an archive (one from another JDK or other jars: the name's fingerprint changes with them)
says so on stderr and runs without it. A JVM given a Java agent or a flight recording from its start runs without
one: Java 17 crashes mapping a dynamic archive while classes are transformed as they load (SIGSEGV in
`KlassFactory::check_shared_class_file_load_hook`) and refuses to start writing one (`AllowArchivingWithJavaAgent`).
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import shutil
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)
ARCHIVE_ENV = "ICEFLOE_CDS_ARCHIVE"
# The JVM's own messages to stderr, never stdout: a run's --json lines are on stdout, and the archive's dump warns.
JVM_LOG_TO_STDERR = "-Xlog:all=off:stdout -Xlog:all=warning:stderr"
# How long a run waits at its exit for its JVM to write the archive (a few seconds; 175 MiB on disk).
DUMP_TIMEOUT_S = 600
DEFAULT_PREFIX = "icefloe-"
KEPT_ARCHIVES = 3
# Options that transform classes as the JVM loads them (a Java agent, JFR started with the JVM; `-XX:+FlightRecorder`
# alone records nothing), and where the driver's JVM finds options besides ours.
INSTRUMENTING = ("-javaagent:", "-agentlib:", "-agentpath:", "-XX:StartFlightRecording")
OPTION_VARIABLES = (
    "JAVA_TOOL_OPTIONS",
    "JDK_JAVA_OPTIONS",
    "_JAVA_OPTIONS",
    "SPARK_SUBMIT_OPTS",
    "PYSPARK_SUBMIT_ARGS",
)


def archive_path(default_dir: Path, class_path: list[str]) -> Path | None:
    """The archive a local driver uses: `ICEFLOE_CDS_ARCHIVE`'s file, none with `off`, else one in `default_dir`
    named by the JDK and the driver's class path (this run's jars and Spark's own)."""
    configured = os.environ.get(ARCHIVE_ENV, "")
    if configured.lower() == "off":
        return None
    instrumented = instrumenting_option()
    if instrumented is not None:
        log.warning(
            "no class-data-sharing archive for this run (its JVM starts slower): %s transforms classes as they "
            "load, and Java 17 crashes mapping an archive then",
            instrumented,
        )
        return None
    if configured:
        return Path(configured)
    return default_dir / f"{DEFAULT_PREFIX}{_fingerprint([*class_path, *_spark_jars()])}.jsa"


def instrumenting_option() -> str | None:
    """The first option the driver's JVM gets that transforms classes as they load (`INSTRUMENTING`), and where it
    comes from, or None."""
    for variable in OPTION_VARIABLES:
        for option in os.environ.get(variable, "").split():
            option = option.strip("'\"")  # PYSPARK_SUBMIT_ARGS: --driver-java-options '...'
            if option.startswith(INSTRUMENTING):
                return f"{option.split('=', 1)[0]} in {variable}"
    return None


def driver_settings(archive: Path, jars: list[str], write: bool = True) -> dict[str, str]:
    """The local driver's settings for `archive`: map it where it exists, else (`write`) write it as the JVM exits.
    The jars go on the driver's class path, as AppCDS archives only classes of the boot and application class path."""
    settings = {"spark.driver.extraClassPath": ":".join(jars)}
    if archive.exists():
        use = _option("-XX:SharedArchiveFile", archive)
    elif not write:
        return settings
    else:
        try:
            archive.parent.mkdir(parents=True, exist_ok=True)
        except OSError:  # a read-only install: runs start without an archive, as before there was one
            return settings
        pending = archive.with_name(f"{archive.name}.{os.getpid()}.tmp")
        # The dump warns of each class it leaves out (thousands: generated, old-format): errors only.
        use = f"{_option('-XX:ArchiveClassesAtExit', pending)} -Xlog:cds*=error:stderr"
        atexit.register(_publish, pending, archive)
    return settings | {"spark.driver.extraJavaOptions": f"{JVM_LOG_TO_STDERR} {use}"}


def _option(name: str, path: Path) -> str:
    """A JVM option naming a file, as one word of `spark.driver.extraJavaOptions` (which Spark's launcher splits at
    blanks, keeping what double quotes hold together): a checkout under `My Projects/` put the archive's path in two
    words, and the JVM did not start."""
    text = str(path)
    if not any(c.isspace() or c in "\"'\\" for c in text):
        return f"{name}={text}"
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'{name}="{escaped}"'


def _publish(pending: Path, archive: Path) -> None:
    """At the run's exit: end its JVM (it exits when its stdin closes, and writes `pending` then) and, if it exited
    cleanly, move the archive into place. A JVM that did not exit in time keeps its file out of use."""
    from pyspark import SparkContext

    process: subprocess.Popen | None = getattr(SparkContext._gateway, "proc", None)
    if process is None or process.stdin is None:
        return
    if SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.stop()
    process.stdin.close()
    try:
        process.wait(timeout=DUMP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return
    if process.returncode == 0 and pending.exists():
        os.replace(pending, archive)
        _remove_stale(archive)


def _remove_stale(archive: Path) -> None:
    """The files of runs that died while writing an archive and, beside a default archive, all but the newest
    `KEPT_ARCHIVES` archives (another JDK's or other jars'; runs with MSK IAM add a jar, so two may be in use)."""
    family = f"{archive.name}.*.tmp" if os.environ.get(ARCHIVE_ENV) else f"{DEFAULT_PREFIX}*.tmp"
    for pending in archive.parent.glob(family):
        pid = pending.suffixes[-2].lstrip(".") if len(pending.suffixes) > 1 else ""
        if not (pid.isdigit() and _alive(int(pid))):  # else another run is writing it
            pending.unlink(missing_ok=True)
    if not os.environ.get(ARCHIVE_ENV):
        archives = sorted(archive.parent.glob(f"{DEFAULT_PREFIX}*.jsa"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in archives[KEPT_ARCHIVES:]:
            old.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _spark_jars() -> list[str]:
    """Spark's own jars, on the driver's class path after ours (spark-submit adds `$SPARK_HOME/jars/*`)."""
    import pyspark

    home = Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent)
    return sorted(str(jar) for jar in (home / "jars").glob("*.jar"))


def _fingerprint(class_path: list[str]) -> str:
    """What an archive is valid for: the JDK's build (its `release` file) and each jar's path, size and time."""
    digest = hashlib.sha256()
    java = os.environ.get("JAVA_HOME") or str(Path(shutil.which("java") or "java").resolve().parents[1])
    release = Path(java) / "release"
    digest.update(release.read_bytes() if release.exists() else java.encode())
    for jar in class_path:
        stat = os.stat(jar)
        digest.update(f"{jar}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]
