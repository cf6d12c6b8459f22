# One image for every service in docker-compose.yml: the Airflow components (api-server,
# scheduler, dag-processor, triggerer), the Spark server and the deployment check.
#
#   docker compose build          (or: docker build -t lakehouse:local .)
#
# The project sits in /opt/lakehouse with include/, dags/, jobs/ and contracts/ side by side:
# `lakehouse.runtime.config.REPO_ROOT` is parents[3] of include/lakehouse/runtime/config.py, so the DAGs find
# jobs/run_layer.py and the contracts beside the package.

# The Data Docs' styles, fonts and scripts (include/web/package.json, locked with their integrity
# hashes by package-lock.json), installed by npm as `make web-assets` does, in a stage of their
# own: the image gets the files, not Node.
FROM node:20-bookworm-slim AS web
WORKDIR /web
COPY include/web/package.json include/web/package-lock.json include/web/.npmrc ./
RUN npm ci --ignore-scripts --no-audit --no-fund

FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Spark 4 needs Java 17 (the JDK: its javac compiles the Spark server's own code below);
# Spark's launch scripts call `ps` (procps); Maven copies the JVM jars below. The man1 folder works around the JRE's post-install step on slim images. JAVA_HOME gets
# an arch-independent name.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jdk-headless procps maven \
    && rm -rf /var/lib/apt/lists/* \
    && ln -s "/usr/lib/jvm/java-17-openjdk-$(dpkg --print-architecture)" /usr/lib/jvm/java-17
ENV JAVA_HOME=/usr/lib/jvm/java-17

WORKDIR /opt/lakehouse

# Dependencies first: this layer is rebuilt only when the lock or pyproject.toml changes.
COPY requirements.lock pyproject.toml ./
RUN pip install --no-cache-dir -r requirements.lock

# The JVM jars Spark gets on top of pyspark's (Delta Lake, Spark's Avro and Kafka sources: include/jvm/pom.xml,
# see lakehouse.runtime.jvm), copied from Maven Central by the same step as `make install`, into the
# interpreter's prefix: /usr/local/jars, where lakehouse.runtime.jvm looks. They are checked against
# their locks below, once the package is installed. Rebuilt only when include/jvm/
# changes; Maven's download cache is not kept.
# The local Kafka broker's jars (`lakehouse kafka start`: include/jvm/kafka/pom.xml, never on
# Spark's class path) go to /usr/local/kafka-jars the same way, and OpenLineage's Spark listener
# (include/jvm/openlineage/pom.xml, on Spark's class path only when LAKEHOUSE_SPARK_OPENLINEAGE_URL
# turns it on) to /usr/local/openlineage-jars.
COPY include/jvm/ include/jvm/
RUN include/jvm/copy-jars.sh /usr/local/jars \
    && include/jvm/copy-jars.sh /usr/local/kafka-jars include/jvm/kafka/pom.xml \
    && include/jvm/copy-jars.sh /usr/local/openlineage-jars include/jvm/openlineage/pom.xml \
    && rm -rf /root/.m2

COPY include/ include/
COPY --from=web /web/node_modules include/web/node_modules
COPY dags/ dags/
COPY jobs/ jobs/
COPY contracts/ contracts/
# Editable install: `lakehouse` is imported from /opt/lakehouse/include, so REPO_ROOT is
# /opt/lakehouse. The check fails the build if that ever stops being true.
RUN pip install --no-cache-dir --no-deps -e . \
    && rm -rf include/lakehouse.egg-info \
    && python -c "import lakehouse.runtime.config as c, sys; sys.exit(0 if str(c.REPO_ROOT) == '/opt/lakehouse' else f'REPO_ROOT is {c.REPO_ROOT}')"
# The Spark server's own code (include/jvm/server: its main class, its credentials, the readers'
# check), compiled as `make install` does, into the interpreter's prefix where
# lakehouse.runtime.jvm looks (/usr/local/lakehouse-server.jar).
RUN include/jvm/server/build.sh /usr/local/lakehouse-server.jar \
    "$(python -c 'from lakehouse.runtime.jvm import pyspark_jars_dir; print(pyspark_jars_dir())')"

# Paths every service agrees on. SPARK_HOME is pip's pyspark folder (bin/spark-class, jars/).
ENV LAKEHOUSE_HOME=/lakehouse \
    LAKEHOUSE_CONTRACTS=/opt/lakehouse/contracts \
    AIRFLOW_HOME=/opt/airflow \
    AIRFLOW__CORE__DAGS_FOLDER=/opt/lakehouse/dags \
    AIRFLOW__CORE__LOAD_EXAMPLES=False \
    PYSPARK_PYTHON=/usr/local/bin/python \
    PYSPARK_DRIVER_PYTHON=/usr/local/bin/python \
    SPARK_HOME=/usr/local/lib/python3.11/site-packages/pyspark

# Fail the build, not the first DAG run, if the stack is not whole.
RUN test -x "$SPARK_HOME/bin/spark-class" \
    && java -version \
    && python -c "import pyspark, pyspark.sql.datasource, deltalake, delta, airflow, psycopg2, lakehouse" \
    && python -m lakehouse.runtime.jvm \
    && python -m lakehouse.runtime.jvm kafka \
    && python -m lakehouse.runtime.jvm openlineage \
    && python -m lakehouse.quality.web_assets

# A non-root user with the uid of the official Airflow image (group 0, as there). The folders
# are created here so that named volumes mounted on them start out owned by that user.
RUN useradd --uid 50000 --gid 0 --home-dir /opt/airflow --no-create-home --shell /bin/bash airflow \
    && mkdir -p /opt/airflow/logs /opt/airflow/auth /lakehouse \
    && chown -R 50000:0 /opt/airflow /lakehouse \
    && chmod -R g+rwX /opt/airflow /lakehouse
USER 50000
WORKDIR /opt/airflow

CMD ["bash"]
