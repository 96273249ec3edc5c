"""A TCP proxy that can be switched off and on, to take an endpoint away for a while (tests and benches).

moto's server loses its buckets when it restarts, so an S3 outage is simulated in front of it instead: point
``AWS_ENDPOINT_URL`` at ``TcpProxy.url``; ``down()`` closes every open connection and refuses new ones (as a
restarting endpoint does), ``up()`` listens on the same port again.
"""

from __future__ import annotations

import socket
import threading

ACCEPT_POLL_S = 0.1


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target_host:target_port`` while up."""

    def __init__(self, target_host: str, target_port: int, port: int = 0):
        self.target = (target_host, target_port)
        self.port = port
        self.listener: socket.socket | None = None
        self.connections: set[socket.socket] = set()
        self.lock = threading.Lock()
        self.up()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def up(self) -> None:
        """Listen (again) on the proxy's port."""
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        listener.settimeout(ACCEPT_POLL_S)
        self.port = listener.getsockname()[1]
        self.listener = listener
        threading.Thread(target=self.accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        """Stop listening and cut every open connection: clients see refused and reset connections."""
        listener, self.listener = self.listener, None
        if listener is not None:
            listener.close()
        with self.lock:
            connections, self.connections = self.connections, set()
        for sock in connections:
            close_socket(sock)

    def accept(self, listener: socket.socket) -> None:
        while self.listener is listener:
            try:
                client, _ = listener.accept()
                client.settimeout(None)
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                close_socket(client)
                continue
            with self.lock:
                self.connections |= {client, upstream}
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self.pipe, args=(source, sink), daemon=True).start()

    def pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                close_socket(sock)
                with self.lock:
                    self.connections.discard(sock)


def close_socket(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
