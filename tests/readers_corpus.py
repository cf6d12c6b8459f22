"""The readers' hostile corpus, which tests/integration/test_readers.py runs on local files and
tests/integration/test_readers_s3.py on a bucket: statements that would change a pipeline table,
its files or its catalog entry, or escape the readers' server, each by what it tries."""

from __future__ import annotations

from lakehouse.runtime import server
from lakehouse.runtime.config import Settings
from lakehouse.runtime.jvm import pyspark_jars_dir

READ_ONLY = "READ_ONLY_CREDENTIAL"
GOLD = "gold.user_latest_location"


def corpus(lake: Settings) -> dict[str, str]:
    """Hostile SQL, by what it tries: each must be refused and change nothing of the pipeline's."""
    gold = str(lake.gold_path("user_latest_location"))
    warehouse = lake.home / "metastore" / "warehouse"
    climb = f"{warehouse}/mine.db/../../../tables/gold/user_latest_location"
    token = server.state_dir(lake) / "token"
    return {
        # The issue's: a reader's own table moved onto gold's folder, then emptied or dropped.
        "set location": f"ALTER TABLE mine.p SET LOCATION '{gold}'",
        "set location file:": f"ALTER TABLE mine.p SET LOCATION 'file:{gold}'",
        "set location file:///": f"ALTER TABLE mine.p SET LOCATION 'file://{gold}'",
        "set location FILE:": f"ALTER TABLE mine.p SET LOCATION 'FILE:{gold}/'",
        "set location ..": f"ALTER TABLE mine.p SET LOCATION '{climb}'",
        "set location /proc/self/root": f"ALTER TABLE mine.p SET LOCATION '/proc/self/root{gold}'",
        "set location s3a": "ALTER TABLE mine.p SET LOCATION 's3a://bucket/lake/tables/gold/x'",
        "serde path": f"ALTER TABLE mine.p SET SERDEPROPERTIES ('path' = '{gold}')",
        "create at gold": f"CREATE TABLE mine.q USING delta LOCATION '{gold}'",
        "create at ..": f"CREATE TABLE mine.q (a INT) USING parquet LOCATION '{climb}'",
        "schema at gold": f"CREATE SCHEMA evil LOCATION '{gold}'",
        # Writes to pipeline tables, by name and by path.
        "insert": f"INSERT INTO {GOLD} SELECT * FROM {GOLD}",
        "insert overwrite": f"INSERT OVERWRITE {GOLD} SELECT * FROM {GOLD} LIMIT 0",
        "merge": (
            f"MERGE INTO {GOLD} t USING (SELECT * FROM {GOLD}) s ON t.username = s.username "
            "WHEN MATCHED THEN DELETE"
        ),
        "update": f"UPDATE {GOLD} SET location = 'Nowhere'",
        "delete": f"DELETE FROM {GOLD}",
        "truncate": f"TRUNCATE TABLE {GOLD}",
        "drop": f"DROP TABLE {GOLD}",
        "drop schema": "DROP SCHEMA gold CASCADE",
        "add columns": f"ALTER TABLE {GOLD} ADD COLUMNS (extra INT)",
        "properties": f"ALTER TABLE {GOLD} SET TBLPROPERTIES ('delta.logRetentionDuration' = '1 hours')",
        "unset properties": f"ALTER TABLE {GOLD} UNSET TBLPROPERTIES ('delta.enableChangeDataFeed')",
        "add constraint": f"ALTER TABLE {GOLD} ADD CONSTRAINT no CHECK (username IS NULL)",
        "rename out": f"ALTER TABLE {GOLD} RENAME TO mine.stolen",
        "rename in": "ALTER TABLE mine.p RENAME TO gold.planted",
        "comment": f"COMMENT ON TABLE {GOLD} IS 'mine'",
        "schema properties": "ALTER SCHEMA gold SET DBPROPERTIES ('note' = 'mine')",
        "schema location": f"ALTER SCHEMA gold SET LOCATION '{warehouse}/gold2'",
        "create in gold": "CREATE TABLE gold.planted (a INT) USING delta",
        "view in gold": "CREATE VIEW gold.planted AS SELECT 1 AS a",
        "by path": f"INSERT INTO delta.`{gold}` SELECT * FROM delta.`{gold}`",
        "delete by path": f"DELETE FROM delta.`{gold}`",
        # Delta's and Spark's commands that write, and what loads or moves files.
        "optimize": f"OPTIMIZE {GOLD}",
        "vacuum": f"VACUUM {GOLD}",
        "restore": f"RESTORE TABLE {GOLD} TO VERSION AS OF 0",
        "reorg": f"REORG TABLE {GOLD} APPLY (PURGE)",
        "drop feature": f"ALTER TABLE {GOLD} DROP FEATURE changeDataFeed",
        "generate": f"GENERATE symlink_format_manifest FOR TABLE {GOLD}",
        "shallow clone": f"CREATE TABLE mine.c SHALLOW CLONE {GOLD}",
        "clone at gold": f"CREATE TABLE mine.d SHALLOW CLONE {GOLD} LOCATION '{gold}'",
        "convert": f"CONVERT TO DELTA parquet.`{lake.landing_root}`",
        "load data": f"LOAD DATA LOCAL INPATH '{token}' INTO TABLE mine.p",
        "into directory": f"INSERT OVERWRITE DIRECTORY '{gold}' USING parquet SELECT 1 AS a",
        "analyze": f"ANALYZE TABLE {GOLD} COMPUTE STATISTICS",
        "analyze schema": "ANALYZE TABLES IN gold COMPUTE STATISTICS",
        "msck": f"MSCK REPAIR TABLE {GOLD}",
        "cache": f"CACHE TABLE {GOLD}",
        # Settings that would choose another file system or catalog, and the escapes.
        "set fs": "SET fs.file.impl = org.apache.hadoop.fs.RawLocalFileSystem",
        "set fs cache": "SET fs.file.impl.disable.cache = true",
        "set catalog": "SET spark.sql.catalog.evil = org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "token file": f"SELECT * FROM text.`{token}`",  # hidden: PATH_NOT_FOUND
        "machine file": "SELECT * FROM text.`/etc/hostname`",
        "http": "SELECT * FROM text.`http://127.0.0.1:1/`",
        "reflect": "SELECT reflect('java.lang.System', 'getenv', 'HOME')",
        "script": f"SELECT TRANSFORM(a) USING 'touch {gold}/pwned' FROM VALUES (1) t(a)",
        "jdbc": "CREATE TEMPORARY VIEW j USING jdbc OPTIONS (url 'jdbc:derby:memory:x;create=true', dbtable 'SYS.SYSTABLES')",
        "add jar": f"ADD JAR {pyspark_jars_dir() / 'hive-exec-2.3.10-core.jar'}",
        "function": "CREATE FUNCTION f AS 'org.apache.hadoop.hive.ql.udf.UDFSubstr'",
    }


