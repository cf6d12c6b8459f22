"""Kafka's streams and tables on a Delta lakehouse.

Topics land as segment files, are ingested into Delta *bronze* tables, decoded by their contracts
into typed *silver* streams, and aggregated into *gold* tables whose change data feed is their
changelog. Airflow schedules the layers as micro-batches; every write is exactly-once.
"""

__version__ = "0.1.0"
