"""Someone is told: a layer task whose checks failed sends one message per table through Airflow's
SMTP notifier, naming the table, each failed expectation with its severity and what it saw, the
DAG run, and links to the data-quality page and the task's log.

Which checks notify is the contract's (``quality.notify``: the least severity that does, ``fail``
by default). Where the messages go is the deployment's: the Airflow connection
``$LAKEHOUSE_NOTIFY_CONN`` (default ``lakehouse_notify``), of type ``smtp``, whose extra holds
the recipients (``to``) beside the SMTP notifier's own settings (``from_email``, ...). Without
that connection nothing is sent, and the task's log says so.

The notifier is the layer task's ``on_success_callback`` and ``on_failure_callback``: Airflow
calls it once the task has ended for good (after its last try), in the task's process. A `fail`
check fails the layer task itself (its gate task then does not run), so the layer task is where
every failed check can be told, and a failed task stays failed whether or not the message goes
out: Airflow logs a callback's error, with its traceback, and moves on.

Imported at DAG parse time (the layer tasks are built with the notifier); the ledger is read only
when a task has ended.
"""

from __future__ import annotations

import html
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow.sdk.bases.notifier import BaseNotifier

from lakehouse.contracts.model import SEVERITIES, Contract
from lakehouse.errors import ConfigError, LakehouseError
from lakehouse.orchestration.airflow_plugin import URL_PREFIX, URL_ROUTE
from lakehouse.runtime.config import Layer, Settings

log = logging.getLogger(__name__)

SMTP = "smtp"
# Where Airflow's own links start when ``[api] base_url`` is not set (the task runner's log_url).
DEFAULT_BASE_URL = "http://localhost:8080/"


class NotificationError(LakehouseError):
    """A data-quality message could not be sent; the message names the connection and the
    tables whose message did not go out."""


@dataclass(frozen=True)
class Notice:
    """One message: the failed checks of one table in one DAG run."""

    table: str
    subject: str
    html: str


def notice(
    layer: str,
    table: str,
    checks: Sequence[Mapping[str, Any]],
    *,
    topic: str,
    dag_id: str,
    run_id: str,
    report_url: str,
    log_url: str | None = None,
) -> Notice:
    """The message about a table's failed ``checks`` (ledger rows) in a DAG run: the subject
    names the gravest severity, the table, the failed expectations and the DAG; the body (HTML)
    lists each check with its severity and what it saw, says what was published, and links to
    the data-quality page and the task's log."""
    from lakehouse.quality.reports import check_text

    esc = html.escape
    gravest = max((c["severity"] for c in checks), key=SEVERITIES.index)
    names = ", ".join(dict.fromkeys(c["expectation"] for c in checks))
    subject = f"Data quality {gravest.upper()}: {layer}.{table} ({names}) in {dag_id}"
    versions = sorted({c["table_version"] for c in checks if c["published"]})
    published = (
        "The batch was published as version " + ", ".join(str(v) for v in versions) + "."
        if versions
        else "Nothing of the batch was published."
    )
    rows = "".join(
        f"<tr><td>{esc(c['severity'])}</td><td>{esc(check_text(c))}</td></tr>" for c in checks
    )
    links = [("Data-quality report", report_url)] + ([("Task log", log_url)] if log_url else [])
    body = "\n".join(
        [
            "<html><body>",
            f"<p>{len(checks)} data-quality check(s) of table <b>{esc(layer)}.{esc(table)}</b> "
            f"(topic <code>{esc(topic)}</code>) failed in DAG run <code>{esc(run_id)}</code> "
            f"of <code>{esc(dag_id)}</code>.</p>",
            "<table border='1' cellpadding='4' style='border-collapse: collapse'>"
            "<tr><th>severity</th><th>expectation: what was seen</th></tr>"
            f"{rows}</table>",
            f"<p>{published}</p>",
            "<p>"
            + "<br>".join(f"{name}: <a href='{esc(url)}'>{esc(url)}</a>" for name, url in links)
            + "</p>",
            "</body></html>",
        ]
    )
    return Notice(table, subject, body)


