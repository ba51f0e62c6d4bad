"""The gunicorn worker of the retrieval server: gthread with bounded reads and JSON errors.

Why a subclass of gunicorn's own gthread worker (gunicorn 27 as pinned), and not another worker
class or a proxy in front: gthread gives a new connection to a request thread that waits up
to 5 s for its first bytes, and once a byte has arrived the thread reads the rest of the
request from a blocking socket with no timeout. 32 clients (the --threads default) that
announce a Content-Length and never finish the body held every thread until they gave up:
measured, a normal client got no answer within 20 s and the stalled ones were still held
after 120 s. The asynchronous workers
(gevent, eventlet) would add a dependency and monkey-patch the threads that torch, Faiss and
the micro-batcher rely on; a front proxy (nginx) is one more service to install and run. The
worker here keeps gthread and gives every connection's socket a deadline instead:

* a request (request line, headers and body) must arrive in full within ``read_timeout``
  seconds of its first byte being read, however the client trickles it; past that the client
  gets a JSON 408 (from the app when the body stalls, from here when the headers stall) and
  the connection is closed, freeing the thread;
* a response write that the client does not take within ``read_timeout`` is abandoned;
* a TLS handshake sent to this plain-HTTP port is answered at once with a JSON 400 that says
  to use ``http://`` (gunicorn answered it only by chance: an HTML 400 when one of its bytes
  was a line feed, else nothing, its request line never ending);
* the parser's own errors (request line too long 414, headers too many or too large 431,
  malformed request 400) are JSON ``{"error", "message", "status"}`` like the app's errors
  (gunicorn writes HTML);
* a connection that has sent nothing yet waits in the event loop, not in a request thread;
* a connection that ends is closed (with the short lingering close of RFC 9112) by its
  request thread; gunicorn does it on its single event-loop thread, where a client that never
  closes its end held the loop, and with it every other connection, for 2 s each (measured:
  16 clients answered with a 400 that kept their connections open delayed a normal request
  by 24 s; now 0.1 s).
"""

from __future__ import annotations

import json
import selectors
import socket
import ssl
import time
from datetime import datetime
from functools import partial
from typing import Any

from gunicorn import util
from gunicorn.http.errors import (
    ConfigurationProblem,
    ExpectationFailed,
    ForbiddenProxyRequest,
    InvalidHeader,
    InvalidHeaderName,
    InvalidResponseHeader,
    InvalidResponseHeaderName,
    LimitRequestHeaders,
    LimitRequestLine,
    NoMoreData,
    ParseException,
    UnsupportedTransferCoding,
)
from gunicorn.http.wsgi import Response, default_environ
from gunicorn.workers.gthread import ThreadWorker

#: Longest a closing connection lingers for the client's FIN (gunicorn's own figure is 2 s).
CLOSE_LINGER_S = 2.0
#: First bytes of a TLS record carrying a handshake (content type 22, version 3.x).
_TLS_HANDSHAKE = b"\x16\x03"


class SlowClientError(NoMoreData, TimeoutError):
    """The client did not send its request (or take its answer) within the read timeout.

    A :class:`NoMoreData` so that gthread treats it like a client that went away (a debug line,
    not a traceback), and a :class:`TimeoutError` so that the app, reading the body, can tell it
    from other failures without importing gunicorn.
    """

    def __init__(self, message: str) -> None:
        TimeoutError.__init__(self, message)

    def __str__(self) -> str:
        return str(self.args[0])


class TlsOnPlainPortError(ParseException):
    """A TLS ClientHello arrived on the plain-HTTP port."""

    def __str__(self) -> str:
        return ("this server speaks plain HTTP and the client sent a TLS handshake; use an "
                "http:// URL, not https://")


