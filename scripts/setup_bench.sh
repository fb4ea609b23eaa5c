#!/usr/bin/env bash
# Bench-only set-up (never CI, never .ci/run): the peer bench/throughput.py measures icefloe against, Apache Iceberg's
# Kafka Connect sink on Kafka Connect 4.4.0 standalone (jvm/bench/*.xml -> the git-ignored jvm/bench-lib/). Its
# Avro converter is Apicurio's, the plugin folder scripts/setup.sh already fetched for the CDC platform
# (jvm/cdc-lib/plugins/apicurio-converter), linked in. Run scripts/setup.sh first. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

fetch() {  # fetch NAME FOLDER: jvm/bench/NAME.xml into jvm/bench-lib/FOLDER, again only when the pom changed
  local name="$1" folder="jvm/bench-lib/$2" hash
  hash="$(sha256sum "jvm/bench/$name.xml" | cut -d' ' -f1)"
  [ -f "$folder/.pom.sha256" ] && [ "$(cat "$folder/.pom.sha256")" = "$hash" ] && return 0
  echo "setup_bench: fetching jvm/bench/$name.xml into $folder/"
  rm -rf "$folder"
  if ! mvn -f "jvm/bench/$name.xml" -q -B generate-resources; then
    echo "setup_bench: 'mvn -f jvm/bench/$name.xml generate-resources' failed: Maven Central must be reachable" >&2
    exit 1
  fi
  echo "$hash" > "$folder/.pom.sha256"
}
fetch connect connect
fetch iceberg-sink plugins/iceberg-sink

converter="jvm/cdc-lib/plugins/apicurio-converter"
if ! compgen -G "$converter/*.jar" >/dev/null; then
  echo "setup_bench: $converter is missing: run scripts/setup.sh first" >&2
  exit 1
fi
# Connect's plugin.path is jvm/bench-lib/plugins: each folder in it is one plugin with its own class loader.
ln -sfn "$(cd "$converter" && pwd)" jvm/bench-lib/plugins/apicurio-converter
echo "setup_bench: done"
