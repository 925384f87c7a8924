"""Protocol v1 codec: golden bytes written out by hand, round trips, rejections."""

from __future__ import annotations

import json
import math
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spikeloop.bridge.wire import protocol as p
from spikeloop.bridge.wire.channels import N_ELECTRODES

# --- golden bytes: the layout written out field by field, independently of the codec ---


def f32(x: float) -> bytes:
    return struct.pack("<f", x)


def u64(x: int) -> bytes:
    return x.to_bytes(8, "little")


def u32(x: int) -> bytes:
    return x.to_bytes(4, "little")


def test_stim_golden_bytes():
    freqs = [4.0, 5.5, 10.0, 12.25, 20.0, 30.0, 39.5, 40.0]
    amps = [1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 1.0]
    expected = u64(1_700_000_000_123_456) + b"".join(f32(f) for f in freqs) + b"".join(f32(a) for a in amps)
    assert len(expected) == 72
    got = p.encode_stim(p.StimCommand(1_700_000_000_123_456, tuple(freqs), tuple(amps)))
    assert got == expected
    assert p.decode_stim(expected) == p.StimCommand(1_700_000_000_123_456, tuple(freqs), tuple(amps))


def test_spikes_golden_bytes():
    counts = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 70.0]
    expected = u64(42) + b"".join(f32(c) for c in counts)
    assert len(expected) == 40
    assert p.encode_spikes(p.SpikeCounts(42, tuple(counts))) == expected
    assert p.decode_spikes(expected).counts == tuple(counts)


def test_feedback_golden_bytes():
    channels = [19, 20, 22]
    expected = (
        u64(123456789)
        + bytes([2])  # reward
        + bytes([3])  # n channels
        + bytes(channels + [0xFF] * 61)
        + u32(20)
        + f32(2.0)
        + u32(30)
        + bytes([1])
        + b"reward".ljust(32, b"\x00")
        + b"\x00"  # padding byte
    )
    assert len(expected) == 120
    cmd = p.FeedbackCommand(123456789, p.FeedbackType.REWARD, (19, 20, 22), 20, 2.0, 30, True, "reward")
    assert p.encode_feedback(cmd) == expected
    assert p.decode_feedback(expected) == cmd


def test_feedback_field_offsets():
    data = p.encode_feedback(p.FeedbackCommand(7, p.FeedbackType.EVENT, (35,), 90, 2.5, 50, False, "enemy_kill"))
    assert data[8] == 1 and data[9] == 1 and data[10] == 35 and data[11] == 0xFF
    assert int.from_bytes(data[74:78], "little") == 90
    assert struct.unpack("<f", data[78:82])[0] == 2.5
    assert int.from_bytes(data[82:86], "little") == 50
    assert data[86] == 0
    assert data[87:119].rstrip(b"\x00") == b"enemy_kill"


def test_event_golden_bytes():
    body = {"timestamp": 99, "event_type": "episode_end", "data": {"episode": 3, "episode_reward": -12.5}}
    got = p.encode_event(p.EventMessage(99, "episode_end", body["data"]))
    header, payload = got[:12], got[12:]
    assert header == u64(99) + u32(len(payload))
    assert json.loads(payload) == body


def test_event_name_truncated_at_32_bytes_without_splitting_characters():
    name = "é" * 20  # 40 UTF-8 bytes
    data = p.encode_feedback(p.FeedbackCommand(1, p.FeedbackType.EVENT, (35,), 20, 2.0, 1, False, name))
    assert p.decode_feedback(data).event_name == "é" * 16


# --- round trips over valid inputs ---------------------------------------------------

timestamps = st.integers(min_value=0, max_value=2**64 - 1)
finite_f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@given(timestamps, st.lists(finite_f32, min_size=8, max_size=8), st.lists(finite_f32, min_size=8, max_size=8))
def test_stim_round_trip(ts, freqs, amps):
    cmd = p.StimCommand(ts, tuple(freqs), tuple(amps))
    assert p.decode_stim(p.encode_stim(cmd)) == cmd


