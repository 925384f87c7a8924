"""The wire both sides share: channel map, ports, addresses, the protocol v1 codec and the safety envelope."""
