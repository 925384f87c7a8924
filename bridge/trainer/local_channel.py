"""The exchange fast path: a Unix socket from a caller on the bridge's node to the bridge actor.

An exchange is the one call made every game tick, and the tick's budget is
tight: at the reference 50 + 50 ms windows the device allows 10 ticks/s, and
everything the software adds comes out of that. A Ray actor call goes through
Ray's scheduling and serialisation, worst right after the caller has blocked for
the device window, and a Ray compiled graph keeps a core busy polling. A
connected Unix socket is one message each way and sleeps while it waits
(measured: docs/benchmarks.md, bridge and loop).

Env runners are placed on their device's node (docs/architecture.md), so the socket
is always reachable for them; a caller on another node falls back to actor
calls (`spikeloop.bridge.trainer.client.BridgeClient` decides). The actor still owns the device
sockets, the correlation and the safety envelope: the channel only carries the
call, in the same process that serves Ray's method calls (`BridgeCore` is
locked, so both can arrive at once).

The socket lives in a fresh directory only its user can enter (mode 0700),
named after the actor's process id. A bridge killed outright (SIGKILL, a lost
node) cannot remove it; the next server on the machine removes every such
directory of this user whose process is gone or whose socket no longer answers.
Stimulation and reply travel as packed numbers (`struct`): after the ~100 ms
device window every process starts with cold caches, and unpickling objects
then shows in the tick (measured: docs/benchmarks.md, loop). Feedback commands, when there
are any, and errors are pickled: the same trust as Ray's own object transfer.
A sequenced-packet socket keeps message boundaries and reports the peer's
death at once (end of file), which is how the client learns the actor died.
"""

from __future__ import annotations

import os
import pickle
import shutil
import socket
import stat
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from spikeloop.bridge.trainer.core import SpikeReply
from spikeloop.bridge.wire.protocol import FeedbackCommand

MAX_MESSAGE_BYTES = 1 << 16
"""Ample for one stimulation with its feedback commands, or one reply."""
DIR_PREFIX = "spikeloop-bridge-"
SOCKET_NAME = "exchange.sock"
SETUP_GRACE_S = 60.0
"""A directory younger than this may belong to a server that has not bound its socket yet."""

# Message kinds (first byte) and their packed headers.
_STIM, _REPLY, _ERROR = b"S", b"R", b"E"
_CALL, _RESULT = b"C", b"V"  # any other bridge method, and its result: pickled
_FEEDBACK = b"F"  # feedback commands sent ahead of the next request, unanswered: pickled
_STIM_HEADER = struct.Struct("<HH")  # number of frequencies, number of amplitudes; then that many doubles
_REPLY_HEADER = struct.Struct("<?dQqIQH")  # ok, latency_s, stim ts, reply ts (-1: none), clamped, unsolicited, n counts
_NO_TIMESTAMP = -1
_STATUS: dict[bool, Literal["ok", "timeout"]] = {True: "ok", False: "timeout"}


def encode_request(
    frequencies_hz: Sequence[float], amplitudes_ua: Sequence[float], feedback: Sequence[FeedbackCommand]
) -> bytes:
    """One exchange request: packed stimulation, then the pickled feedback commands if any."""
    values = np.concatenate([np.asarray(frequencies_hz, dtype="<f8"), np.asarray(amplitudes_ua, dtype="<f8")])
    message = _STIM + _STIM_HEADER.pack(len(frequencies_hz), len(amplitudes_ua)) + values.tobytes()
    return message + pickle.dumps(tuple(feedback), protocol=pickle.HIGHEST_PROTOCOL) if feedback else message


def decode_request(message: bytes) -> tuple[tuple[float, ...], tuple[float, ...], tuple[FeedbackCommand, ...]]:
    """(frequencies, amplitudes, feedback) of a request made by `encode_request`."""
    if message[:1] != _STIM:
        raise ValueError(f"not an exchange request (kind {message[:1]!r})")
    n_freq, n_amp = _STIM_HEADER.unpack_from(message, 1)
    start = 1 + _STIM_HEADER.size
    end = start + 8 * (n_freq + n_amp)
    values = struct.unpack_from(f"<{n_freq + n_amp}d", message, start)
    feedback = pickle.loads(message[end:]) if len(message) > end else ()
    return values[:n_freq], values[n_freq:], feedback


