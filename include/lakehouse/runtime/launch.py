"""How the lakehouse's two Spark servers' JVMs are launched (:mod:`lakehouse.runtime.server`, the
pipeline's; :mod:`lakehouse.runtime.readers`, the readers'): pyspark's ``spark-submit`` of the
lakehouse's own main class (``include/jvm/server``) in one of its modes, and the servers' Log4j
settings."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from lakehouse.errors import ConfigError

SERVER_CLASS = "lakehouse.server.LakehouseServer"  # include/jvm/server
# Where Spark's client (and Spark's own Connect server) look for a token: never in a server's
# environment, which gets its token on its standard input.
TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"
LOG_LEVEL_ENV, LOG_SIZE_ENV, LOG_FILES_ENV = (
    "LAKEHOUSE_SPARK_LOG_LEVEL",
    "LAKEHOUSE_SPARK_LOG_SIZE",
    "LAKEHOUSE_SPARK_LOG_FILES",
)
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF")
# Log4j 2 for a server's JVM (Spark's own default is INFO to the console: a line per task of
# every query, megabytes an hour): one rolling file.
_LOG4J2 = """\
appender.file.type = RollingFile
appender.file.name = file
appender.file.fileName = {log}
appender.file.filePattern = {log}.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = {size}
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = {files}
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = file
"""


def log_config(folder: Path) -> Path:
    """Write a server's Log4j 2 settings (see the module docstring: ``server.log`` in
    ``folder``) and return their file; a level or size that is not one is a ConfigError naming
    its variable."""
    from lakehouse.runtime.config import whole_number_setting

    level = os.environ.get(LOG_LEVEL_ENV, "WARN").strip().upper()
    if level not in LOG_LEVELS:
        raise ConfigError(f"{LOG_LEVEL_ENV}={level!r}: expected one of {', '.join(LOG_LEVELS)}")
    size = os.environ.get(LOG_SIZE_ENV, "10MB").strip().upper().replace(" ", "")
    if not re.fullmatch(r"\d+(KB|MB|GB)", size):
        raise ConfigError(f"{LOG_SIZE_ENV}={size!r}: a size such as 500KB, 10MB or 1GB")
    files = whole_number_setting(LOG_FILES_ENV, 5, "old log files", least=1)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "log4j2.properties"
    text = _LOG4J2.format(log=folder / "server.log", size=size, files=files, level=level)
    path.write_text(text, encoding="utf-8")
    return path


def server_main_argv(conf: Mapping[str, str], java_options: str, mode: str) -> list[str]:
    """The ``spark-submit`` that runs the server main class in ``mode`` (``pipeline`` or
    ``readers``) with ``conf``; its token goes to its standard input."""
    import pyspark

    from lakehouse.runtime.spark import conf_args

    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    rest = dict(conf)
    master = rest.pop("spark.master")
    name = rest.pop("spark.app.name")
    memory = rest.pop("spark.driver.memory")
    return [
        str(submit),
        "--class",
        SERVER_CLASS,
        "--master",
        master,
        "--name",
        name,
        "--driver-memory",
        memory,
        "--driver-java-options",
        java_options,
        *conf_args(rest),
        "spark-internal",
        mode,
    ]
