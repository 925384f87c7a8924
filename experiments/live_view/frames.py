"""JPEG encoding of the latest game frame, at most once per tick, only when someone watches."""

from __future__ import annotations

import io
import threading

import numpy as np

from spikeloop.experiments.live_view.publisher import Tick


class JpegCache:
    """Encodes the newest tick's frame on demand and shares the bytes between clients."""

    def __init__(self, quality: int) -> None:
        self.quality = quality
        self.encoded = 0
        """How many frames were encoded (stays 0 while nobody watches)."""
        self._lock = threading.Lock()
        self._seq = -1
        self._jpeg: bytes | None = None

    def jpeg(self, tick: Tick | None) -> bytes | None:
        """The JPEG of `tick`'s frame (cached per tick), or None without a frame."""
        if tick is None or tick.frame is None:
            return None
        with self._lock:  # two clients asking for the same tick encode it once
            if tick.seq != self._seq:
                self._jpeg = encode_jpeg(tick.frame, self.quality)
                self._seq = tick.seq
                self.encoded += 1
            return self._jpeg


def encode_jpeg(frame: np.ndarray, quality: int) -> bytes:
    """H x W x 3 (or H x W) uint8 -> JPEG bytes."""
    from PIL import Image  # Pillow comes with matplotlib; imported here so a view that is off costs nothing

    image = Image.fromarray(np.ascontiguousarray(frame[..., 0] if frame.ndim == 3 and frame.shape[2] == 1 else frame))
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=quality)
    return out.getvalue()