def encode_reply(reply: SpikeReply) -> bytes:
    """A SpikeReply as packed numbers."""
    counts = np.ascontiguousarray(reply.counts, dtype=np.float32)
    stamp = _NO_TIMESTAMP if reply.reply_timestamp_us is None else reply.reply_timestamp_us
    header = _REPLY_HEADER.pack(
        reply.ok, reply.latency_s, reply.stim_timestamp_us, stamp, reply.clamped, reply.unsolicited, counts.size
    )
    return _REPLY + header + counts.tobytes()


def decode_reply(message: bytes) -> SpikeReply:
    """The SpikeReply packed by `encode_reply`."""
    ok, latency_s, stim_us, reply_us, clamped, unsolicited, n = _REPLY_HEADER.unpack_from(message, 1)
    counts = np.frombuffer(message, dtype=np.float32, count=n, offset=1 + _REPLY_HEADER.size).copy()
    reply_stamp = None if reply_us == _NO_TIMESTAMP else reply_us
    return SpikeReply(counts, _STATUS[ok], latency_s, stim_us, reply_stamp, clamped, unsolicited)


class ChannelLost(ConnectionError):
    """The bridge end of the channel went away (the actor died or closed it)."""


class LocalChannelServer:
    """Serves exchanges and a few named methods to connected callers, one thread each.

    `exchange(frequencies, amplitudes, feedback) -> SpikeReply` is the tick; `methods` are the
    other calls a caller makes every episode (feedback, events, statistics), which would each cost
    a Ray actor call otherwise (measured: docs/benchmarks.md, bridge and loop).
    """

    def __init__(self, exchange: Callable[..., SpikeReply], methods: dict[str, Callable[..., Any]]) -> None:
        self._exchange = exchange
        self._methods = methods
        remove_dead_channel_dirs()
        self._dir = tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-")  # mode 0700: this user only
        self.path = os.path.join(self._dir, SOCKET_NAME)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._listener.bind(self.path)
        self._listener.listen()
        self._closed = False
        self._connections: set[socket.socket] = set()
        threading.Thread(target=self._accept_loop, name="bridge-channel-accept", daemon=True).start()

    def close(self) -> None:
        """Stop accepting and remove the socket (connected callers see end of file on their next call)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # never connected: nothing to shut down
        self._listener.close()
        for conn in list(self._connections):
            try:
                conn.shutdown(socket.SHUT_RDWR)  # the caller's next receive sees end of file
            except OSError:
                pass  # already gone
        shutil.rmtree(self._dir, ignore_errors=True)

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), name="bridge-channel", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        self._connections.add(conn)
        try:
            with conn:
                self._serve_requests(conn)
        finally:
            self._connections.discard(conn)

    def _serve_requests(self, conn: socket.socket) -> None:
        posted_error: Exception | None = None  # from posted feedback: answers this caller's next request
        while not self._closed:
            try:
                request = conn.recv(MAX_MESSAGE_BYTES)
            except OSError:
                return
            if not request:
                return  # the caller hung up
            if request[:1] == _FEEDBACK:
                try:
                    if posted_error is None:
                        for command in pickle.loads(request[1:]):
                            self._methods["feedback"](command)
                except Exception as exc:
                    posted_error = exc
                continue
            try:
                if posted_error is not None:
                    # As if the feedback had travelled with this request: it fails before doing anything.
                    error, posted_error = posted_error, None
                    raise error
                answer = self._answer(request)
            except Exception as exc:  # the caller re-raises it: a bridge error is the caller's to see
                answer = _ERROR + pickle.dumps(_portable(exc), protocol=pickle.HIGHEST_PROTOCOL)
            try:
                conn.sendall(answer)
            except OSError:
                return

    def _answer(self, request: bytes) -> bytes:
        if request[:1] == _STIM:
            return encode_reply(self._exchange(*decode_request(request)))
        if request[:1] != _CALL:
            raise ValueError(f"unknown request kind {request[:1]!r}")
        name, args = pickle.loads(request[1:])
        if name not in self._methods:
            raise ValueError(f"{name!r} is not served on the bridge's local socket; use an actor call")
        result = _RESULT + pickle.dumps(self._methods[name](*args), protocol=pickle.HIGHEST_PROTOCOL)
        if len(result) > MAX_MESSAGE_BYTES:
            raise ValueError(f"{name}'s result is {len(result)} bytes, over the socket's {MAX_MESSAGE_BYTES}")
        return result


class LocalChannelClient:
    """A caller's connection to a `LocalChannelServer` on the same machine."""

    def __init__(self, path: str, answer_within_s: float) -> None:
        self.answer_within_s = answer_within_s
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._sock.connect(path)
        except OSError as exc:
            self._sock.close()
            raise ChannelLost(f"cannot connect to the bridge's exchange socket {path}: {exc.strerror}") from None
        self._sock.settimeout(answer_within_s)

    def call(
        self, frequencies_hz: Sequence[float], amplitudes_ua: Sequence[float], feedback: Sequence[FeedbackCommand] = ()
    ) -> SpikeReply:
        """One exchange: send it and return the reply (or raise the error the bridge raised)."""
        self.send(frequencies_hz, amplitudes_ua, feedback)
        return self.receive()

    def send(
        self, frequencies_hz: Sequence[float], amplitudes_ua: Sequence[float], feedback: Sequence[FeedbackCommand] = ()
    ) -> None:
        """Send one exchange request; `receive` returns its reply."""
        try:
            self._sock.sendall(encode_request(frequencies_hz, amplitudes_ua, feedback))
        except OSError as exc:
            raise ChannelLost(f"bridge exchange socket failed: {exc}") from None

    def post_feedback(self, feedback: Sequence[FeedbackCommand]) -> None:
        """Send feedback commands now, unanswered; an error they cause answers the next request instead."""
        message = _FEEDBACK + pickle.dumps(tuple(feedback), protocol=pickle.HIGHEST_PROTOCOL)
        if len(message) > MAX_MESSAGE_BYTES:
            raise ValueError(
                f"{len(feedback)} feedback commands ({len(message)} bytes) are over the socket's {MAX_MESSAGE_BYTES}"
            )
        try:
            self._sock.sendall(message)
        except OSError as exc:
            raise ChannelLost(f"bridge socket failed: {exc}") from None

    def invoke(self, name: str, *args: Any) -> Any:
        """Call one of the bridge methods the server lists, and return its result."""
        message = _CALL + pickle.dumps((name, args), protocol=pickle.HIGHEST_PROTOCOL)
        if len(message) > MAX_MESSAGE_BYTES:
            raise ValueError(f"a {name} call of {len(message)} bytes is over the socket's {MAX_MESSAGE_BYTES}")
        try:
            self._sock.sendall(message)
        except OSError as exc:
            raise ChannelLost(f"bridge socket failed: {exc}") from None
        return pickle.loads(self.receive(expect=_RESULT)[1:])

    def receive(self, expect: bytes = _REPLY) -> Any:
        """The reply to the request sent last (or raise the error the bridge raised)."""
        try:
            data = self._sock.recv(MAX_MESSAGE_BYTES)
        except TimeoutError:
            raise TimeoutError(
                f"the bridge actor did not answer an exchange within {self.answer_within_s:.0f} s "
                "(its own device timeout is far shorter): the actor is stuck; see its log"
            ) from None
        except OSError as exc:
            raise ChannelLost(f"bridge exchange socket failed: {exc}") from None
        if not data:
            raise ChannelLost("the bridge closed its exchange socket (actor died or was closed)")
        if data[:1] == _ERROR:
            raise pickle.loads(data[1:])
        if data[:1] != expect:
            raise ChannelLost(f"the bridge answered a {expect!r} request with a {data[:1]!r} message")
        return decode_reply(data) if expect == _REPLY else data

    def close(self) -> None:
        """Hang up."""
        self._sock.close()


def remove_dead_channel_dirs(root: str | None = None) -> list[str]:
    """Remove the socket directories of this user's bridges that died without cleaning up; returns them."""
    root = root or tempfile.gettempdir()
    removed: list[str] = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(DIR_PREFIX):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue  # removed meanwhile
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            continue  # another user's bridge is not ours to judge
        if _channel_alive(entry.path, entry.name, info.st_mtime):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.path)
    return removed


def _channel_alive(path: str, name: str, mtime: float) -> bool:
    """Whether a channel directory may still be in use: its process lives and its socket answers (or is new)."""
    pid_text = name[len(DIR_PREFIX) :].split("-", 1)[0]
    if pid_text.isdigit():
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # exists, someone else's process: the id was reused; the socket decides
    if time.time() - mtime < SETUP_GRACE_S:
        return True
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        probe.connect(os.path.join(path, SOCKET_NAME))
        return True
    except OSError:
        return False  # no socket, or no one listening on it
    finally:
        probe.close()


def _portable(exc: Exception) -> Exception:
    """`exc` if it survives pickling, else a RuntimeError carrying its type and message."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