@given(timestamps, st.lists(st.floats(min_value=0, width=32, allow_infinity=False), min_size=8, max_size=8))
def test_spikes_round_trip(ts, counts):
    reply = p.SpikeCounts(ts, tuple(counts))
    assert p.decode_spikes(p.encode_spikes(reply)) == reply


@given(
    timestamps,
    st.sampled_from(list(p.FeedbackType)),
    st.lists(st.integers(0, N_ELECTRODES - 1), max_size=64),
    st.integers(0, 2**32 - 1),
    st.floats(min_value=0, width=32, allow_infinity=False),
    st.integers(0, 2**32 - 1),
    st.booleans(),
    st.text(max_size=40),
)
def test_feedback_round_trip(ts, ftype, channels, freq, amp, pulses, unpredictable, name):
    cmd = p.FeedbackCommand(ts, ftype, tuple(channels), freq, amp, pulses, unpredictable, name)
    back = p.decode_feedback(p.encode_feedback(cmd))
    expected_name = name.encode()[:32].decode("utf-8", errors="ignore").rstrip("\x00")
    assert back == p.FeedbackCommand(ts, ftype, tuple(channels), freq, amp, pulses, unpredictable, expected_name)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@given(timestamps, st.text(min_size=1, max_size=30), st.dictionaries(st.text(max_size=10), json_values, max_size=6))
def test_event_round_trip(ts, event_type, data):
    msg = p.EventMessage(ts, event_type, data)
    assert p.decode_event(p.encode_event(msg)) == msg


# --- rejections ----------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 71, 73, 144])
def test_stim_wrong_size_rejected(size):
    with pytest.raises(p.ProtocolError, match="72"):
        p.decode_stim(b"\x00" * size)


@pytest.mark.parametrize("size", [0, 39, 41, 72])
def test_spikes_wrong_size_rejected(size):
    with pytest.raises(p.ProtocolError, match="40"):
        p.decode_spikes(b"\x00" * size)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_rejected_everywhere(bad):
    stim = u64(1) + f32(bad) + f32(1.0) * 15
    with pytest.raises(p.ProtocolError, match="finite"):
        p.decode_stim(stim)
    spikes = u64(1) + f32(bad) + f32(1.0) * 7
    with pytest.raises(p.ProtocolError, match="finite"):
        p.decode_spikes(spikes)
    fb = bytearray(p.encode_feedback(p.FeedbackCommand(1, 2, (19,), 20, 2.0, 30)))
    fb[78:82] = f32(bad)
    with pytest.raises(p.ProtocolError, match="finite"):
        p.decode_feedback(bytes(fb))
    with pytest.raises(p.ProtocolError, match="finite"):
        p.StimCommand(1, (bad,) + (1.0,) * 7, (1.0,) * 8)


def test_negative_spike_count_rejected():
    with pytest.raises(p.ProtocolError, match="negative"):
        p.decode_spikes(u64(1) + f32(-1.0) + f32(0.0) * 7)


def test_feedback_unknown_type_rejected():
    fb = bytearray(p.encode_feedback(p.FeedbackCommand(1, 2, (19,), 20, 2.0, 30)))
    fb[8] = 3
    with pytest.raises(p.ProtocolError, match="type 3"):
        p.decode_feedback(bytes(fb))
    with pytest.raises(p.ProtocolError, match="unknown"):
        p.FeedbackCommand(1, 7, (19,))


def test_feedback_out_of_range_channels_rejected():
    fb = bytearray(p.encode_feedback(p.FeedbackCommand(1, 2, (19, 20), 20, 2.0, 30)))
    fb[11] = 64
    with pytest.raises(p.ProtocolError, match="channel 64"):
        p.decode_feedback(bytes(fb))
    fb[9] = 65
    with pytest.raises(p.ProtocolError, match="65 channels"):
        p.decode_feedback(bytes(fb))
    with pytest.raises(p.ProtocolError, match="channel -1"):
        p.FeedbackCommand(1, 2, (-1,))


