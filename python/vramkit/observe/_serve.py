"""The HTTP server behind `vramkit export`: GET and HEAD on one thread, with selectors.

Why one thread and a selector, not http.server's thread per connection (issue 35): there,
every connection held a thread until its client spoke, with no timeout, so a few hundred
half-open connections held as many threads for good; and once they had taken every
descriptor, accept() failed at once on each wake of a listener that stayed ready, so the
loop spun at full CPU and no scrape was accepted again. Here:

  - an idle connection costs a descriptor and a small object, no thread: the loop sleeps
    in the selector (epoll on Linux) until a socket is ready or the next deadline, so a
    thousand idle connections cost no CPU and a scrape among them is answered at once;
  - each connection has a deadline, not a per-read timeout: its whole request must arrive
    within `timeout` of its accept, and its reply be taken within `timeout` of being
    ready, so a client that drips a byte at a time gains nothing;
  - at most `max_connections` are held; one more is accepted, answered a short 503 with
    Retry-After and closed there and then: a few system calls, nothing kept;
  - the request line and headers together are bounded (MAX_REQUEST_BYTES, else 431);
  - when accept() runs out of descriptors, a reserve descriptor is let go to accept the
    connection, answer it 503 and close it; if even that fails, the listener is set aside
    for BACKOFF_S, so the loop waits instead of spinning on a ready listener;
  - a client that resets or closes early just ends its connection: nothing is printed.

Replies are made on the loop thread, one at a time: a scrape takes milliseconds, and doing
them in turn keeps the records and NVML read by one thread. Sockets that become ready
meanwhile are served right after, not lost. Every reply closes its connection (as
http.server's HTTP/1.0 did); Prometheus opens a new one per scrape then.
"""

from __future__ import annotations

import email.utils
import errno
import heapq
import http
import os
import selectors
import socket
import sys
import time
import urllib.parse

MAX_REQUEST_BYTES = 16 * 1024  # request line and headers; Prometheus sends a few hundred
RECV_BYTES = 64 * 1024
RETRY_AFTER_S = 1
BACKOFF_S = 0.5
ACCEPT_BATCH = 64  # accepts per wake, so that a flood does not starve ready connections
# accept() failures that say the process or the machine is out of descriptors or memory:
# retrying at once would fail again at once.
_EXHAUSTED = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def reply_bytes(status: int, body: bytes = b"", content_type: str = "text/plain; "
                "charset=utf-8", head: bool = False, extra: tuple = ()) -> bytes:
    """A whole HTTP/1.1 response that closes its connection."""
    lines = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}",
             "Server: vramkit-export", f"Date: {email.utils.formatdate(usegmt=True)}",
             f"Content-Type: {content_type}", f"Content-Length: {len(body)}",
             "Connection: close", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head else body)


FULL_REPLY = reply_bytes(503, b"vramkit export: too many connections; try again shortly\n",
                         extra=(f"Retry-After: {RETRY_AFTER_S}",))


class _Connection:
    __slots__ = ("sock", "inbox", "outbox", "deadline", "open")

    def __init__(self, sock, deadline):
        self.sock = sock
        self.inbox = b""
        self.outbox = None  # a memoryview of the reply once it is made
        self.deadline = deadline
        self.open = True


