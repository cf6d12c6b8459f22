"""Airflow: the DAG builders, their Params and assets (:mod:`~lakehouse.orchestration.dags`),
the environment Airflow runs in (:mod:`~lakehouse.orchestration.airflow_env`), and the plugin
that serves the data-quality reports (:mod:`~lakehouse.orchestration.airflow_plugin`).
"""
