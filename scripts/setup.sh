#!/usr/bin/env bash
# Sets up a fresh machine for icefloe: the SQLite JDBC driver (Debian), a virtualenv, and the project with
# every extra (Spark, the Iceberg runtime jar, the Tansu broker, DuckDB, Pulumi, moto). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=()
[ -f /usr/share/java/sqlite-jdbc.jar ] || APT_PACKAGES+=(libxerial-sqlite-jdbc-java)
command -v java >/dev/null || APT_PACKAGES+=(openjdk-17-jre-headless)
if [ ${#APT_PACKAGES[@]} -gt 0 ]; then
  echo "setup: installing ${APT_PACKAGES[*]} (Debian)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${APT_PACKAGES[@]}" >/dev/null
fi

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
