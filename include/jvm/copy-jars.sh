#!/bin/sh
# Copy the jars POM names (default: include/jvm/pom.xml, Spark's) into OUTPUT_DIR, from Maven
# Central with Central's checksums enforced (-C). The folder is replaced whole: a jar dropped from
# the pom does not stay behind. `make install` and `make jars-lock` copy Spark's into .venv/jars
# and the Kafka broker's (include/jvm/kafka/pom.xml) into .venv/kafka-jars, the Dockerfile Spark's
# into /usr/local/jars; `python -m lakehouse.runtime.jvm [spark|kafka]` then checks them against the lock
# beside the pom (jars.sha256).
# MVN names the Maven to run (default: mvn on the PATH).
set -eu
out=${1:?usage: copy-jars.sh OUTPUT_DIR [POM]}
mvn=${MVN:-mvn}
pom=${2:-$(dirname "$0")/pom.xml}
pom=$(cd "$(dirname "$pom")" && pwd)/$(basename "$pom")

if ! command -v "$mvn" > /dev/null 2>&1; then
    cat >&2 << EOF
error: Maven ('$mvn') is not installed. It copies the JVM jars of the platform from Maven Central,
once, at install: those Spark needs beyond pyspark's (Delta Lake, Spark's Avro source:
include/jvm/pom.xml) and the local Kafka broker's (include/jvm/kafka/pom.xml).
Install it with your package manager (Debian/Ubuntu: sudo apt-get install maven; macOS:
brew install maven) or from https://maven.apache.org/download.cgi, or set MVN=/path/to/mvn,
then run make again.
EOF
    exit 1
fi

case $out in /*) ;; *) out=$(pwd)/$out ;; esac
rm -rf "$out.tmp"
# Maven's log is shown only if it fails (its quiet mode still prints colour codes).
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! "$mvn" -B -ntp -C -f "$pom" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$out.tmp" > "$log" 2>&1; then
    cat "$log" >&2
    echo "error: Maven could not copy the jars of $pom (its log is above)" >&2
    exit 1
fi
rm -rf "$out"
mv "$out.tmp" "$out"
echo "copied $(ls "$out" | wc -l) jars of $pom into $out"
