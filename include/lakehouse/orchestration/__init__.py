"""Airflow, split by the process each part runs in:

* at DAG parse time: the DAG builders and their Params (:mod:`~lakehouse.orchestration.dags`)
  and the assets (:mod:`~lakehouse.orchestration.assets`, whose Kafka trigger callback runs in
  the triggerer);
* in the workers: the layer task's operator (:mod:`~lakehouse.orchestration.operators`) and the
  Python tasks' callables (:mod:`~lakehouse.orchestration.callables`);
* around Airflow: the environment it runs in (:mod:`~lakehouse.orchestration.airflow_env`) and
  the plugin that serves the data-quality reports (:mod:`~lakehouse.orchestration.airflow_plugin`).
"""
