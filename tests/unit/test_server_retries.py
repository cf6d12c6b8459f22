"""A Connect client of the Spark server stops retrying once its server is gone: Spark's own policy
retries an unavailable server for ten minutes or more, while the layer holds its table's lock."""

from __future__ import annotations

import socket

import grpc
import pytest

from lakehouse.runtime import server


class Unavailable(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE


def test_a_failed_call_raises_server_down_once_nothing_answers_at_the_servers_port() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = int(listener.getsockname()[1])
        policy = server._while_answering("127.0.0.1", port)
        # The server still answers: Spark's own policy decides (it retries UNAVAILABLE).
        assert policy.can_retry(Unavailable()) is True
    # Closed: the next failed call stops the client, saying how to start the server again.
    with pytest.raises(server.ServerDown, match=rf"127\.0\.0\.1:{port} went down .*spark start"):
        policy.can_retry(Unavailable())
    # An error that is not the connection's is still Spark's to judge.
    assert policy.can_retry(ValueError("not a gRPC error")) is False