def test_feedback_bad_flag_and_name_rejected():
    fb = bytearray(p.encode_feedback(p.FeedbackCommand(1, 2, (19,), 20, 2.0, 30)))
    fb[86] = 2
    with pytest.raises(p.ProtocolError, match="unpredictable"):
        p.decode_feedback(bytes(fb))
    fb[86] = 0
    fb[87:89] = b"\xff\xfe"
    with pytest.raises(p.ProtocolError, match="UTF-8"):
        p.decode_feedback(bytes(fb))


def test_feedback_wire_fields_must_fit():
    with pytest.raises(p.ProtocolError, match="integer"):
        p.encode_feedback(p.FeedbackCommand(1, 2, (19,), 20.5, 2.0, 30))
    with pytest.raises(p.ProtocolError, match="pulses"):
        p.encode_feedback(p.FeedbackCommand(1, 2, (19,), 20, 2.0, 2**32))


def test_oversized_event_rejected_both_ways():
    big = {"blob": "x" * p.MAX_EVENT_JSON_BYTES}
    with pytest.raises(p.ProtocolError, match="4084"):
        p.encode_event(p.EventMessage(1, "episode_end", big))
    payload = b"{" + b" " * 4090 + b"}"
    with pytest.raises(p.ProtocolError):
        p.decode_event(u64(1) + u32(len(payload)) + payload)


def test_event_json_at_the_limit_accepted():
    body_len = len(json.dumps({"timestamp": 1, "event_type": "e", "data": {"k": ""}}, separators=(",", ":")))
    data = {"k": "x" * (p.MAX_EVENT_JSON_BYTES - body_len)}
    encoded = p.encode_event(p.EventMessage(1, "e", data))
    assert len(encoded) == p.DEVICE_RECV_BYTES
    assert p.decode_event(encoded).data == data


@pytest.mark.parametrize(
    "payload",
    [b"not json", b'{"event_type": 3}', b"[1, 2]", b'{"event_type": "x", "data": 5}', b'{"event_type": "x", "v": NaN}'],
)
def test_bad_event_bodies_rejected(payload):
    with pytest.raises(p.ProtocolError):
        p.decode_event(u64(1) + u32(len(payload)) + payload)


def test_event_length_mismatch_rejected():
    data = p.encode_event(p.EventMessage(1, "episode_end", {}))
    with pytest.raises(p.ProtocolError, match="header says"):
        p.decode_event(data[:-1])
    with pytest.raises(p.ProtocolError, match="header alone"):
        p.decode_event(data[:5])


def test_event_data_must_be_finite_json():
    with pytest.raises(p.ProtocolError, match="finite JSON"):
        p.encode_event(p.EventMessage(1, "episode_end", {"reward": math.nan}))


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b'{"event_type":"x","data":{"a":' + b"[" * 2000 + b"]" * 2000 + b"}}", "nests 2002 levels"),
        (b'{"event_type":"x","data":{"r":1e400}}', "1e400 is not a finite double"),
        (b'{"event_type":"x","data":{"r":-1e999}}', "not a finite double"),
        (b"[" * 4000, "nests 4000 levels"),
    ],
)
def test_event_bodies_that_crash_or_fool_a_json_parser_are_refused(payload, message):
    with pytest.raises(p.ProtocolError, match=message):
        p.decode_event(u64(1) + u32(len(payload)) + payload)


def test_brackets_inside_strings_do_not_count_as_nesting():
    data = {"note": "[[[[{{{{" * 100}
    assert p.decode_event(p.encode_event(p.EventMessage(1, "episode_end", data))).data == data


def test_encoder_refuses_a_feedback_command_that_skipped_its_constructor():
    """An unpickled command bypasses __post_init__; the encoder still keeps it off the wire."""
    for field, value in (
        ("channels", (99,)),
        ("channels", (-1,)),
        ("feedback_type", 9),
        ("amplitude_ua", math.nan),
        ("pulses", math.inf),
        ("event_name", b"bytes"),
    ):
        cmd = p.FeedbackCommand(1, p.FeedbackType.REWARD, (19,), 20, 2.0, 30)
        object.__setattr__(cmd, field, value)
        with pytest.raises(p.ProtocolError):
            p.encode_feedback(cmd)
