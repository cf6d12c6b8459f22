"""Kafka's streams and tables on a Delta lakehouse.

Topics land as segment files or live on a Kafka broker, are ingested into Delta *bronze* tables,
decoded by their contracts into typed *silver* streams, and aggregated into *gold* tables whose
change data feed is their changelog. Airflow schedules the layers as micro-batches; every write
is exactly-once.

The folders are the architecture; each imports only from those below it (``make lint`` checks
it):

* :mod:`lakehouse.cli`: the ``lakehouse`` command.
* :mod:`lakehouse.orchestration`: Airflow: DAG builders, Params, assets, the environment.
* :mod:`lakehouse.pipeline`: one micro-batch of a topic, layer by layer, and what a run is
  asked to do.
* :mod:`lakehouse.tables`: gold: latest values, aggregates, windows, joins, rebuilds.
* :mod:`lakehouse.streams`: silver: decoding, quarantine, the schema registry.
* :mod:`lakehouse.topics`: topics and bronze: landing files, Kafka, ingest.
* :mod:`lakehouse.quality`: expectations, the gate, the ledger, reports.
* :mod:`lakehouse.storage`: the Delta door every layer reads and writes through.
* :mod:`lakehouse.contracts`: the data contracts and the wire formats they declare.
* :mod:`lakehouse.runtime`: settings, where data lives, the JVM, the Spark session and server,
  the local Kafka broker, S3 API and PostgreSQL.
* :mod:`lakehouse.errors`: typed errors, shared by all.
"""

__version__ = "0.1.0"
