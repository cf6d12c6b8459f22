"""A real SMTP server on 127.0.0.1 for the notification tests (aiosmtpd, in a thread of the test
process; imported by name: ``from mail_server import ...``): the messages it received, and the
Airflow connection that sends to it."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from email import message_from_bytes, policy
from email.message import EmailMessage
from typing import Any, cast

SENDER = "lakehouse@example.com"


@dataclass(frozen=True)
class Mail:
    """One message as the server received it: the envelope's recipients and the message."""

    recipients: list[str]
    message: EmailMessage

    @property
    def subject(self) -> str:
        return str(self.message["Subject"])

    @property
    def html(self) -> str:
        part = self.message.get_body(preferencelist=("html",))
        assert part is not None, self.message.as_string()
        return cast(EmailMessage, part).get_content()


@dataclass
class Mailbox:
    """The server's port and what it received, in order."""

    port: int
    received: list[Mail] = field(default_factory=list)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        # aiosmtpd's hook, called once a message's DATA has arrived; the client hears 250 only
        # after this returns, so a sender that saw its message accepted finds it here.
        message = message_from_bytes(envelope.content, policy=policy.default)
        self.received.append(Mail(list(envelope.rcpt_tos), cast(EmailMessage, message)))
        return "250 Message accepted for delivery"

    def connection(self, to: str) -> str:
        """An Airflow connection (JSON, for ``AIRFLOW_CONN_<ID>``) of type smtp that sends to this
        server, in plain text (it offers no TLS), from :data:`SENDER` to ``to``, without
        retrying (a test of a failure should not wait for retries)."""
        return json.dumps(
            {
                "conn_type": "smtp",
                "host": "127.0.0.1",
                "port": self.port,
                "extra": {
                    "from_email": SENDER,
                    "to": to,
                    "disable_tls": True,
                    "disable_ssl": True,
                    "retry_limit": 0,
                    "timeout": 30,
                },
            }
        )


@contextlib.contextmanager
def smtp_server() -> Iterator[Mailbox]:
    """An SMTP server on a free port of 127.0.0.1 while the block runs (a port taken by another
    process before the server binds it: up to two more are tried)."""
    from aiosmtpd.controller import Controller

    for attempt in range(3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        box = Mailbox(port)
        controller = Controller(box, hostname="127.0.0.1", port=port)
        try:
            controller.start()
        except OSError:
            if attempt == 2:
                raise
            continue
        try:
            yield box
        finally:
            controller.stop()
        return
