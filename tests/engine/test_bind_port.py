"""An engine's port, bound before its model loads, is its own until it listens (api/graceful.bind_port)."""

from __future__ import annotations

import errno
import socket

import pytest

from fleetserve.api import graceful


def test_the_port_is_held_against_other_servers_from_bind_to_listen():
    """With SO_REUSEADDR on both sockets Linux let another server bind the port the engine had bound but not yet
    listened on; the one that listened first had it, and the engine served nowhere, alive (found in review)."""
    sock = graceful.bind_port("127.0.0.1", 0)
    port = sock.getsockname()[1]
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn, http.server, node bind
        with pytest.raises(OSError) as refused:
            other.bind(("127.0.0.1", port))
        assert refused.value.errno == errno.EADDRINUSE
    graceful._listen(sock, "127.0.0.1", port)
    # a restart binds over the connections its predecessor left in TIME_WAIT, as uvicorn did
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = sock.accept()
    accepted.close()  # the server closes first: its side waits in TIME_WAIT
    client.close()
    sock.close()
    again = graceful.bind_port("127.0.0.1", port)
    graceful._listen(again, "127.0.0.1", port)
    again.close()


def test_a_server_that_bound_the_port_first_without_listening_cannot_take_it_from_the_engine():
    """Both with SO_REUSEADDR, neither listening: the engine's bind passes, and from then on the port is the engine's
    (the other's listen fails); a listen the engine loses all the same is its exit 98, not serving nowhere."""
    with socket.socket() as first:
        first.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        first.bind(("127.0.0.1", 0))
        port = first.getsockname()[1]
        sock = graceful.bind_port("127.0.0.1", port)
        with pytest.raises(OSError) as refused:
            first.listen()
        assert refused.value.errno == errno.EADDRINUSE
        graceful._listen(sock, "127.0.0.1", port)
        sock.close()

    class Lost(socket.socket):
        def listen(self, *_):
            raise OSError(errno.EADDRINUSE, "Address already in use")

    with Lost() as lost, pytest.raises(SystemExit) as ended:
        graceful._listen(lost, "127.0.0.1", 1)
    assert ended.value.code == graceful.EXIT_PORT_TAKEN


@pytest.mark.parametrize("host", ["nosuch.invalid", "10.255.255.1"])
def test_an_address_the_machine_cannot_listen_on_is_a_line_not_a_traceback(host, caplog):
    with pytest.raises(SystemExit) as ended:
        graceful.bind_port(host, 0)
    assert ended.value.code == 1 and f"cannot listen on {host}:0" in caplog.text
