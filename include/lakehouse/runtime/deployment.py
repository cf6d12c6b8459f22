"""Checks of a deployment's settings that run before any of its services starts work: the
platform's answer to a `.env` copied from `.env.example` and started as it is.

``python -m lakehouse.runtime.deployment`` checks this process's environment and exits 2 with
the variables to set when a check fails; docker-compose.yml runs it as its first service, and
every other service waits for it. ``lakehouse airflow`` and ``lakehouse spark start`` run the
same checks on the environment they start with.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from lakehouse.errors import CONFIG_ERROR_EXIT, ConfigError

PLACEHOLDER = "change-me"
# The variables of a deployment: Airflow's, the store's, the metadata database's, the
# lakehouse's own (a placeholder in any other variable of the process is none of ours).
PREFIXES = ("AIRFLOW", "_AIRFLOW", "AWS_", "POSTGRES_", "MINIO_", "LAKEHOUSE_", "SPARK_CONNECT")


def placeholders(env: Mapping[str, str]) -> list[str]:
    """The deployment variables that still hold ``.env.example``'s placeholder (anywhere in
    the value: a database URL built from a placeholder password holds it too)."""
    return sorted(
        name for name, value in env.items() if name.startswith(PREFIXES) and PLACEHOLDER in value
    )


def check_environment(env: Mapping[str, str]) -> None:
    """Refuse to start with a secret left at ``change-me``: a ConfigError naming each variable
    and how to make a value."""
    left = placeholders(env)
    if left:
        raise ConfigError(
            f"{', '.join(left)} still hold{'s' if len(left) == 1 else ''} the placeholder "
            f"{PLACEHOLDER!r} from .env.example: set a value of your own in .env (a secret: "
            '`openssl rand -hex 32`; the Fernet key: `python -c "from cryptography.fernet '
            'import Fernet; print(Fernet.generate_key().decode())"`), then start again'
        )


def main() -> int:
    try:
        check_environment(os.environ)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return CONFIG_ERROR_EXIT
    print("deployment settings: no placeholder left")
    return 0


if __name__ == "__main__":
    sys.exit(main())
