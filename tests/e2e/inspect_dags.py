"""Run in a fresh interpreter by test_airflow.py: parse the DAG folder as the scheduler would and
print what the DAGs declare, which modules parsing imported, and how long it took, as JSON."""

from __future__ import annotations

import json
import sys
import time


def main(dag_folder: str, heavy: list[str]) -> None:
    started = time.perf_counter()
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=dag_folder)
    elapsed = time.perf_counter() - started
    dags = {}
    for dag_id, dag in bag.dags.items():
        tasks = {
            t.task_id: {
                "downstream": sorted(t.downstream_task_ids),
                "retries": t.retries,
                "owner": t.owner,
                "type": type(t).__name__,
                "bases": [c.__name__ for c in type(t).__mro__],
                "trigger_rule": getattr(t.trigger_rule, "value", str(t.trigger_rule)),
                "outlets": [a.name for a in t.outlets],
                "inlets": [a.name for a in t.inlets],
            }
            for t in dag.tasks
        }
        dags[dag_id] = {
            "tags": sorted(dag.tags),
            "max_active_runs": dag.max_active_runs,
            "schedule": str(dag.schedule),
            "doc": bool(dag.doc_md),
            "params": {
                k: {"default": dag.params[k], **dag.params.get_param(k).schema} for k in dag.params
            },
            "tasks": tasks,
        }
    out = {
        "errors": {k: str(v) for k, v in bag.import_errors.items()},
        "seconds": elapsed,
        "heavy": sorted(m for m in sys.modules if m.split(".")[0] in heavy),
        "dags": dags,
    }
    print("RESULT" + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
