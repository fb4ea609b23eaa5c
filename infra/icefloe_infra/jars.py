"""The JVM jars a table's job ships with: what jvm/pom.xml pins for Spark, less what the EMR release already has.

jvm/pom.xml is the one list: `scripts/setup.sh` has Maven copy its `spark-jars` items into jvm/lib/spark/, which
local runs hand to Spark whole (`icefloe.session.local_jars`), and the Pulumi program uploads the same files, less
the ones below, next to the runtime bundle and names them in the job's `spark.jars`. So a version bump in the pom
reaches local runs and EMR jobs alike, and cannot drift between them. icefloe's own jar (`ICEFLOE_JAR`, built by
setup.sh from jvm/src into the same folder) goes with every job too.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

from icefloe.errors import ConfigError
from icefloe.jvm_gateway import ICEFLOE_JAR

POM = Path(__file__).resolve().parents[2] / "jvm" / "pom.xml"
SPARK_JARS_EXECUTION = "spark-jars"  # the pom's execution whose items go to jvm/lib/spark/
# In every EMR 7.x release image, and built for its Spark: Iceberg's Spark runtime (put on the classpath with
# icefloe.table.catalog.EMR_ICEBERG_JAR) with the AWS SDK v2 it uses for Glue and S3. Shipping our own copies would put
# two Icebergs on one classpath. Spark's Kafka source and Avro are not in the image: they go with the job.
EMR_PROVIDED = frozenset({"org.apache.iceberg:iceberg-spark-runtime-3.5_2.12", "org.apache.iceberg:iceberg-aws-bundle"})
_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


# Shipped only with stacks that read a cluster with `saslMechanism: AWS_MSK_IAM`: the shaded jar carries its own
# unrelocated AWS SDK v2, which every other job is better off without (icefloe.source.msk_iam).
ONLY_FOR_MSK_IAM = frozenset({"software.amazon.msk:aws-msk-iam-auth"})


@dataclass(frozen=True)
class PinnedJar:
    group: str
    artifact: str
    version: str
    classifier: str = ""

    @property
    def coordinate(self) -> str:
        return f"{self.group}:{self.artifact}"

    @property
    def file_name(self) -> str:
        """The name Maven's dependency:copy gives it."""
        suffix = f"-{self.classifier}" if self.classifier else ""
        return f"{self.artifact}-{self.version}{suffix}.jar"


def pinned_spark_jars(pom: Path = POM) -> list[PinnedJar]:
    """The `spark-jars` items of the pom, in its order, with `${property}` versions resolved."""
    root = ElementTree.parse(pom).getroot()
    declared = root.find("m:properties", _NS)
    properties = {
        child.tag.split("}", 1)[1]: (child.text or "").strip() for child in ([] if declared is None else declared)
    }
    items = root.findall(
        f".//m:execution[m:id='{SPARK_JARS_EXECUTION}']/m:configuration/m:artifactItems/m:artifactItem", _NS
    )
    if not items:
        raise ConfigError(f"{pom}: no artifactItems in the '{SPARK_JARS_EXECUTION}' execution")

    def text(item: ElementTree.Element, tag: str) -> str:
        value = item.findtext(f"m:{tag}", default="", namespaces=_NS).strip()
        return re.sub(r"\$\{([^}]+)\}", lambda m: properties[m.group(1)], value)

    return [
        PinnedJar(text(i, "groupId"), text(i, "artifactId"), text(i, "version"), text(i, "classifier")) for i in items
    ]


def job_jars(lib_dir: Path, pom: Path = POM, msk_iam: bool = False) -> dict[str, Path]:
    """{artifactId: file} to ship with each job, from the directory setup.sh filled (jvm/lib/spark/): icefloe's own
    jar, then the pinned ones in pom order; the MSK IAM jar only when `msk_iam` (a source cluster uses AWS_MSK_IAM)."""
    pinned = pinned_spark_jars(pom)
    stale = (EMR_PROVIDED | ONLY_FOR_MSK_IAM) - {jar.coordinate for jar in pinned}
    if stale:  # a renamed artifact would otherwise be shipped twice, or an exclusion silently do nothing
        raise ConfigError(f"{pom}: {', '.join(sorted(stale))} is listed in jars.py but not pinned")
    skipped = EMR_PROVIDED | (frozenset() if msk_iam else ONLY_FOR_MSK_IAM)
    shipped = {ICEFLOE_JAR.removesuffix(".jar"): lib_dir / ICEFLOE_JAR}
    shipped |= {jar.artifact: lib_dir / jar.file_name for jar in pinned if jar.coordinate not in skipped}
    missing = [path.name for path in shipped.values() if not path.is_file()]
    if missing:
        raise ConfigError(
            f"the jobs' jars are missing from {lib_dir}: {', '.join(missing)}; run scripts/setup.sh "
            "(Maven fetches what jvm/pom.xml pins, javac builds the icefloe jar)"
        )
    return shipped