class DeadlineSocket(socket.socket):
    """A client socket whose reads of one request share one deadline.

    gthread switches a connection between non-blocking (while the event loop polls it) and
    blocking (while a thread serves it) with ``setblocking``; here "blocking" means "with a
    timeout", and while a request is being served every read waits at most for what is left of
    ``read_timeout`` since the request's first read.
    """

    __slots__ = ("_deadline", "_first_read", "_serving", "read_timeout", "sent", "timed_out")

    def __init__(self, sock: socket.socket, read_timeout: float) -> None:
        super().__init__(sock.family, sock.type, sock.proto, fileno=sock.detach())
        self.read_timeout = read_timeout
        self.timed_out = False
        self.sent = False
        self._serving = False
        self._deadline: float | None = None
        self._first_read = True

    def start_request(self) -> None:
        """Arm the deadline for the request a thread is about to read (starts at its first read)."""
        self._serving = True
        self._deadline = None
        self.timed_out = False
        self.sent = False

    def end_request(self) -> None:
        self._serving = False
        self._deadline = None

    def setblocking(self, flag: bool) -> None:
        if flag:
            super().settimeout(self.read_timeout)  # bounded even outside recv()/sendall()
        else:
            super().setblocking(False)

    def _before_read(self) -> None:
        if not self._serving:
            return
        now = time.monotonic()
        if self._deadline is None:
            self._deadline = now + self.read_timeout
        remaining = self._deadline - now
        if remaining <= 0:
            raise self._timeout()
        super().settimeout(remaining)

    def _timeout(self) -> SlowClientError:
        self.timed_out = True
        return SlowClientError(f"request not received in full within {self.read_timeout:g} s "
                               f"(--read-timeout)")

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        self._before_read()
        try:
            data = super().recv(bufsize, flags)
        except TimeoutError:
            if not self._serving:
                raise
            raise self._timeout() from None
        if self._first_read and self._serving and data:
            self._first_read = False
            if data.startswith(_TLS_HANDSHAKE):
                raise TlsOnPlainPortError()
        return data

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        self._before_read()
        try:
            return super().recv_into(buffer, nbytes, flags)
        except TimeoutError:
            if not self._serving:
                raise
            raise self._timeout() from None

    def sendall(self, data: Any, flags: int = 0) -> None:
        if self._serving:
            super().settimeout(self.read_timeout)
        self.sent = True
        try:
            super().sendall(data, flags)
        except TimeoutError:
            if not self._serving:
                raise
            raise SlowClientError(f"client did not take its answer within "
                                  f"{self.read_timeout:g} s (--read-timeout)") from None

    def send(self, data: Any, flags: int = 0) -> int:
        if self._serving:
            super().settimeout(self.read_timeout)
        self.sent = True
        return super().send(data, flags)


# ------------------------------------------------------------------------------ errors


def json_error_bytes(status: int, reason: str, message: str, kind: str) -> bytes:
    """A complete ``Connection: close`` HTTP response with the app's JSON error body."""
    body = json.dumps({"error": kind, "message": message, "status": status},
                      ensure_ascii=False).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode("latin-1") + body


def describe_error(exc: BaseException, cfg: Any) -> tuple[int, str, str] | None:
    """``(status, reason, message)`` for an error in the client's request, None for our own.

    The statuses are gunicorn's (``Worker.handle_error``); the messages add the limit to stay
    under where there is one.
    """
    if isinstance(exc, InvalidResponseHeader | InvalidResponseHeaderName):
        return None  # a header the application tried to send: the server's fault
    if isinstance(exc, TlsOnPlainPortError):
        return 400, "Bad Request", str(exc)
    if isinstance(exc, LimitRequestLine):
        return 414, "URI Too Long", (f"request line too long ({exc}); at most "
                                     f"{cfg.limit_request_line} bytes")
    if isinstance(exc, LimitRequestHeaders):
        return 431, "Request Header Fields Too Large", (
            f"request headers too many or too large ({exc}); at most "
            f"{cfg.limit_request_fields} fields of {cfg.limit_request_field_size} bytes each")
    if isinstance(exc, UnsupportedTransferCoding):
        return 501, "Not Implemented", f"unsupported transfer coding: {exc}"
    if isinstance(exc, ExpectationFailed):
        return 417, "Expectation Failed", str(exc)
    if isinstance(exc, ForbiddenProxyRequest):
        return 403, "Forbidden", "request forbidden"
    if isinstance(exc, ConfigurationProblem):
        return 500, "Internal Server Error", str(exc)
    if isinstance(exc, ParseException | ssl.SSLError):
        return 400, "Bad Request", f"malformed HTTP request: {exc}"
    return None


