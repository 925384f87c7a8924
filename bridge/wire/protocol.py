"""CL1 wire protocol v1: encode and decode its four datagrams byte for byte.

Layouts (little-endian), specified in docs/protocol.md:
stimulation `<Q16f` (72 B), spike counts `<Q8f` (40 B), feedback
`<QBB64BIfIB32sx` (120 B), event `<QI` header + UTF-8 JSON.
Decoders reject anything a well-behaved peer would not send, with a
`ProtocolError` that says what was wrong.
"""

from __future__ import annotations

import enum
import json
import math
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from spikeloop.bridge.wire.channels import N_ELECTRODES, N_ENCODING, N_SPIKE_GROUPS

STIM_STRUCT = struct.Struct("<Q16f")
SPIKES_STRUCT = struct.Struct("<Q8f")
FEEDBACK_STRUCT = struct.Struct("<QBB64BIfIB32sx")
EVENT_HEADER_STRUCT = struct.Struct("<QI")

STIM_SIZE = STIM_STRUCT.size  # 72
SPIKES_SIZE = SPIKES_STRUCT.size  # 40
FEEDBACK_SIZE = FEEDBACK_STRUCT.size  # 120
EVENT_HEADER_SIZE = EVENT_HEADER_STRUCT.size  # 12

DEVICE_RECV_BYTES = 4096
"""Devices read at most this many bytes per datagram."""
MAX_EVENT_JSON_BYTES = DEVICE_RECV_BYTES - EVENT_HEADER_SIZE  # 4084

EVENT_NAME_BYTES = 32
UNUSED_CHANNEL = 0xFF
MAX_FEEDBACK_CHANNELS = 64
U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1

KNOWN_EVENT_TYPES = ("episode_end", "training_complete", "status_request", "discarded")
MAX_EVENT_JSON_DEPTH = 32
"""Deepest nesting of arrays and objects an event may carry (the known events use 3)."""


class ProtocolError(ValueError):
    """A datagram or field that protocol v1 does not allow."""


class FeedbackType(enum.IntEnum):
    """Feedback command type byte."""

    INTERRUPT = 0
    EVENT = 1
    REWARD = 2


def to_f32(value: float) -> float:
    """The value as the wire's 32-bit float will carry it."""
    return struct.unpack("<f", struct.pack("<f", value))[0]


def now_us() -> int:
    """Wall-clock microseconds since the Unix epoch, as the protocol stamps them."""
    return time.time_ns() // 1000


def _finite(values: Sequence[float], what: str) -> tuple[float, ...]:
    out = tuple(float(v) for v in values)
    for i, v in enumerate(out):
        if not math.isfinite(v):
            raise ProtocolError(f"{what}[{i}] is {v}; only finite numbers are allowed")
    return out


def _check_timestamp(timestamp_us: int) -> int:
    if not isinstance(timestamp_us, int) or not 0 <= timestamp_us <= U64_MAX:
        raise ProtocolError(f"timestamp {timestamp_us!r} is not an unsigned 64-bit integer")
    return timestamp_us


def _check_size(data: bytes, expected: int, what: str) -> None:
    if len(data) != expected:
        raise ProtocolError(f"{what} datagram is {len(data)} bytes; protocol v1 requires exactly {expected}")


# --- stimulation -----------------------------------------------------------------


@dataclass(frozen=True)
class StimCommand:
    """One tick's stimulation: frequency and amplitude per encoding electrode."""

    timestamp_us: int
    frequencies_hz: tuple[float, ...]
    amplitudes_ua: tuple[float, ...]

    def __post_init__(self) -> None:
        _check_timestamp(self.timestamp_us)
        for name in ("frequencies_hz", "amplitudes_ua"):
            values = getattr(self, name)
            if len(values) != N_ENCODING:
                raise ProtocolError(f"{name} has {len(values)} entries; a stimulation needs {N_ENCODING}")
            object.__setattr__(self, name, _finite(values, name))


def encode_stim(cmd: StimCommand) -> bytes:
    """Pack a stimulation command into its 72-byte datagram."""
    return _pack(STIM_STRUCT, "stimulation command", cmd.timestamp_us, *cmd.frequencies_hz, *cmd.amplitudes_ua)


def decode_stim(data: bytes) -> StimCommand:
    """Unpack a 72-byte stimulation datagram."""
    _check_size(data, STIM_SIZE, "stimulation")
    ts, *values = STIM_STRUCT.unpack(data)
    return StimCommand(ts, tuple(values[:N_ENCODING]), tuple(values[N_ENCODING:]))


# --- spike counts ----------------------------------------------------------------