def _end(sock) -> None:
    """Close a client socket, first taking what it sent and we did not read, so that the
    close is a FIN after our reply rather than a reset that could overtake it."""
    try:
        sock.recv(RECV_BYTES)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class Server:
    """Listens on (address, port); respond(method, target) -> reply bytes for each request.

    respond gets the request's method ("GET" or "HEAD") and path without the query, and
    returns the whole reply (reply_bytes); an exception in it is a 500 and a line on stderr.
    """

    def __init__(self, address: str, port: int, respond, *, timeout: float,
                 max_connections: int):
        self.respond = respond
        self.timeout = timeout
        self.max_connections = max_connections
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            # A restart need not wait for TIME_WAIT; a live listener still makes bind fail,
            # which is the check that matters.
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind((address, port))
            # A deep queue: a burst of connections waits for the next wake, not for SYN
            # retries.
            self.socket.listen(1024)
            self.socket.setblocking(False)
        except BaseException:
            self.socket.close()
            raise
        self.server_address = self.socket.getsockname()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.socket, selectors.EVENT_READ, None)
        self._deadlines: list = []  # heap of (deadline, order, connection), stale ones skipped
        self._order = 0
        self.connections = 0
        self._paused_until = None
        self._said: set = set()
        self._reserve = self._take_reserve()

    # ---- the loop -----------------------------------------------------------------------

    def serve_forever(self) -> None:
        while True:
            for key, mask in self._selector.select(self._wait()):
                if key.data is None:
                    self._accept()
                else:
                    self._service(key.data)
            self._expire()

    def server_close(self) -> None:
        for key in list(self._selector.get_map().values()):
            if key.data is not None:
                self._close(key.data)
        self._selector.close()
        self.socket.close()
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None

    def _wait(self) -> float | None:
        """Seconds until the next deadline or the end of a back-off; None: none pending."""
        now = time.monotonic()
        if self._paused_until is not None and now >= self._paused_until:
            self._paused_until = None
            self._selector.register(self.socket, selectors.EVENT_READ, None)
        while self._deadlines and not self._current(self._deadlines[0]):
            heapq.heappop(self._deadlines)
        wake = [t for t in (self._paused_until,
                            self._deadlines[0][0] if self._deadlines else None) if t is not None]
        return max(0.0, min(wake) - now) if wake else None

    def _expire(self) -> None:
        now = time.monotonic()
        while self._deadlines and self._deadlines[0][0] <= now:
            entry = heapq.heappop(self._deadlines)
            if self._current(entry):
                self._close(entry[2])  # too slow to send its request or take its reply

    @staticmethod
    def _current(entry) -> bool:
        return entry[2].open and entry[2].deadline == entry[0]

    def _set_deadline(self, conn) -> None:
        conn.deadline = time.monotonic() + self.timeout
        self._order += 1
        heapq.heappush(self._deadlines, (conn.deadline, self._order, conn))

    def _close(self, conn) -> None:
        if conn.open:
            conn.open = False
            self.connections -= 1
            self._selector.unregister(conn.sock)
            _end(conn.sock)

    # ---- accepting ----------------------------------------------------------------------

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _ = self.socket.accept()
            except BlockingIOError:
                return
            except OSError as error:
                if error.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
                    continue  # gone before it was taken, or refused by a firewall rule
                if error.errno in _EXHAUSTED:
                    self._out_of_descriptors(error)
                else:
                    self._pause(f"accepting failed: {error.strerror or error}")
                return
            if self.connections >= self.max_connections:
                self._refuse(sock)
                continue
            sock.setblocking(False)
            conn = _Connection(sock, 0.0)
            self.connections += 1
            self._selector.register(sock, selectors.EVENT_READ, conn)
            self._set_deadline(conn)

    @staticmethod
    def _refuse(sock) -> None:
        sock.setblocking(False)
        try:
            sock.send(FULL_REPLY)  # fits any socket buffer: one call, or nothing
        except OSError:
            pass
        _end(sock)

    def _take_reserve(self):
        try:
            return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None

    def _out_of_descriptors(self, error: OSError) -> None:
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None
            try:
                sock, _ = self.socket.accept()
            except OSError:
                sock = None
            if sock is not None:
                self._refuse(sock)
            self._reserve = self._take_reserve()
            if sock is not None:
                self._say(f"out of descriptors ({error.strerror}): connections past those "
                          f"held are answered 503 (ulimit -n sets how many can be held)")
                return
        self._pause(f"out of descriptors ({error.strerror}); new connections wait")

    def _pause(self, why: str) -> None:
        """Stop watching the listener for BACKOFF_S: its connections wait in the queue."""
        self._say(why)
        if self._paused_until is None:
            self._selector.unregister(self.socket)
        self._paused_until = time.monotonic() + BACKOFF_S

    def _say(self, line: str) -> None:
        if line not in self._said:  # once each, not once per connection
            self._said.add(line)
            print(f"vramkit export: {line}", file=sys.stderr, flush=True)

    # ---- one connection -----------------------------------------------------------------

    def _service(self, conn) -> None:
        try:
            if conn.outbox is None:
                self._read(conn)
            else:
                self._write(conn)
        except OSError:
            self._close(conn)  # reset, broken pipe: the client went away

    def _read(self, conn) -> None:
        data = conn.sock.recv(RECV_BYTES)
        if not data:
            self._close(conn)
            return
        conn.inbox += data
        end = _end_of_head(conn.inbox)
        if end < 0 or end > MAX_REQUEST_BYTES:
            if len(conn.inbox) > MAX_REQUEST_BYTES:
                self._start_reply(conn, reply_bytes(
                    431, f"vramkit export: request line and headers over "
                         f"{MAX_REQUEST_BYTES} bytes\n".encode()))
            return
        self._start_reply(conn, self._answer(conn.inbox[:end]))

    def _answer(self, head: bytes) -> bytes:
        words = head.split(b"\n", 1)[0].decode("latin-1").split()
        if len(words) != 3 or not words[2].startswith("HTTP/"):
            return reply_bytes(400, b"vramkit export: not an HTTP request\n")
        method, target = words[0], words[1]
        if method not in ("GET", "HEAD"):
            return reply_bytes(405, b"vramkit export: only GET and HEAD\n",
                               extra=("Allow: GET, HEAD",))
        path = urllib.parse.urlsplit(target).path or "/"
        try:
            return self.respond(method, path)
        except Exception as error:  # a reply fails; the server stays up
            print(f"vramkit export: answering {path} failed: {type(error).__name__}: "
                  f"{error}", file=sys.stderr, flush=True)
            return reply_bytes(500, f"vramkit export: {type(error).__name__}\n".encode(),
                               head=method == "HEAD")

    def _start_reply(self, conn, reply: bytes) -> None:
        conn.outbox = memoryview(reply)
        conn.inbox = b""
        self._set_deadline(conn)
        self._selector.modify(conn.sock, selectors.EVENT_WRITE, conn)
        self._write(conn)  # most replies fit the socket's buffer: sent now

    def _write(self, conn) -> None:
        try:
            sent = conn.sock.send(conn.outbox)
        except BlockingIOError:
            return
        conn.outbox = conn.outbox[sent:]
        if not conn.outbox:
            self._close(conn)


def _end_of_head(data: bytes) -> int:
    """Where the request's head ends (its blank line), or -1 while it has not arrived.
    Bare LF line ends are taken too, as http.server takes them."""
    ends = [i for i in (data.find(b"\r\n\r\n"), data.find(b"\n\n")) if i >= 0]
    return min(ends) if ends else -1