class RetrievalWorker(ThreadWorker):
    """gthread with a per-request read deadline and JSON error responses (see the module)."""

    #: Seconds a request may take to arrive; set per server by :func:`make_worker_class`.
    read_timeout: float = 10.0

    def enqueue_req(self, conn: Any) -> None:
        # Runs on the event-loop thread for every connection handed to a request thread.
        if type(conn.sock) is socket.socket:  # a new connection: swap in a deadline socket
            conn.sock = DeadlineSocket(conn.sock, self.read_timeout)
            conn.sock.setblocking(False)
            if not conn.initialized and not conn.data_ready:
                self._wait_for_first_bytes(conn)
                return
        super().enqueue_req(conn)

    def _wait_for_first_bytes(self, conn: Any) -> None:
        """Let the event loop, not a request thread, wait for a new connection's first bytes.

        gthread hands every new connection to a thread that waits up to 5 s for data, so
        clients that connect and send nothing held every thread for 5 s at a time. Here the
        connection waits in the poller like one that gthread has deferred, for the keep-alive
        time (gunicorn closes a deferred connection after it, and its queue of waiting
        connections is kept in that order), and a thread takes it only once bytes arrive.
        """
        conn.timeout = time.monotonic() + self.cfg.keepalive
        self.pending_conns.append(conn)
        self.poller.register(conn.sock, selectors.EVENT_READ,
                             partial(self.on_pending_socket_readable, conn))

    def handle(self, conn: Any) -> Any:
        sock = conn.sock
        if not isinstance(sock, DeadlineSocket):
            return super().handle(conn)
        sock.start_request()
        try:
            result = super().handle(conn)
        finally:
            sock.end_request()
        if result is not False:  # kept alive, or deferred to the poller for its first bytes
            return result
        if sock.timed_out:
            self.log.info("closed a connection from %s: request not received in full within "
                          "%g s (--read-timeout)", _client_ip(conn.client), self.read_timeout)
            if not sock.sent:
                self._send_quietly(sock, json_error_bytes(
                    408, "Request Timeout",
                    f"request not received in full within {self.read_timeout:g} s",
                    "request_timeout"))
        if sock.fileno() != -1:  # close here, in this request thread (see the module)
            # A stalled client has nothing unread to linger for: its thread is freed at once.
            linger = 0.0 if sock.timed_out else min(CLOSE_LINGER_S, self.read_timeout)
            util.close_graceful(sock, timeout=linger)
        return False

    def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
        started = datetime.now()
        addr = addr or ("", -1)
        described = describe_error(exc, self.cfg)
        if described is None:
            where = f" {req.method} {req.uri}" if hasattr(req, "method") else ""
            self.log.exception("Error handling request%s", where)
            status, reason, message = 500, "Internal Server Error", "internal server error"
        else:
            status, reason, message = described
            self.log.warning("Invalid request from ip=%s: %s", addr[0], exc)
        kind = reason.lower().replace(" ", "_")
        payload = json_error_bytes(status, reason, message, kind)
        self._send_quietly(client, payload)
        if req is None and isinstance(exc, InvalidHeader | InvalidHeaderName):
            req = getattr(exc, "req", None)  # the request whose header was bad, when known
        if req is not None:  # an access-log line, as gunicorn writes for its own errors
            environ = default_environ(req, client, self.cfg)
            environ["REMOTE_ADDR"], environ["REMOTE_PORT"] = addr[0], str(addr[1])
            resp = Response(req, client, self.cfg)
            resp.status = f"{status} {reason}"
            resp.response_length = len(payload)
            self.log.access(resp, req, environ, datetime.now() - started)

    def _send_quietly(self, sock: Any, payload: bytes) -> None:
        try:
            util.write(sock, payload)
        except Exception:  # the client may be gone or not reading; nothing more to tell it
            self.log.debug("Failed to send error message.")


def _client_ip(client: Any) -> str:
    return str(client[0]) if isinstance(client, tuple | list) and client else str(client)


def make_worker_class(read_timeout: float) -> type[RetrievalWorker]:
    """A :class:`RetrievalWorker` subclass bound to this server's read timeout.

    gunicorn instantiates the worker class itself (after the fork) and passes only its own
    settings, so a server option travels as a class attribute.
    """
    return type("RetrievalWorker", (RetrievalWorker,), {"read_timeout": float(read_timeout)})