@dataclass(frozen=True)
class SpikeCounts:
    """One reply: spike counts per channel group, stamped by the device."""

    timestamp_us: int
    counts: tuple[float, ...]

    def __post_init__(self) -> None:
        _check_timestamp(self.timestamp_us)
        if len(self.counts) != N_SPIKE_GROUPS:
            raise ProtocolError(f"counts has {len(self.counts)} entries; a reply needs {N_SPIKE_GROUPS}")
        counts = _finite(self.counts, "counts")
        for i, c in enumerate(counts):
            if c < 0:
                raise ProtocolError(f"counts[{i}] is {c}; spike counts cannot be negative")
        object.__setattr__(self, "counts", counts)


def encode_spikes(reply: SpikeCounts) -> bytes:
    """Pack spike counts into their 40-byte datagram."""
    return _pack(SPIKES_STRUCT, "spike counts", reply.timestamp_us, *reply.counts)


def decode_spikes(data: bytes) -> SpikeCounts:
    """Unpack a 40-byte spike-count datagram."""
    _check_size(data, SPIKES_SIZE, "spike-count")
    ts, *counts = SPIKES_STRUCT.unpack(data)
    return SpikeCounts(ts, tuple(counts))


# --- feedback --------------------------------------------------------------------


@dataclass(frozen=True)
class FeedbackCommand:
    """Feedback stimulation (or an interrupt) on a set of electrodes.

    Values are kept as given; whether they are safe is the envelope's business
    (`spikeloop.bridge.wire.safety`), whether they fit the wire is checked by `encode_feedback`.
    """

    timestamp_us: int
    feedback_type: FeedbackType
    channels: tuple[int, ...]
    frequency_hz: float = 0
    amplitude_ua: float = 0.0
    pulses: float = 0
    unpredictable: bool = False
    event_name: str = ""

    def __post_init__(self) -> None:
        _check_timestamp(self.timestamp_us)
        try:
            object.__setattr__(self, "feedback_type", FeedbackType(self.feedback_type))
        except ValueError:
            raise ProtocolError(
                f"feedback type {self.feedback_type!r} is unknown; use 0 interrupt, 1 event or 2 reward"
            ) from None
        channels = tuple(int(c) for c in self.channels)
        if len(channels) > MAX_FEEDBACK_CHANNELS:
            raise ProtocolError(f"{len(channels)} channels; a feedback command carries at most 64")
        for c in channels:
            if not 0 <= c < N_ELECTRODES:
                raise ProtocolError(f"channel {c} is outside 0-{N_ELECTRODES - 1}")
        object.__setattr__(self, "channels", channels)
        _finite([self.frequency_hz, self.amplitude_ua, self.pulses], "frequency/amplitude/pulses")
        object.__setattr__(self, "unpredictable", bool(self.unpredictable))
        if not isinstance(self.event_name, str):
            raise ProtocolError(f"event_name must be a string, got {type(self.event_name).__name__}")


def _wire_u32(value: float, name: str) -> int:
    if (
        not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value != int(value)
        or not 0 <= value <= U32_MAX
    ):
        raise ProtocolError(f"{name} {value!r} is not an integer in 0-{U32_MAX}, as the wire field requires")
    return int(value)


def _pack(st: struct.Struct, what: str, *values: Any) -> bytes:
    try:
        return st.pack(*values)
    except (struct.error, OverflowError) as exc:
        raise ProtocolError(f"{what} does not fit protocol v1 fields: {exc}") from None


def _name_bytes(name: str) -> bytes:
    raw = name.encode("utf-8")[:EVENT_NAME_BYTES]
    # Truncation must not split a multi-byte character.
    return raw.decode("utf-8", errors="ignore").encode("utf-8")


def encode_feedback(cmd: FeedbackCommand) -> bytes:
    """Pack a feedback command into its 120-byte datagram."""
    # Checked again here: a command that skipped its constructor (unpickled, say) must not reach the wire.
    if any(isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < N_ELECTRODES for c in cmd.channels):
        raise ProtocolError(f"feedback channels {cmd.channels!r} are not all electrode numbers 0-{N_ELECTRODES - 1}")
    if len(cmd.channels) > MAX_FEEDBACK_CHANNELS:
        raise ProtocolError(f"{len(cmd.channels)} channels; a feedback command carries at most 64")
    if cmd.feedback_type not in FeedbackType._value2member_map_ or not isinstance(cmd.event_name, str):
        raise ProtocolError("feedback type or event name is not one protocol v1 allows")
    slots = list(cmd.channels) + [UNUSED_CHANNEL] * (MAX_FEEDBACK_CHANNELS - len(cmd.channels))
    return _pack(
        FEEDBACK_STRUCT,
        "feedback command",
        cmd.timestamp_us,
        int(cmd.feedback_type),
        len(cmd.channels),
        *slots,
        _wire_u32(cmd.frequency_hz, "frequency_hz"),
        _finite([cmd.amplitude_ua], "amplitude_ua")[0],
        _wire_u32(cmd.pulses, "pulses"),
        1 if cmd.unpredictable else 0,
        _name_bytes(cmd.event_name),
    )


