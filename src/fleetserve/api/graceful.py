"""An engine's stop that ends its answers rather than cutting them.

uvicorn's graceful shutdown waits `timeout_graceful_shutdown` (the engine's `--drain-timeout`) for requests under
way, then cancels them: a stream still running was cut mid-answer (an unterminated chunked body: the client
cannot tell it from a network fault). `serve` runs uvicorn with one change: shortly before that deadline it calls
`before_cut` on the server's loop, which ends what still runs with an error the client can read (an error event
and `[DONE]` in a stream, a 503 otherwise); the cancel that follows then finds nothing left to cut.

`bind_port` takes an engine's port before its model loads, and exits `EXIT_PORT_TAKEN` when another process holds
it: the supervisor had read the cause from the engine's log (gone with `logMaxBytes` tiny, and the replica spent
a failed start more before it moved), and during a load of minutes any process could bind the port it had chosen.

`serve` never lets uvicorn configure logging (the process did, with `observe.logs.configure_logging`; uvicorn's
loggers reach that handler): uvicorn's `dictConfig` flushes every handler the process has registered, and a
handler under construction on another thread (`StreamHandler` registers itself before it sets its stream) made
an engine die at start with `'StreamHandler' object has no attribute 'stream'`.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

import uvicorn

from fleetserve.api.limits import REQUEST_READ_S

CUT_MARGIN_S = 0.1  # before uvicorn's own deadline (which starts ~0.2 s after the signal): the last writes go out


ORPHAN_SIGNAL = signal.SIGUSR1  # what a fleet's engine gets when its supervisor dies (PR_SET_PDEATHSIG)
EXIT_WATCHDOG_S = 15.0  # past an orphan's drain, the process exits whatever still runs: nobody else will stop it


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, before_cut: Callable[[], None], orphan_grace: float | None = None):
        super().__init__(config)
        self._before_cut = before_cut
        self._orphan_grace = orphan_grace
        self._loop: asyncio.AbstractEventLoop | None = None
        self._armed = False

    async def startup(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)
        if self._orphan_grace is not None and threading.current_thread() is threading.main_thread():
            signal.signal(ORPHAN_SIGNAL, self._orphaned)

    def _orphaned(self, sig, frame) -> None:
        """The supervisor died (a SIGKILL, the OOM killer): stop as on SIGTERM, but let the answers under way run
        for `orphan_grace`, as long as the router (told by SIGTERM) lets them reach their clients; the streams had
        been cut, the engines SIGKILLed with their supervisor. Then exit, whatever still runs."""
        self.config.timeout_graceful_shutdown = self._orphan_grace
        watchdog = threading.Timer(self._orphan_grace + EXIT_WATCHDOG_S, os._exit, (1,))
        watchdog.daemon = True
        watchdog.start()
        self.handle_exit(signal.SIGTERM, frame)

    def handle_exit(self, sig, frame) -> None:  # a signal handler: it only schedules
        super().handle_exit(sig, frame)
        grace = self.config.timeout_graceful_shutdown
        if self._loop is not None and not self._armed and grace is not None:  # None: uvicorn waits for ever
            self._armed = True
            self._loop.call_soon_threadsafe(self._loop.call_later, max(0.0, grace - CUT_MARGIN_S), self._before_cut)


EXIT_PORT_TAKEN = 98  # errno's EADDRINUSE: the supervisor moves the replica to another port (fleet/supervisor.py)


def bind_port(host: str, port: int) -> socket.socket:
    """The engine's listening address, bound now (it listens once the server starts); exit `EXIT_PORT_TAKEN` with
    the cause in the log when another process has it."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:  # uvicorn had said it in a line; a traceback is no answer
        _cannot_listen(host, port, exc.strerror or str(exc))
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a TIME_WAIT port is free
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno != errno.EADDRINUSE:
            _cannot_listen(host, port, exc.strerror or str(exc))  # an address not this machine's
        _port_taken(host, port)
    # held alone until it listens: while both have SO_REUSEADDR, Linux lets another socket bind the same port (a
    # server of any kind sets it), and the one that listens first has it
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
    return sock


def _cannot_listen(host: str, port: int, why: str) -> NoReturn:
    logging.getLogger(__name__).error("cannot listen on %s:%d: %s", host, port, why)
    sys.exit(1)


def _port_taken(host: str, port: int) -> NoReturn:
    logging.getLogger(__name__).error("cannot listen on %s:%d: address already in use (another process has the "
                                      "port)", host, port)
    sys.exit(EXIT_PORT_TAKEN)


def _listen(sock: socket.socket, host: str, port: int) -> None:
    """Listen on the socket `bind_port` held (exit `EXIT_PORT_TAKEN` if another took the port after all): uvloop
    does not say a failed listen, and an engine had served nowhere, alive, its probes failing until its timeout."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.listen(2048)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        _port_taken(host, port)


def serve(app, before_cut: Callable[[], None], orphan_grace: float | None = None,
          sock: socket.socket | None = None, **config) -> None:
    """`uvicorn.run(app, **config)` for one process, with `before_cut` called a margin before the graceful
    shutdown's end (see the module's docstring); with `orphan_grace`, ORPHAN_SIGNAL stops it with that grace;
    `sock`: the address `bind_port` took (else uvicorn binds `host` and `port`). Exits 1 when the server did not
    start, as uvicorn.run does. `config` carries no `log_config`: see the module's docstring."""
    if "log_config" in config:
        raise TypeError("serve() configures no logging: call observe.logs.configure_logging first")
    if sock is not None:
        _listen(sock, config.get("host", ""), config.get("port", 0))
    from fleetserve.api.read_timeout import read_timeout_protocol

    config.setdefault("http", read_timeout_protocol(REQUEST_READ_S))  # uvicorn's own waits for ever on a request
    server = _Server(uvicorn.Config(app, log_config=None, **config), before_cut, orphan_grace)
    try:
        server.run(sockets=[sock] if sock is not None else None)
    except KeyboardInterrupt:
        pass
    if not server.started:
        sys.exit(1)
