"""The daily maintenance DAG: compaction, consumer-aware vacuum and checkpoints of every table.

Built by `lakehouse.orchestration.dags` from the contracts; this file only exposes it to Airflow.
Parsing it imports no Spark or Delta.
"""

from lakehouse.orchestration.dags import maintenance_dags

globals().update(maintenance_dags())