def decode_feedback(data: bytes) -> FeedbackCommand:
    """Unpack a 120-byte feedback datagram."""
    _check_size(data, FEEDBACK_SIZE, "feedback")
    fields = FEEDBACK_STRUCT.unpack(data)
    ts, ftype, n = fields[0], fields[1], fields[2]
    slots = fields[3 : 3 + MAX_FEEDBACK_CHANNELS]
    freq, amp, pulses, unpredictable, name = fields[3 + MAX_FEEDBACK_CHANNELS :]
    if ftype not in FeedbackType._value2member_map_:
        raise ProtocolError(f"feedback type {ftype} is unknown; 0 interrupt, 1 event, 2 reward")
    if n > MAX_FEEDBACK_CHANNELS:
        raise ProtocolError(f"feedback names {n} channels; at most 64")
    if unpredictable not in (0, 1):
        raise ProtocolError(f"unpredictable flag is {unpredictable}; must be 0 or 1")
    try:
        event_name = name.rstrip(b"\x00").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"event name is not UTF-8: {exc}") from None
    return FeedbackCommand(
        ts, FeedbackType(ftype), tuple(slots[:n]), freq, amp, pulses, bool(unpredictable), event_name
    )


# --- events ----------------------------------------------------------------------


@dataclass(frozen=True)
class EventMessage:
    """Event metadata sent to the device: a type and a JSON-able payload."""

    timestamp_us: int
    event_type: str
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_timestamp(self.timestamp_us)
        if not isinstance(self.event_type, str) or not self.event_type:
            raise ProtocolError(f"event_type {self.event_type!r} must be a non-empty string")
        if not isinstance(self.data, dict):
            raise ProtocolError(f"event data must be a JSON object, got {type(self.data).__name__}")


def encode_event(msg: EventMessage) -> bytes:
    """Pack an event into its `<QI` header plus JSON body."""
    body = {"timestamp": msg.timestamp_us, "event_type": msg.event_type, "data": msg.data}
    try:
        payload = json.dumps(body, allow_nan=False, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"event {msg.event_type!r} data is not plain finite JSON: {exc}") from None
    if _json_depth(payload.decode("utf-8")) > MAX_EVENT_JSON_DEPTH:
        raise ProtocolError(f"event {msg.event_type!r} data nests deeper than {MAX_EVENT_JSON_DEPTH} levels")
    if len(payload) > MAX_EVENT_JSON_BYTES:
        raise ProtocolError(
            f"event {msg.event_type!r} JSON is {len(payload)} bytes; devices read at most "
            f"{MAX_EVENT_JSON_BYTES} after the header. Send less data per event."
        )
    return EVENT_HEADER_STRUCT.pack(msg.timestamp_us, len(payload)) + payload


def decode_event(data: bytes) -> EventMessage:
    """Unpack an event datagram, checking the header length against the body."""
    if len(data) < EVENT_HEADER_SIZE:
        raise ProtocolError(f"event datagram is {len(data)} bytes; the header alone is {EVENT_HEADER_SIZE}")
    if len(data) > DEVICE_RECV_BYTES:
        raise ProtocolError(f"event datagram is {len(data)} bytes; devices read at most {DEVICE_RECV_BYTES}")
    ts, length = EVENT_HEADER_STRUCT.unpack_from(data)
    body = data[EVENT_HEADER_SIZE:]
    if length != len(body):
        raise ProtocolError(f"event header says {length} JSON bytes but {len(body)} follow")
    if length > MAX_EVENT_JSON_BYTES:
        raise ProtocolError(f"event JSON is {length} bytes; the limit is {MAX_EVENT_JSON_BYTES}")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"event body is not UTF-8 JSON: {exc}") from None
    depth = _json_depth(text)
    if depth > MAX_EVENT_JSON_DEPTH:
        raise ProtocolError(f"event JSON nests {depth} levels deep; at most {MAX_EVENT_JSON_DEPTH} are allowed")
    try:
        obj = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"event body is not UTF-8 JSON: {exc}") from None
    except RecursionError:  # unreachable after the depth check; a decoder must never crash its caller
        raise ProtocolError("event JSON nests too deeply") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("event_type"), str):
        raise ProtocolError("event JSON must be an object with a string 'event_type'")
    payload = obj.get("data", {})
    if not isinstance(payload, dict):
        raise ProtocolError("event 'data' must be a JSON object")
    return EventMessage(ts, obj["event_type"], payload)


def _reject_constant(name: str) -> Any:
    raise ProtocolError(f"event JSON contains {name}; only finite numbers are allowed")


def _finite_float(text: str) -> float:
    # 1e400 parses to inf, which would be written back out as the non-JSON `Infinity`.
    value = float(text)
    if not math.isfinite(value):
        raise ProtocolError(f"event JSON number {text[:40]} is not a finite double")
    return value


def _json_depth(text: str) -> int:
    """Deepest bracket nesting of a JSON text, ignoring brackets inside strings (no recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest
