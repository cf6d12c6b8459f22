"""Data-quality notifications: what a message says, who gets it, and what happens when it cannot
be sent, through Airflow's SMTP notifier to a real SMTP server on 127.0.0.1."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from lakehouse.errors import ConfigError
from lakehouse.orchestration.notify import (
    Notice,
    NotificationError,
    notice,
    recipients,
    report_url,
    send_notices,
)
from mail_server import SENDER, Mailbox, smtp_server

CONN_ENV = "AIRFLOW_CONN_LAKEHOUSE_NOTIFY"


def _check(
    expectation: str,
    kind: str,
    severity: str,
    *,
    column: str | None = None,
    observed: Any = None,
    counts: tuple[int, int] | None = None,
    sample: list[Any] | None = None,
    version: int | None = None,
) -> dict[str, Any]:
    """A failed check as the ledger holds it."""
    return {
        "expectation": expectation,
        "kind": kind,
        "column": column,
        "severity": severity,
        "success": False,
        "observed_value": None if observed is None else json.dumps(observed),
        "element_count": None if counts is None else counts[1],
        "unexpected_count": None if counts is None else counts[0],
        "unexpected_sample": json.dumps(sample) if sample else None,
        "published": version is not None,
        "table_version": version,
    }


BERLIN_ONLY = _check(
    "berlin_only",
    "in_set",
    "fail",
    column="location",
    counts=(4, 5),
    sample=["Paris", "Sydney", "Rome", "Oslo"],
)
FEW_ROWS = _check("enough_rows", "row_count_between", "warn", observed=2)


def _notice(table: str, *checks: dict[str, Any], log_url: str | None = None) -> Notice:
    return notice(
        "silver",
        table,
        list(checks),
        topic="user-locations",
        dag_id="pipeline__user-locations",
        run_id="manual__2026-01-01T00:00:00+00:00",
        report_url="http://airflow.example.com/plugin/lakehouse/data-quality/",
        log_url=log_url,
    )


def test_a_notice_names_the_table_each_failed_check_what_it_saw_and_the_links() -> None:
    sent = _notice(
        "user_locations",
        BERLIN_ONLY,
        FEW_ROWS,
        log_url="http://airflow.example.com/dags/d/runs/r/tasks/silver",
    )
    assert sent.subject == (
        "Data quality FAIL: silver.user_locations (berlin_only, enough_rows) in "
        "pipeline__user-locations"
    )
    assert (
        "2 data-quality check(s) of table <b>silver.user_locations</b> (topic "
        "<code>user-locations</code>) failed in DAG run "
        "<code>manual__2026-01-01T00:00:00+00:00</code> of <code>pipeline__user-locations</code>"
    ) in sent.html
    assert (
        "<tr><td>fail</td><td>berlin_only (in_set location): 4 of 5 rows unexpected, "
        "e.g. Paris, Sydney, Rome</td></tr>"
    ) in sent.html
    assert (
        "<tr><td>warn</td><td>enough_rows (row_count_between): observed 2 rows</td></tr>"
    ) in sent.html
    assert "Nothing of the batch was published." in sent.html
    assert (
        "Data-quality report: <a href='http://airflow.example.com/plugin/lakehouse/data-quality/'>"
    ) in sent.html
    assert "Task log: <a href='http://airflow.example.com/dags/d/runs/r/tasks/silver'>" in sent.html


def test_a_notice_of_warnings_says_the_batch_was_published() -> None:
    sent = _notice("user_locations", {**FEW_ROWS, "published": True, "table_version": 7})
    assert sent.subject.startswith("Data quality WARN: silver.user_locations (enough_rows)")
    assert "The batch was published as version 7." in sent.html
    assert "Task log" not in sent.html


def test_values_from_the_data_reach_the_reader_as_text() -> None:
    odd = _check(
        "berlin_only",
        "in_set",
        "fail",
        column="location",
        counts=(1, 1),
        sample=["<img src=x onerror=alert(1)>"],
    )
    sent = _notice("user_locations", odd)
    assert "&lt;img src=x onerror=alert(1)&gt;" in sent.html
    assert "<img" not in sent.html


@pytest.mark.parametrize(
    ("to", "expected"),
    [
        ("a@example.com", ["a@example.com"]),
        (
            "a@example.com, b@example.com;c@example.com",
            ["a@example.com", "b@example.com", "c@example.com"],
        ),
        (["a@example.com", "b@example.com"], ["a@example.com", "b@example.com"]),
    ],
)
def test_recipients_come_from_the_connections_extra(to: Any, expected: list[str]) -> None:
    assert recipients("lakehouse_notify", "smtp", {"to": to}) == expected


@pytest.mark.parametrize("extra", [{}, {"to": ""}, {"to": " , "}, {"to": []}])
def test_a_connection_that_names_nobody_is_refused_saying_what_to_set(
    extra: dict[str, Any],
) -> None:
    with pytest.raises(ConfigError) as info:
        recipients("lakehouse_notify", "smtp", extra)
    assert str(info.value) == (
        "Airflow connection 'lakehouse_notify' names no recipients: set 'to' in its extra "
        '(e.g. {"to": "data-team@example.com, oncall@example.com"})'
    )


def test_a_connection_that_is_not_smtp_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        recipients("lakehouse_notify", "http", {"to": "a@example.com"})
    assert str(info.value) == (
        "Airflow connection 'lakehouse_notify' is of type 'http': data-quality notifications "
        "go through a connection of type 'smtp'"
    )


def test_the_report_link_is_under_airflows_base_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.com/team/")
    assert report_url() == "https://airflow.example.com/team/plugin/lakehouse/data-quality/"


@pytest.fixture
def mail() -> Iterator[Mailbox]:
    with smtp_server() as box:
        yield box


def test_each_notice_is_one_message_to_the_connections_recipients(
    mail: Mailbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CONN_ENV, mail.connection("data@example.com; oncall@example.com"))
    notices = [_notice("user_locations", BERLIN_ONLY), _notice("other_table", FEW_ROWS)]
    send_notices("lakehouse_notify", "silver", notices, {})
    assert [m.recipients for m in mail.received] == [["data@example.com", "oncall@example.com"]] * 2
    assert [m.subject for m in mail.received] == [n.subject for n in notices]
    first = mail.received[0]
    assert first.message["From"] == SENDER
    assert first.message["To"] == "data@example.com, oncall@example.com"
    assert "berlin_only (in_set location): 4 of 5 rows unexpected" in first.html


def test_without_the_connection_nothing_is_sent_and_the_log_says_so_once(
    mail: Mailbox, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(CONN_ENV, raising=False)
    caplog.set_level(logging.INFO, logger="lakehouse.orchestration.notify")
    notices = [_notice("user_locations", BERLIN_ONLY), _notice("other_table", FEW_ROWS)]
    send_notices("lakehouse_notify", "silver", notices, {})
    assert mail.received == []
    # Only the notifier's own lines: the mail server's (aiosmtpd logs a connection an earlier
    # test left at INFO) are not what this is about.
    ours = [r for r in caplog.records if r.name == "lakehouse.orchestration.notify"]
    assert [(r.levelname, r.getMessage()) for r in ours] == [
        (
            "WARNING",
            "data-quality notification not sent (silver.user_locations, silver.other_table): "
            "no Airflow connection 'lakehouse_notify' is configured (set "
            "AIRFLOW_CONN_LAKEHOUSE_NOTIFY, or name another connection in LAKEHOUSE_NOTIFY_CONN)",
        )
    ]


def test_a_message_that_cannot_be_sent_is_logged_and_raised_naming_each_table(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with smtp_server() as gone:
        connection = gone.connection("data@example.com")
    # The server has stopped: nothing listens on its port any more.
    monkeypatch.setenv(CONN_ENV, connection)
    notices = [_notice("user_locations", BERLIN_ONLY), _notice("other_table", FEW_ROWS)]
    with pytest.raises(NotificationError) as info:
        send_notices("lakehouse_notify", "silver", notices, {})
    assert str(info.value) == (
        "the data-quality notification of silver.user_locations, silver.other_table was not "
        "sent through Airflow connection 'lakehouse_notify' (see the errors above)"
    )
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert [e.split(": ")[0] for e in errors] == [
        "data-quality notification of silver.user_locations not sent through Airflow "
        "connection 'lakehouse_notify'",
        "data-quality notification of silver.other_table not sent through Airflow "
        "connection 'lakehouse_notify'",
    ]
    assert all("ConnectionRefusedError" in e for e in errors)
