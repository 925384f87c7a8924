"""The live view's HTTP server: MJPEG game stream, tick state (JSON and server-sent events), dashboard.

Runs on daemon threads inside the env runner process. Every client thread
paces itself (at most `max_fps` sends per second) and always sends the newest
tick, so a slow client or a slow network drops frames instead of holding the
loop back; the loop never waits for, or even knows about, a client.

Routes: `/` dashboard, `/dashboard.js`, `/doom.mjpeg` (multipart/x-mixed-replace
JPEG stream, the wire protocol's port-12349 view), `/frame.jpg` (the newest
frame), `/state.json` (the newest tick), `/events` (server-sent events, one
state per new tick), `/layout.json` (electrode map and ranges), `/learning.json?since=N` (the learning
curve's finished episodes numbered above N).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from urllib.parse import parse_qs, urlsplit

from spikeloop.experiments.live_view.frames import JpegCache
from spikeloop.experiments.live_view.publisher import Publisher, Tick
from spikeloop.experiments.live_view.settings import ViewSettings
from spikeloop.experiments.live_view.state import layout, learning, tick_state

log = logging.getLogger(__name__)

BOUNDARY = "spikeloopframe"
STATIC = {
    "/": ("dashboard.html", "text/html; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
}
POLL_S = 0.005
"""How often a client thread looks for a newer tick once its pacing interval is over."""
DISCONNECTED = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError)


class LiveViewServer(ThreadingHTTPServer):
    """One env runner's live view; `start()` serves on a daemon thread until `close()`."""

    daemon_threads = True  # client threads never keep an env runner process alive
    allow_reuse_address = True

    def __init__(self, publisher: Publisher, settings: ViewSettings, port: int) -> None:
        self.publisher = publisher
        self.settings = settings
        self.frames = JpegCache(settings.jpeg_quality)
        self.clients = 0
        self.closing = threading.Event()
        self._clients_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        super().__init__((settings.host, port), _Handler)

    @property
    def port(self) -> int:
        """The port actually bound."""
        return self.server_address[1]

    def start(self) -> LiveViewServer:
        """Serve on a daemon thread."""
        self._thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.2}, name=f"live-view-{self.port}", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and end every client's stream."""
        self.closing.set()
        self.shutdown()
        self.server_close()

    def client_delta(self, delta: int) -> None:
        """Count streaming clients (shown on the dashboard)."""
        with self._clients_lock:
            self.clients += delta

    def wait_newer(self, seq: int, not_before: float) -> bool:
        """Sleep until `not_before` and until a tick newer than `seq` exists; False when closing."""
        delay = not_before - time.monotonic()
        if delay > 0 and self.closing.wait(delay):
            return False
        while not self.closing.is_set():
            tick = self.publisher.latest
            if tick is not None and tick.seq != seq:
                return True
            self.closing.wait(POLL_S)  # polling, so that publishing never has to notify anyone
        return False


def _since(path: str) -> int | None:
    """The `since` episode number of a `/learning.json?since=N` request (0 when absent, None when not a number)."""
    value = (parse_qs(urlsplit(path).query).get("since") or ["0"])[0]
    return int(value) if value.isascii() and value.isdigit() else None


class _Handler(BaseHTTPRequestHandler):
    server: LiveViewServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base class's name)
        log.debug("live view %s: " + format, self.client_address[0], *args)

    def do_GET(self) -> None:
        """Route a request."""
        path = self.path.split("?", 1)[0]
        try:
            if path in STATIC:
                name, kind = STATIC[path]
                try:
                    body = resources.files(__package__).joinpath(name).read_bytes()
                except FileNotFoundError:  # an installation without the package data
                    self._send(
                        HTTPStatus.INTERNAL_SERVER_ERROR,
                        "text/plain",
                        f"{name} is missing from this spikeloop installation; /doom.mjpeg still works\n".encode(),
                    )
                    return
                self._send(HTTPStatus.OK, kind, body)
            elif path == "/doom.mjpeg":
                self._stream(self._mjpeg_part, "multipart/x-mixed-replace; boundary=" + BOUNDARY)
            elif path == "/events":
                self._stream(self._event, "text/event-stream")
            elif path == "/frame.jpg":
                jpeg = self.server.frames.jpeg(self.server.publisher.latest)
                if jpeg is None:
                    self._send(HTTPStatus.SERVICE_UNAVAILABLE, "text/plain", b"no frame yet\n")
                else:
                    self._send(HTTPStatus.OK, "image/jpeg", jpeg)
            elif path == "/state.json":
                self._send_json(self._state())
            elif path == "/layout.json":
                self._send_json(layout(self.server.publisher))
            elif path == "/learning.json":
                since = _since(self.path)
                if since is None:
                    self._send(
                        HTTPStatus.BAD_REQUEST,
                        "text/plain",
                        b"since must be an episode number (a whole number >= 0), e.g. /learning.json?since=0\n",
                    )
                else:
                    self._send_json(learning(self.server.publisher, since))
            else:
                self._send(HTTPStatus.NOT_FOUND, "text/plain", b"not found; try / or /doom.mjpeg\n")
        except DISCONNECTED:
            pass  # the client went away: nothing to clean up

    def _state(self, tick: Tick | None = None) -> dict:
        return tick_state(self.server.publisher, self.server.frames.encoded, self.server.clients, tick)

    def _send(self, status: HTTPStatus, kind: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _send_json(self, value: dict) -> None:
        self._send(HTTPStatus.OK, "application/json", json.dumps(value).encode())

    def _mjpeg_part(self, tick: Tick) -> bytes | None:
        jpeg = self.server.frames.jpeg(tick)
        if jpeg is None:
            return None
        head = f"--{BOUNDARY}\r\nContent-Type: image/jpeg\r\nContent-Length: {len(jpeg)}\r\n\r\n".encode()
        return head + jpeg + b"\r\n"

    def _event(self, tick: Tick) -> bytes:
        return b"data: " + json.dumps(self._state(tick)).encode() + b"\n\n"

    def _stream(self, next_part, kind: str) -> None:
        """Send `next_part()` for each newer tick, paced by max_fps, until the client leaves."""
        server = self.server
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", kind)
        self.send_header("Cache-Control", "no-store")
        self.send_header("Connection", "close")  # a stream ends with the connection, no chunking needed
        self.end_headers()
        self.close_connection = True
        period = 1.0 / server.settings.max_fps
        seq, sent_at = -1, 0.0
        server.client_delta(+1)
        try:
            while server.wait_newer(seq, sent_at + period):
                tick = server.publisher.latest
                part = next_part(tick)
                if part is None:  # a tick without a frame (a vector env in subprocesses): wait for the next
                    seq = tick.seq
                    continue
                sent_at = time.monotonic()
                self.wfile.write(part)
                self.wfile.flush()
                seq = tick.seq
        finally:
            server.client_delta(-1)
