"""Airflow's log servers for `make airflow`, on 127.0.0.1.

Airflow's scheduler and triggerer each start a log server (Airflow's own app,
``airflow.utils.serve_logs``), from which the API server fetches the log of a task while it runs,
and it listens on every address of the machine (``[::]`` or ``0.0.0.0``) with no setting to
change that. `make airflow` starts both components with ``--skip-serve-logs`` and runs this
instead: the same app, serving the same log folder, on 127.0.0.1 at ``[logging]
worker_log_server_port`` (8793) and ``trigger_log_server_port`` (8794), in one process.

The API server finds a log server at the host the task's worker reported
(``[core] hostname_callable``); `make airflow` sets that to :func:`loopback`, so the address it
asks is the one this server listens on. (On one machine the API server also reads every log from
the files themselves; the log server adds the lines a running task has not yet flushed.)
"""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def loopback() -> str:
    """The host a task's log is fetched from (``[core] hostname_callable``): this machine's
    loopback address, where :func:`main` listens."""
    return LOOPBACK


def ports() -> list[int]:
    """The ports Airflow's configuration gives its two log servers (one, if both are the same)."""
    from airflow.configuration import conf

    return sorted(
        {
            conf.getint("logging", "worker_log_server_port"),
            conf.getint("logging", "trigger_log_server_port", fallback=8794),
        }
    )


def main() -> None:
    """Serve Airflow's log app on 127.0.0.1 at :func:`ports`, until stopped."""
    import uvicorn
    from airflow.configuration import conf

    sockets = []
    for port in ports():
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((LOOPBACK, port))
        listener.listen(64)
        sockets.append(listener)
    config = uvicorn.Config(
        "airflow.utils.serve_logs.log_server:get_app",
        log_level=conf.get("logging", "uvicorn_logging_level", fallback="info").lower(),
        log_config=None,
        access_log=False,
    )
    print(f"log server on {', '.join(f'{LOOPBACK}:{p}' for p in ports())}", flush=True)
    uvicorn.Server(config).run(sockets=sockets)


if __name__ == "__main__":
    main()
