"""A port counts as free once nothing listens on it, even while a stopped server's connections
linger in TIME_WAIT (llama-server binds over them: its HTTP library sets SO_REUSEPORT), so a
restarted llama-server keeps its port."""

from __future__ import annotations

import socket

from quantload.llamacpp.server import port_is_free


def test_listening_is_taken_and_lingering_connections_are_not() -> None:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    assert not port_is_free("127.0.0.1", port)
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # the server side closes first: its end lingers in TIME_WAIT
    client.close()
    server.close()
    assert port_is_free("127.0.0.1", port)
    again = socket.socket()
    again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    again.bind(("127.0.0.1", port))  # as llama-server would
    again.close()
