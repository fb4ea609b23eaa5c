#!/usr/bin/env bash
# Sets up a fresh machine for icefloe: Java and the SQLite JDBC driver (Debian), the pinned JVM parts from Maven
# (jvm/pom.xml: Iceberg, Spark's Kafka source and Avro, the Apache Kafka broker, Apicurio Registry) into the
# git-ignored jvm/lib/, the test-only ones (jvm/test-pom.xml: the AWS Glue Schema Registry's Java serde, and its module
# test-rest-catalog-pom.xml: Apache Iceberg's REST catalog server) into jvm/test-lib/, icefloe's own jar (jvm/src), the change-data test platform
# (PostgreSQL and MariaDB from Debian; Kafka Connect, Debezium and Apicurio's converter from jvm/cdc/*.xml into jvm/cdc-lib/), a
# virtualenv, and the project with every extra. Safe to run again. `--missing`: only list the Debian packages it
# would install.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=()
[ -f /usr/share/java/sqlite-jdbc.jar ] || APT_PACKAGES+=(libxerial-sqlite-jdbc-java)
# The JDK: javac builds icefloe's own jar (jvm/src) below.
command -v java >/dev/null && command -v javac >/dev/null || APT_PACKAGES+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null || APT_PACKAGES+=(maven)
# The cluster tests' job Python (EMR's default `python` path), which must see none of the project's packages.
[ -x /usr/bin/python3.11 ] || APT_PACKAGES+=(python3.11)
# The CDC tests' private PostgreSQL cluster (initdb, pg_ctl, psql): Debian's, any version with logical decoding.
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null && command -v psql >/dev/null || APT_PACKAGES+=(postgresql)
# ... and their private MariaDB server (mariadb-install-db, mariadbd, the mariadb client). Debian puts mariadbd in
# /usr/sbin, which is on root's PATH only: a user's set-up found it missing and wanted sudo to install it again.
{ command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ]; } && command -v mariadb-install-db >/dev/null \
  || APT_PACKAGES+=(mariadb-server)
if [ "${1:-}" = "--missing" ]; then  # only say which Debian packages this machine lacks, one per line
  [ ${#APT_PACKAGES[@]} -eq 0 ] || printf '%s\n' "${APT_PACKAGES[@]}"
  exit 0
fi
if [ ${#APT_PACKAGES[@]} -gt 0 ]; then
  echo "setup: installing ${APT_PACKAGES[*]} (Debian)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${APT_PACKAGES[@]}" >/dev/null
fi

echo "setup: fetching the JVM parts pinned in jvm/pom.xml into jvm/lib/"
if ! mvn -f jvm/pom.xml -q -B generate-resources; then
  echo "setup: 'mvn -f jvm/pom.xml generate-resources' failed: Maven Central must be reachable" >&2
  exit 1
fi
echo "setup: fetching the test-only JVM parts pinned in jvm/test-pom.xml into jvm/test-lib/"
if ! mvn -f jvm/test-pom.xml -q -B generate-resources; then
  echo "setup: 'mvn -f jvm/test-pom.xml generate-resources' failed: Maven Central must be reachable" >&2
  exit 1
fi
# The change-data test platform, one folder per pom under jvm/cdc-lib/ (test-only: never on Spark's classpath). A
# folder is fetched again only when its pom changed (the pom's hash is kept beside the jars), so a set-up machine
# skips Maven here entirely.
fetch_cdc() {  # fetch_cdc NAME FOLDER [MAVEN ARGS...]
  local name="$1" folder="jvm/cdc-lib/$2" hash; shift 2
  hash="$(sha256sum "jvm/cdc/$name.xml" | cut -d' ' -f1)"
  [ -f "$folder/.pom.sha256" ] && [ "$(cat "$folder/.pom.sha256")" = "$hash" ] && return 0
  echo "setup: fetching jvm/cdc/$name.xml into $folder/"
  rm -rf "$folder"
  if ! mvn -f "jvm/cdc/$name.xml" -q -B "$@" generate-resources; then
    echo "setup: 'mvn -f jvm/cdc/$name.xml generate-resources' failed: Maven Central must be reachable" >&2
    exit 1
  fi
  echo "$hash" > "$folder/.pom.sha256"
}
fetch_cdc connect connect
# Connect's plugin.path is jvm/cdc-lib/plugins: each folder in it is one plugin with its own class loader.
fetch_cdc debezium-postgres plugins/debezium-postgres
# The MariaDB connector in a plugin.path of its own (jvm/cdc/debezium-mariadb.xml says why its version differs).
fetch_cdc debezium-mariadb plugins-mariadb/debezium-mariadb
# Apicurio's converter 3.0.9: its parent pom is not served here; the served 3.0.7 parent stands in for it, in a
# private local repository so that the shared ~/.m2 never holds a made-up artifact (jvm/cdc/apicurio-converter.xml).
APICURIO_M2="$PWD/jvm/cdc-lib/m2-apicurio"
APICURIO_PARENT="$APICURIO_M2/io/apicurio/apicurio-registry"
if [ ! -f "$APICURIO_PARENT/3.0.9/apicurio-registry-3.0.9.pom" ]; then
  mvn -q -B -Dmaven.repo.local="$APICURIO_M2" org.apache.maven.plugins:maven-dependency-plugin:3.8.1:get \
    -Dartifact=io.apicurio:apicurio-registry:3.0.7:pom -Dtransitive=false
  mkdir -p "$APICURIO_PARENT/3.0.9"
  sed '0,/<version>3.0.7<\/version>/s//<version>3.0.9<\/version>/' \
    "$APICURIO_PARENT/3.0.7/apicurio-registry-3.0.7.pom" > "$APICURIO_PARENT/3.0.9/apicurio-registry-3.0.9.pom"
fi
fetch_cdc apicurio-converter plugins/apicurio-converter -Dmaven.repo.local="$APICURIO_M2"

# Apicurio ships as a tar.gz: unpack it once per version beside the archive.
for archive in jvm/lib/registry/*.tar.gz; do
  target="${archive%.tar.gz}"
  if [ ! -f "$target/.unpacked" ]; then
    rm -rf "$target" && mkdir -p "$target"
    tar -xzf "$archive" -C "$target"
    touch "$target/.unpacked"
  fi
done

PYTHON="${PYTHON:-python3}"
"$PYTHON" -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] < (3, 13) else 1)' \
  || { echo "setup: Python 3.11 or 3.12 is required, found $("$PYTHON" --version)"; exit 1; }
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
echo "setup: installing icefloe and its dependencies into .venv"
.venv/bin/python -m pip install -q -e ".[dev]"

# icefloe's own JVM functions (jvm/src: the JVM read path's Protobuf decoder), compiled against the Spark pip just
# installed and put beside the pinned jars in jvm/lib/spark/, which local runs take whole and every job ships
# (icefloe_infra.jars). Java 8 bytecode, fixed entry times: the same sources make the same jar on any machine.
echo "setup: building jvm/lib/spark/icefloe-jvm.jar from jvm/src"
SPARK_JARS="$(.venv/bin/python -c 'import pathlib, pyspark; print(pathlib.Path(pyspark.__file__).parent / "jars")')"
CLASSES="$(mktemp -d)"
javac --release 8 -nowarn -d "$CLASSES" -cp "$SPARK_JARS/*" $(find jvm/src -name '*.java' | sort)
jar --create --file jvm/lib/spark/icefloe-jvm.jar --date 2026-01-01T00:00:00Z -C "$CLASSES" .
rm -rf "$CLASSES"
echo "setup: done"