def connect_corpus(lake: Settings) -> dict[str, str]:
    """Spark Connect's own ways to write: DataFrameWriter, DataFrameWriterV2, the catalog API,
    UDFs, artifacts and configuration calls."""
    gold = str(lake.gold_path("user_latest_location"))
    token = server.state_dir(lake) / "token"
    return {
        "save by path": f"py:spark.table('{GOLD}').write.format('delta').mode('append').save('{gold}')",
        "overwrite by name": f"py:spark.table('{GOLD}').write.mode('overwrite').saveAsTable('{GOLD}')",
        "writeTo append": f"py:spark.table('{GOLD}').writeTo('{GOLD}').append()",
        "writeTo replace": f"py:spark.table('{GOLD}').writeTo('{GOLD}').using('delta').createOrReplace()",
        "writeTo new in gold": f"py:spark.table('{GOLD}').writeTo('gold.planted').create()",
        "catalog createTable": f"py:spark.catalog.createTable('gold.planted', path='{gold}')",
        "catalog own name at gold": f"py:spark.catalog.createTable('mine.at_gold', path='{gold}')",
        "catalog recoverPartitions": f"py:spark.catalog.recoverPartitions('{GOLD}')",
        "conf fs": "py:spark.conf.set('fs.file.impl', 'org.apache.hadoop.fs.RawLocalFileSystem')",
        "conf s3a": "py:spark.conf.set('fs.s3a.impl', 'org.apache.hadoop.fs.s3a.S3AFileSystem')",
        "read token": f"py:spark.read.text('{token}').collect()",
        "python udf": "py:spark.range(1).select(F.udf(lambda x: x)('id')).collect()",
        "mapInPandas": "py:spark.range(1).mapInPandas(lambda it: it, 'id long').collect()",
        "foreachPartition": "py:spark.range(1).foreachPartition(lambda rows: None)",
        "artifact": f"py:spark.addArtifacts('{token}', file=True)",
    }


def refused(label: str, outcome: str | None) -> bool:
    """Whether a statement of the corpus was refused as it must be: with the read-only message,
    or, for the tokens, by their not being there (the readers' server's sandbox hides them)."""
    if label in {"token file", "read token"}:
        return "PATH_NOT_FOUND" in str(outcome)
    return READ_ONLY in str(outcome)
