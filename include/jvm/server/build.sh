#!/usr/bin/env bash
# Compile the Spark server's own JVM code (include/jvm/server/src) into one jar:
#
#   include/jvm/server/build.sh <jar> <pyspark's jars folder>
#
# javac compiles against pyspark's jars alone (nothing is resolved or downloaded); the jar is
# written beside <jar> and renamed over it, so a running server keeps reading the one it started
# with. `make install` and the image run this.
set -euo pipefail

jar_path=$1
pyspark_jars=$2
here=$(cd "$(dirname "$0")" && pwd)

command -v javac > /dev/null || {
	echo "javac is missing: the Spark server's JVM code (include/jvm/server) is built with a JDK 17+" >&2
	echo "(Debian/Ubuntu: apt-get install openjdk-17-jdk-headless)" >&2
	exit 1
}
classes=$(mktemp -d)
trap 'rm -rf "$classes"' EXIT
mapfile -t sources < <(find "$here/src" -name '*.java' | sort)
javac -nowarn --release 17 -d "$classes" -cp "$pyspark_jars/*" "${sources[@]}"
jar --create --file "$jar_path.tmp" -C "$classes" .
mv "$jar_path.tmp" "$jar_path"
echo "built $jar_path"
