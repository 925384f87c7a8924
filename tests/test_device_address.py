"""`spikeloop.bridge.wire.address.DeviceAddress`: one address type for the bridge, the device program and the experiment."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from spikeloop.bridge.device.program import DeviceConfig, build_parser, config_from_args
from spikeloop.bridge.trainer.core import BridgeConfig
from spikeloop.bridge.wire import channels
from spikeloop.bridge.wire.address import DeviceAddress
from spikeloop.experiments.schema import ADDRESS_KEYS, ExperimentError, default_experiment_tree, experiment_from_dict
from spikeloop.models.closed_loop.settings import CultureSettings, DeviceSettings


def test_defaults_are_the_channel_map_ports():
    a = DeviceAddress()
    assert (a.stim_port, a.spike_port, a.event_port, a.feedback_port) == (
        channels.STIM_PORT,
        channels.SPIKE_PORT,
        channels.EVENT_PORT,
        channels.FEEDBACK_PORT,
    )
    assert (a.host, a.bind_host) == ("127.0.0.1", "127.0.0.1")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"stim_port": 70000}, r"stim_port=70000: a UDP port is 1-65535"),
        ({"spike_port": -1}, r"spike_port=-1: a UDP port"),
        ({"event_port": True}, r"event_port=True: a UDP port"),
        ({"host": ""}, r"host='': give a host name or IP address"),
        ({"bind_host": " "}, r"bind_host=' ': give a host name"),
    ],
)
def test_a_bad_address_names_the_field_and_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DeviceAddress(**kwargs)


def test_port_zero_is_for_the_end_that_binds_it():
    free = DeviceAddress(stim_port=0, event_port=0, feedback_port=0, spike_port=0)  # a device binding free ports
    with pytest.raises(ValueError, match="stim_port=0: the trainer sends to this port"):
        free.require_device_ports()
    DeviceAddress(spike_port=0).require_device_ports()  # the trainer binds any free spike port
    with pytest.raises(ValueError, match="feedback_port=0"):
        BridgeConfig(address=DeviceAddress(feedback_port=0))
    with pytest.raises(ValueError, match="event_port=0"):
        DeviceSettings(address=DeviceAddress(event_port=0))


def test_describe_names_both_ends():
    text = DeviceAddress(host="10.0.0.7", stim_port=5000, spike_port=0, bind_host="0.0.0.0").describe()
    assert "10.0.0.7: stimulation port 5000" in text and "replies to 0.0.0.0:a free port" in text


def test_the_configs_hold_one_address_and_travel_pickled():
    address = DeviceAddress(host="10.0.0.7", stim_port=5000)
    dev = DeviceSettings(device_id="dish", backend="cl1", address=address)
    bridge = CultureSettings(devices=(dev,)).bridge_config(dev)
    assert bridge.address is address
    for config in (bridge, DeviceConfig(address=address), dev):
        assert pickle.loads(pickle.dumps(config)) == config
    for cls in (BridgeConfig, DeviceConfig, DeviceSettings):  # no copied field is left
        names = {f.name for f in dataclasses.fields(cls)}
        assert not names & {"host", "device_host", "training_host", "bind_host", *ADDRESS_KEYS}, cls


def test_a_simulated_device_reads_the_same_address_from_its_end():
    dev = DeviceSettings(address=DeviceAddress(host="127.0.0.1", bind_host="127.0.0.2"))
    device = dev.device_config(spike_port=4321).address
    # It listens beside the trainer, on free ports, and replies to the trainer's spike port.
    assert (device.host, device.bind_host, device.spike_port) == ("127.0.0.2", "127.0.0.2", 4321)
    assert (device.stim_port, device.event_port, device.feedback_port) == (0, 0, 0)


def test_device_flags_fill_the_address_from_the_device_end():
    args = build_parser().parse_args(
        ["--bind-host", "0.0.0.0", "--training-host", "10.0.0.2", "--stim-port", "5000", "--spike-port", "5001"]
    )
    address = config_from_args(args).address
    assert (address.host, address.bind_host, address.stim_port, address.spike_port) == (
        "0.0.0.0",
        "10.0.0.2",
        5000,
        5001,
    )
    with pytest.raises(ValueError, match=r"^--training-host '': give a host name"):
        config_from_args(build_parser().parse_args(["--training-host", ""]))
    with pytest.raises(ValueError, match=r"^--feedback-port 70000: a UDP port"):
        config_from_args(build_parser().parse_args(["--feedback-port", "70000"]))


def test_the_yaml_keeps_the_address_flat():
    assert ADDRESS_KEYS == tuple(f.name for f in dataclasses.fields(DeviceAddress))
    tree = default_experiment_tree()
    assert "address" not in tree["devices"][0] and set(ADDRESS_KEYS) <= set(tree["devices"][0])
    e = experiment_from_dict(
        {
            "devices": [{"device_id": "d", "backend": "cl1", "host": "10.0.0.7", "stim_port": 5000}],
            "resources": {"num_env_runners": 1},
        },
        source="t",
    )
    assert e.devices[0].address == DeviceAddress(host="10.0.0.7", stim_port=5000)
    assert e.plain()["devices"][0]["host"] == "10.0.0.7"
    assert experiment_from_dict(e.plain(), source="again") == e
    with pytest.raises(ExperimentError, match=r"devices\.0\.address: unknown key; write host, stim_port"):
        experiment_from_dict({"devices": [{"address": {"host": "10.0.0.7"}}]}, source="t")
    with pytest.raises(ExperimentError, match=r"devices\.0\.spike_port: a number, not text"):
        experiment_from_dict({"devices": [{"spike_port": "x"}]}, source="t")
