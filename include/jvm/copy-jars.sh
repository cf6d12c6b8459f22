#!/bin/sh
# Copy the jars include/jvm/pom.xml names into OUTPUT_DIR, from Maven Central with Central's
# checksums enforced (-C). The folder is replaced whole: a jar dropped from the pom does not stay
# behind. `make install` and `make jars-lock` copy into .venv/jars, the Dockerfile into
# /usr/local/jars; `python -m lakehouse.jvm` then checks them against include/jvm/jars.sha256.
# MVN names the Maven to run (default: mvn on the PATH).
set -eu
out=${1:?usage: copy-jars.sh OUTPUT_DIR}
mvn=${MVN:-mvn}
pom=$(cd "$(dirname "$0")" && pwd)/pom.xml

if ! command -v "$mvn" > /dev/null 2>&1; then
    cat >&2 << EOF
error: Maven ('$mvn') is not installed. It copies the JVM jars Spark needs beyond pyspark's
(Delta Lake, Spark's Avro source: include/jvm/pom.xml) from Maven Central, once, at install.
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
