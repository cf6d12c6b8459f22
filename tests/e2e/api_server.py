"""Run in a fresh interpreter by test_reports_plugin.py: Airflow's API server (core API and UI,
with every plugin Airflow finds) on 127.0.0.1 and a free port.

Prints one line, ``RESULT`` followed by JSON: the port, what Airflow's plugin manager loaded (and
its import errors), which heavy modules loading the plugins imported, and JWTs for test users
issued by the configured auth manager. Then serves until it is terminated.
"""

from __future__ import annotations

import json
import socket
import sys


def main(heavy: list[str]) -> None:
    from airflow import plugins_manager

    plugins_manager.ensure_plugins_loaded()
    loaded_heavy = sorted(m for m in sys.modules if m.split(".")[0] in heavy)
    # The plugin builds its app (and imports Airflow's API security, with the ORM) only when
    # the API server asks for it.
    security_loaded = "airflow.api_fastapi.core_api.security" in sys.modules
    import_errors = plugins_manager.get_import_errors()

    from airflow.api_fastapi.app import create_app, get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    app = create_app("core")
    auth = get_auth_manager()
    tokens = {
        role or "none": auth.generate_jwt(SimpleAuthManagerUser(username=f"test-{role}", role=role))
        for role in ("admin", "viewer", None)
    }

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)  # connections wait in the backlog until uvicorn serves them
    result = {
        "port": sock.getsockname()[1],
        "plugins": plugins_manager.get_plugin_info(),
        "import_errors": import_errors,
        "heavy": loaded_heavy,
        "security_loaded_with_plugins": security_loaded,
        "auth_manager": type(auth).__name__,
        "tokens": tokens,
    }
    print("RESULT" + json.dumps(result, default=str), flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main(sys.argv[1:])
