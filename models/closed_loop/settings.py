"""Which cultures an experiment drives and how they are reached: `DeviceSettings` and `CultureSettings`.

Frozen dataclasses, checked when built: the experiment schema (`spikeloop.experiments.schema`)
builds them from the YAML, `closed_loop_config` puts them on the algorithm config,
and each env runner's `CultureLink` reads them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Literal

from spikeloop.bridge.device.simulated_culture import SimulatedCultureConfig
from spikeloop.bridge.trainer.actor import DEVICE_RESOURCE_SHARE, device_resource
from spikeloop.bridge.trainer.core import BridgeConfig
from spikeloop.bridge.wire.address import AUTO_BIND, PORTS, DeviceAddress
from spikeloop.bridge.wire.safety import Policy, SafetyEnvelope
from spikeloop.bridge.wire.settings import (
    ALLOW_NETWORK_BIND,
    ARTIFACT_WAIT_MS,
    BACKEND,
    COLLECT_WINDOW_MS,
    CULTURE_SEED,
    CULTURE_STATE,
    ENVELOPE_POLICY,
    FAST_PATH,
    FEEDBACK_SETTLE_MS,
    MAX_CONSECUTIVE_TIMEOUTS,
    MAX_WAIT_S,
    ON_DEVICE_LOSS,
    RANDOM_SPIKE_RATE_HZ,
    REPLY_PORT,
    REPLY_SPIN_MS,
    SEED,
    SIM_REALTIME,
    STATUS_REQUESTS,
    STIM_MODE,
    TICK_FREQUENCY_HZ,
    TIMEOUT_POLICY,
    TIMEOUT_S,
)
from spikeloop.models.closed_loop.feedback import FeedbackSettings
from spikeloop.models.closed_loop.meter import MeterSettings

SIMULATED_BACKENDS = tuple(b for b in BACKEND.choices if b != "cl1")
DEVICE_ID_CHARACTERS = "A-Za-z0-9_.-"
DEVICE_ID = re.compile(f"[{DEVICE_ID_CHARACTERS}]+")
"""A device id names a Ray actor, a node resource (`cl1:<id>`) and files: no separators, spaces or quotes."""
MAX_SEED = 2**31 - 1
"""The largest seed an experiment may set: the seeds derived from it (plus a sweep's seed number, plus an env
runner's index) stay below spikeloop.bridge.wire.settings.SEED_LIMIT."""
UNPACED_REPLY_TIMEOUT_S = 30.0
"""The reply timeout of an unpaced simulated device (`realtime: false`), whatever `loop.timeout_s` says. Its reply
costs computation only, so a late one means a starved CPU, not a slow culture: acting on zeros then would make the
run depend on the machine's load (docs/architecture.md, "Unpaced simulated runs repeat bit for bit"). Still
finite, so that a device that died is reported."""
DEVICE_SLOT_RESOURCE = "cl1_slot"
"""Every node that owns CL1 devices advertises one of these per device; each env runner takes one."""


@dataclass(frozen=True)
class DeviceSettings:
    """One culture: a real CL1 reached over the network, or a simulated one started for you."""

    device_id: str = "sim"
    backend: Literal["cl1", "sim", "random", "zero", "transparent"] = BACKEND.default
    """`cl1`: a device program already running at `host` (real hardware or cl-sdk); others are started here.
    `transparent` is the perfect-channel control (bridge/device/backends/transparent.py)."""
    address: DeviceAddress = field(default_factory=DeviceAddress)
    """Where the device is and where the trainer binds its spike port (`spike_port` 0: any free port). The YAML
    writes its fields flat under the device (`host:`, `stim_port:`, ...); the experiment schema nests them."""
    reply_port: int | Literal["auto", "stim_port", "any"] = REPLY_PORT.default
    """Source port of the device host that replies must come from: "auto" (the port of the first reply that answers
    a stimulation, pinned from then on: a third-party program may reply from any socket of its own), "stim_port"
    (pinned from the start: where `spikeloop device` replies from), a port number, or "any" (any process on the
    device host could then answer for it). `spikeloop check` names the port replies came from."""
    allow_network_bind: bool = ALLOW_NETWORK_BIND.default
    """Acknowledges a `bind_host` beyond loopback (a wildcard, another interface, or `auto` towards a remote device):
    without it an experiment refuses such a bind (spikeloop.experiments.exposure)."""
    status_requests: bool = STATUS_REQUESTS.default
    """Ask the device for its status (dose, limits, refusals) after each episode end and in `spikeloop check`
    (`status_request` events, docs/protocol.md). False: the device program sees only the trainer's own events."""
    node_resource: str | None = None
    """Custom resource of the node that owns the device (default for cl1: `cl1:<device_id>`)."""
    # Simulated devices only (defaults: the reference device timing, run as fast as possible):
    seed: int = SEED.default
    realtime: bool = SIM_REALTIME.default
    """Not the device program's default (`DEVICE_REALTIME`): an experiment's simulated device runs unpaced."""
    tick_frequency_hz: float = TICK_FREQUENCY_HZ.default
    artifact_wait_ms: float = ARTIFACT_WAIT_MS.default
    collect_window_ms: float = COLLECT_WINDOW_MS.default
    random_spike_rate_hz: float = RANDOM_SPIKE_RATE_HZ.default
    culture: SimulatedCultureConfig | None = None
    """backend sim only: the simulated culture's knobs (`spikeloop.bridge.device.simulated_culture.SimulatedCultureConfig`, listed
    in docs/architecture.md); absent: the defaults. Other backends hold None and refuse a section that sets a knob."""
    culture_seed: int | None = CULTURE_SEED.default
    """backend sim only: which simulated dish (spikeloop.bridge.device.culture_variation): the knobs `culture` leaves
    at their defaults are drawn from it, and so is the wiring (`seed` is then not used). Env runner i > 1 gets
    culture_seed + i - 1; absent: every culture from the default knobs, wired by `seed`."""
    culture_state: str | None = CULTURE_STATE.default
    """backend sim only, one env runner: the culture is loaded from this file if it exists and saved to it when its
    device closes, so that it carries over into the next run (a design's blocks set it: experiments/design)."""
    feedback_settle_ms: float = FEEDBACK_SETTLE_MS.default
    """Simulated devices: hold each stimulation until this long after the last pulse of the feedback before it, so
    the decoder never reads feedback-evoked spikes (0: off; see `spikeloop.bridge.device.program.DeviceConfig`)."""
    stim_mode: Literal["burst", "reference"] = STIM_MODE.default
    """What one stimulation command does (spikeloop.bridge.wire.settings.STIM_MODE): `burst`, a burst lasting one tick per
    encoding electrode; `reference`, the reference device's interrupt of every stimulable electrode, then one
    pulse per encoding electrode. A cl1 device's program takes it as `spikeloop device --stim-mode`."""

    def __post_init__(self) -> None:
        if not isinstance(self.device_id, str) or not DEVICE_ID.fullmatch(self.device_id):
            raise ValueError(
                f"device_id={self.device_id!r}: must be a non-empty name of letters, digits, '_', '.' and '-' "
                f"only ({DEVICE_ID_CHARACTERS}; it names the bridge actor, the node resource and files), e.g. cl1-a"
            )
        if not isinstance(self.address, DeviceAddress):
            raise ValueError(f"address={self.address!r}: give a spikeloop.bridge.wire.address.DeviceAddress")
        self.address.require_device_ports()
        ports = {name: getattr(self.address, name) for name in PORTS if getattr(self.address, name) != 0}
        for i, (name, port) in enumerate(ports.items()):
            same = [other for other in list(ports)[:i] if ports[other] == port]
            if same:
                raise ValueError(
                    f"{name}={port}: the same port as this device's {same[0]}; each of a device's ports "
                    f"({', '.join(PORTS)}) must be its own"
                )
        SEED.require(self.seed)
        reply = self.reply_port
        if reply not in ("auto", "stim_port", "any") and (
            isinstance(reply, bool) or not isinstance(reply, int) or not 1 <= reply <= 65535
        ):
            raise ValueError(f"reply_port={reply!r}: use auto, stim_port, any or a UDP port 1-65535")
        STATUS_REQUESTS.require(self.status_requests)
        ALLOW_NETWORK_BIND.require(self.allow_network_bind)
        if self.simulated and self.address.bind_host == AUTO_BIND:
            # A simulated device runs beside its bridge: the interface that faces it is loopback.
            object.__setattr__(self, "address", replace(self.address, bind_host="127.0.0.1"))
        if self.node_resource is not None and not self.node_resource.strip():
            raise ValueError("node_resource is empty: leave it out for the default cl1:<device_id>")
        for setting in (
            TICK_FREQUENCY_HZ,
            ARTIFACT_WAIT_MS,
            COLLECT_WINDOW_MS,
            RANDOM_SPIKE_RATE_HZ,
            FEEDBACK_SETTLE_MS,
        ):
            setting.require(getattr(self, setting.name))
        # A sim device always holds its knobs (written out in the resolved experiment, so a sweep can reach them);
        # another backend holds none, and refuses a section that sets one.
        if self.backend == "sim" and self.culture is None:
            object.__setattr__(self, "culture", SimulatedCultureConfig())
        elif self.culture == SimulatedCultureConfig() and self.backend != "sim":
            object.__setattr__(self, "culture", None)
        if self.culture is not None and self.backend != "sim":
            raise ValueError(
                f"culture: backend {self.backend} has no simulated culture; the culture settings are for backend "
                "sim (remove them here)"
            )
        for name in ("culture_seed", "culture_state"):
            if getattr(self, name) is not None and self.backend != "sim":
                raise ValueError(
                    f"{name}: backend {self.backend} has no simulated culture; a cl1 device's program takes "
                    f"--{name.replace('_', '-')} itself (`spikeloop device --backend sim`)"
                )
        CULTURE_SEED.require(self.culture_seed)
        if self.culture_state is not None and not (isinstance(self.culture_state, str) and self.culture_state):
            raise ValueError(f"culture_state={self.culture_state!r}: give a file path")
        if self.feedback_settle_ms > 0 and not self.simulated:
            raise ValueError(
                "feedback_settle_ms: a cl1 device is a program of its own; start it with "
                "`spikeloop device --feedback-settle-ms MS` instead"
            )

    @property
    def simulated(self) -> bool:
        """True when spikeloop starts this device itself."""
        return self.backend in SIMULATED_BACKENDS

    @property
    def unpaced(self) -> bool:
        """True for a simulated device that runs as fast as possible: its culture moves only when stimulated, so a
        run through it repeats bit for bit (docs/architecture.md, "Unpaced simulated runs repeat bit for bit")."""
        return self.simulated and not self.realtime

    @property
    def resource(self) -> str:
        """The custom resource that marks the node owning this device."""
        return self.node_resource or device_resource(self.device_id)

    def describe(self) -> str:
        """Where the device is: backend, host and its ports (for messages)."""
        return f"{self.backend} at {self.address.describe()}"

    def device_config(self, spike_port: int, envelope: SafetyEnvelope | None = None):
        """The device program's settings for this simulated device (its own ports: any free ones).

        It runs beside the trainer: it listens on the trainer's bind host and replies to `spike_port` there.
        The device gets the experiment's envelope as its own, and takes commands only from the bridge's socket.
        """
        from spikeloop.bridge.device.program import DeviceConfig

        address = self.address
        return DeviceConfig(
            envelope=envelope or SafetyEnvelope(),
            accept_from="spike_port",
            address=replace(
                address, host=address.bind_host, stim_port=0, feedback_port=0, event_port=0, spike_port=spike_port
            ),
            backend=self.backend,
            seed=self.seed,
            realtime=self.realtime,
            tick_frequency_hz=self.tick_frequency_hz,
            artifact_wait_ms=self.artifact_wait_ms,
            collect_window_ms=self.collect_window_ms,
            random_spike_rate_hz=self.random_spike_rate_hz,
            culture=self.culture,
            culture_seed=self.culture_seed,
            culture_fixed=self._culture_fixed(),
            culture_state=Path(self.culture_state) if self.culture_state is not None else None,
            feedback_settle_ms=self.feedback_settle_ms,
            stim_mode=self.stim_mode,
            exit_on_error_complete=True,  # it ends with its trial, whatever the trial's end
        )

    def _culture_fixed(self) -> frozenset[str]:
        """The knobs a culture seed leaves alone: those the experiment moved off their defaults."""
        if self.culture is None or self.culture_seed is None:
            return frozenset()
        default = SimulatedCultureConfig()
        return frozenset(f.name for f in fields(default) if getattr(self.culture, f.name) != getattr(default, f.name))


@dataclass(frozen=True)
class CultureSettings:
    """Everything an env runner needs to reach its culture."""

    devices: tuple[DeviceSettings, ...] = (DeviceSettings(),)
    envelope: SafetyEnvelope = field(default_factory=SafetyEnvelope)
    envelope_policy: Policy = ENVELOPE_POLICY.default
    timeout_s: float = TIMEOUT_S.default
    timeout_policy: Literal["zeros", "raise"] = TIMEOUT_POLICY.default
    max_consecutive_timeouts: int = MAX_CONSECUTIVE_TIMEOUTS.default
    on_device_loss: Literal["continue", "stop", "wait"] = ON_DEVICE_LOSS.default
    max_wait_s: float = MAX_WAIT_S.default
    """With `on_device_loss: wait`: how long the env step waits, probing, for the device to answer again."""
    feedback: FeedbackSettings = field(default_factory=FeedbackSettings)
    fast_path: bool = FAST_PATH.default
    reply_spin_ms: float = REPLY_SPIN_MS.default
    step_log: bool = False
    """Keep each exchange's latency so episodes can carry a per-step log (`output.step_log`)."""
    meter: MeterSettings = field(default_factory=MeterSettings)
    """The live information meter (spikeloop.models.closed_loop.meter; experiment section `meter`)."""

    def simulated_device_for(self, runner_index: int) -> DeviceSettings:
        """The simulated culture of env runner `runner_index`: the template with its own id and seed."""
        base = self.devices[0]
        culture_seed = None if base.culture_seed is None else base.culture_seed + max(0, runner_index - 1)
        return replace(
            base, device_id=f"{base.device_id}-{runner_index}", seed=base.seed + runner_index, culture_seed=culture_seed
        )

    def devices_on_node(self, node_resources: dict[str, float]) -> list[DeviceSettings]:
        """The hardware devices whose node resource the given node advertises."""
        return [d for d in self.devices if d.resource in node_resources]

    @property
    def hardware(self) -> tuple[DeviceSettings, ...]:
        """The cl1 devices (those not started by spikeloop)."""
        return tuple(d for d in self.devices if not d.simulated)

    def node_resources(self) -> dict[str, float]:
        """What one machine that owns every hardware device advertises: each device and one env-runner slot each."""
        hardware = self.hardware
        return {d.resource: 1.0 for d in hardware} | ({DEVICE_SLOT_RESOURCE: float(len(hardware))} if hardware else {})

    def runner_resources(self) -> dict[str, float]:
        """Custom resources each env runner asks for: a device slot, plus the device itself when there is one.

        With several devices every env runner asks the same (RLlib gives them one request), so only the slot;
        with one, a share of its resource keeps the env runner off other device nodes.
        """
        hardware = self.hardware
        if not hardware:
            return {}
        return {DEVICE_SLOT_RESOURCE: 1.0} | (
            {hardware[0].resource: DEVICE_RESOURCE_SHARE} if len(hardware) == 1 else {}
        )

    def bridge_config(self, dev: DeviceSettings) -> BridgeConfig:
        """The bridge settings for one of this experiment's devices."""
        return BridgeConfig(
            device_id=dev.device_id,
            address=dev.address,
            # A simulated device is spikeloop's own: it replies from its stimulation port.
            device_reply_port=("stim_port" if dev.simulated else None if dev.reply_port == "any" else dev.reply_port),
            # An unpaced culture's reply is late only on a starved CPU: wait for it (UNPACED_REPLY_TIMEOUT_S).
            timeout_s=max(self.timeout_s, UNPACED_REPLY_TIMEOUT_S) if dev.unpaced else self.timeout_s,
            timeout_policy=self.timeout_policy,
            envelope=self.envelope,
            envelope_policy=self.envelope_policy,
            reply_spin_ms=self.reply_spin_ms,
            status_requests=dev.status_requests,
        )

    def __post_init__(self) -> None:
        # timeout_s: its lower bound only, as the bridge's (an unpaced device's bridge waits longer).
        TIMEOUT_S.require(self.timeout_s, upper=False)
        for setting in (
            ENVELOPE_POLICY,
            TIMEOUT_POLICY,
            MAX_CONSECUTIVE_TIMEOUTS,
            ON_DEVICE_LOSS,
            MAX_WAIT_S,
            FAST_PATH,
            REPLY_SPIN_MS,
        ):
            setting.require(getattr(self, setting.name))
        if not self.devices:
            raise ValueError("devices is empty: list at least one device")
        if any(d.simulated for d in self.devices) and len(self.devices) > 1:
            raise ValueError(
                "devices: a simulated device is a template (one culture is started per env runner); "
                "list exactly one sim/random/zero/transparent device, or only cl1 devices"
            )
        ids = [d.device_id for d in self.devices]
        if len(set(ids)) != len(ids):
            raise ValueError(f"devices: device ids must be unique, got {ids}")
        # Two devices on one host cannot share a port: one program's bind would fail, or take the other's datagrams.
        taken: dict[tuple[str, int], str] = {}
        for i, dev in enumerate(self.devices):
            host = _same_host(dev.address.host)
            for name in PORTS:
                port = getattr(dev.address, name)
                if port == 0:
                    continue
                other = taken.get((host, port))
                if other is not None and not other.startswith(f"devices.{i}."):
                    raise ValueError(
                        f"devices.{i}.{name}: port {port} on host {dev.address.host} is already {other}; two "
                        "devices on one host need ports of their own (e.g. 12345-12348 and 12355-12358)"
                    )
                taken[(host, port)] = f"devices.{i}.{name}"


def _same_host(host: str) -> str:
    """A host as compared for port clashes: case and `localhost` (127.0.0.1) do not matter."""
    host = host.strip().lower()
    return "127.0.0.1" if host == "localhost" else host
