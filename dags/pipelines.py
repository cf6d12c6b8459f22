"""Pipeline DAGs, one per topic contract in contracts/: bronze -> silver -> gold.

The DAGs are built by `lakehouse.orchestration.dags` from the contracts; this file only exposes them
to Airflow. Parsing it imports Airflow and the contracts, never Spark or Delta.
"""

from lakehouse.orchestration.dags import pipeline_dags

globals().update(pipeline_dags())
