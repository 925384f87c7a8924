"""The live view: each env runner serves its game (MJPEG), stimulation, spikes and rewards over HTTP.

Off by default (`view.enabled`); on, every env runner process runs a small
threaded HTTP server on its own node (127.0.0.1 unless `view.host` says
otherwise), fed by a publisher that keeps only the latest tick.
"""

from spikeloop.experiments.live_view.settings import ViewSettings

__all__ = ["ViewSettings"]
