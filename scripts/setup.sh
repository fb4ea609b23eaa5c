#!/usr/bin/env bash
# Sets up a fresh machine for icefloe: Java and the SQLite JDBC driver (Debian), the pinned JVM parts from Maven
# (jvm/pom.xml: Iceberg, Spark's Kafka source and Avro, the Apache Kafka broker, Apicurio Registry) into the
# git-ignored jvm/lib/, the test-only ones (jvm/test-pom.xml: the AWS Glue Schema Registry's Java serde, and its module
# test-rest-catalog-pom.xml: Apache Iceberg's REST catalog server) into jvm/test-lib/, a virtualenv, and the project
# with every extra. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=()
[ -f /usr/share/java/sqlite-jdbc.jar ] || APT_PACKAGES+=(libxerial-sqlite-jdbc-java)
command -v java >/dev/null || APT_PACKAGES+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || APT_PACKAGES+=(maven)
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
echo "setup: done"
