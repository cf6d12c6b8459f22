"""The daily maintenance DAG: compaction, consumer-aware vacuum and checkpoints of every table.

Built by `lakehouse.orchestration` from the contracts; this file only exposes it to Airflow.
Parsing it imports no Spark or Delta.
"""

from lakehouse.orchestration import maintenance_dags

globals().update(maintenance_dags())