def recipients(conn_id: str, conn_type: str | None, extra: Mapping[str, Any]) -> list[str]:
    """The addresses in the extra ``to`` of the notification connection (a text of addresses
    separated by commas or semicolons, or a list); a connection that is not of type ``smtp``,
    or names nobody, is a ConfigError saying which connection and what to set."""
    if conn_type != SMTP:
        raise ConfigError(
            f"Airflow connection {conn_id!r} is of type {conn_type!r}: data-quality "
            f"notifications go through a connection of type {SMTP!r}"
        )
    raw = extra.get("to")
    found = (
        [a.strip() for a in raw.replace(";", ",").split(",")]
        if isinstance(raw, str)
        else [str(a).strip() for a in raw]
        if isinstance(raw, list)
        else []
    )
    found = [a for a in found if a]
    if not found:
        raise ConfigError(
            f"Airflow connection {conn_id!r} names no recipients: set 'to' in its extra "
            '(e.g. {"to": "data-team@example.com, oncall@example.com"})'
        )
    return found


def report_url() -> str:
    """The data-quality page in the Airflow UI (Browse -> Data quality), under Airflow's
    ``[api] base_url``."""
    from airflow.sdk.configuration import conf

    base = conf.get("api", "base_url", fallback=DEFAULT_BASE_URL) or DEFAULT_BASE_URL
    return f"{base.rstrip('/')}/plugin/{URL_ROUTE}{URL_PREFIX}/"


class QualityNotifier(BaseNotifier):
    """The callback of a layer task: one message per table of ``tables`` whose checks of the
    notified severities failed in the task's DAG run (see the module's docstring)."""

    def __init__(self, contract: Contract, layer: Layer, tables: Sequence[str]) -> None:
        super().__init__()
        self.topic = contract.topic
        self.layer = layer
        self.tables = list(tables)
        self.severities = contract.quality.notified

    def notify(self, context: Any) -> None:
        if context["params"].get("dry_run"):
            return  # nothing was validated
        from lakehouse.quality.reports import failed_checks

        settings = Settings.from_env()
        run_id = context["run_id"]
        failures = failed_checks(settings, run_id, self.layer, self.tables, self.severities)
        notices = [
            notice(
                self.layer,
                table,
                checks,
                topic=self.topic,
                dag_id=context["dag_run"].dag_id,
                run_id=run_id,
                report_url=report_url(),
                log_url=getattr(context.get("ti"), "log_url", None),
            )
            for table, checks in failures.items()
        ]
        send_notices(settings.notify_conn_id, self.layer, notices, context)


def send_notices(conn_id: str, layer: str, notices: Sequence[Notice], context: Any) -> None:
    """Send each of a layer's ``notices`` through the Airflow connection ``conn_id`` with
    Airflow's SMTP notifier. Without that connection nothing is sent, and one warning says so.
    A message that cannot be sent is logged as an error naming its table and the connection, the
    others are still sent, and a :class:`NotificationError` then names every table not told."""
    if not notices:
        return
    found = _connection(conn_id)
    if found is None:
        log.warning(
            "data-quality notification not sent (%s): no Airflow connection %r is configured "
            "(set AIRFLOW_CONN_%s, or name another connection in LAKEHOUSE_NOTIFY_CONN)",
            ", ".join(f"{layer}.{n.table}" for n in notices),
            conn_id,
            conn_id.upper(),
        )
        return
    to = recipients(conn_id, found.conn_type, found.extra_dejson)
    failed: list[str] = []
    for message in notices:
        try:
            _send(conn_id, to, message, context)
        except Exception as exc:  # one table's message failing does not hold back the next
            log.error(
                "data-quality notification of %s.%s not sent through Airflow connection %r: %s: %s",
                layer,
                message.table,
                conn_id,
                type(exc).__name__,
                exc,
            )
            failed.append(f"{layer}.{message.table}")
            continue
        log.info(
            "data-quality notification of %s.%s sent to %s through Airflow connection %r",
            layer,
            message.table,
            ", ".join(to),
            conn_id,
        )
    if failed:
        raise NotificationError(
            f"the data-quality notification of {', '.join(failed)} was not sent through Airflow "
            f"connection {conn_id!r} (see the errors above)"
        )


def _connection(conn_id: str) -> Any:
    """The notification connection, or None when Airflow has none of that id."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None


def _send(conn_id: str, to: list[str], message: Notice, context: Any) -> None:
    """Send one message with Airflow's SMTP notifier, through the connection ``conn_id`` (its
    host, port, login, TLS settings and ``from_email``)."""
    from airflow.providers.smtp.notifications.smtp import SmtpNotifier

    notifier = SmtpNotifier(
        to=to, subject=message.subject, html_content=message.html, smtp_conn_id=conn_id
    )
    # notify(), not the notifier's __call__: that renders its fields as Jinja templates, and the
    # message quotes values from the data, which must reach the reader as they are.
    notifier.notify(context)
