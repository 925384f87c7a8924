"""The device program (`spikeloop device`): its backends, the simulated culture, the loopback test device.

It imports only the wire (`spikeloop.bridge.wire`) and itself: never the trainer's side, never Ray
(tests/test_device_program_imports.py), so a lab's device host needs neither.
"""
