package lakehouse.server;

import java.util.Set;

/**
 * The session settings a reader may change (an allow-list, by {@code SET}, Spark Connect's
 * configuration calls and a SQL endpoint login's settings alike): how results are computed and
 * shown, never where data is, which file system or catalog serves it, or what code runs. A
 * session's Hadoop settings ({@code fs.*} ...) go to the file systems its statements use, so a
 * setting a reader could choose would let it pick another file system than the readers' own.
 */
final class SessionSettings {
  private static final Set<String> PREFIXES =
      Set.of(
          "spark.sql.session.",
          "spark.sql.ansi.",
          "spark.sql.adaptive.",
          "spark.sql.optimizer.",
          "spark.sql.execution.arrow.",
          "spark.sql.execution.pandas.",
          "spark.sql.repl.eagerEval.",
          "spark.sql.parquet.",
          "spark.sql.orc.",
          "spark.sql.csv.",
          "spark.sql.json.",
          "spark.sql.files.",
          "spark.sql.pyspark.",
          "spark.sql.connect.",
          // What a JDBC client sends at login (Hive's driver: its fetch size).
          "hive.server2.thrift.resultset.");
  private static final Set<String> KEYS =
      Set.of(
          "spark.sql.shuffle.partitions",
          "spark.sql.caseSensitive",
          "spark.sql.crossJoin.enabled",
          "spark.sql.autoBroadcastJoinThreshold",
          "spark.sql.datetime.java8API.enabled",
          "spark.sql.timestampType",
          "spark.sql.maxMetadataStringLength",
          "spark.sql.debug.maxToStringFields",
          "spark.sql.legacy.timeParserPolicy",
          "spark.sql.mapKeyDedupPolicy",
          "spark.sql.sources.partitionOverwriteMode",
          "spark.sql.hive.version",
          "spark.sql.binaryOutputStyle",
          "spark.databricks.delta.lastCommitVersionInSession",
          "spark.sql.variable.substitute",
          "spark.sql.leafNodeDefaultParallelism",
          "spark.sql.pivotMaxValues");

  private SessionSettings() {}

  /** Whether a reader may set {@code key}. */
  static boolean allowed(String key) {
    return KEYS.contains(key) || PREFIXES.stream().anyMatch(key::startsWith);
  }
}
