"""Framing between the reward pool and its worker processes: a 4-byte length, then a pickle.

Both ends are our own processes (the pool starts the workers), so pickle is fine here; nothing
untrusted is ever unpickled: model responses travel inside the frames as plain strings.
"""

from __future__ import annotations

import os
import pickle
import struct
from typing import Any

_HEADER = struct.Struct("!I")
MAX_FRAME = 256 << 20


def encode(kind: str, payload: Any) -> bytes:
    body = pickle.dumps((kind, payload), protocol=pickle.HIGHEST_PROTOCOL)
    if len(body) > MAX_FRAME:
        raise ValueError(
            f"frame of {len(body)} bytes exceeds {MAX_FRAME}; responses this large cannot be scored"
        )
    return _HEADER.pack(len(body)) + body


def write_frame(fd: int, kind: str, payload: Any) -> None:
    """Blocking write of one whole frame (worker side)."""
    view = memoryview(encode(kind, payload))
    while view:
        view = view[os.write(fd, view) :]


def read_frame(fd: int) -> tuple[str, Any] | None:
    """Blocking read of one frame (worker side); None at EOF."""
    header = _read_exact(fd, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    body = _read_exact(fd, size)
    if body is None:
        return None
    return pickle.loads(body)


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class FrameBuffer:
    """Incremental decoder for the non-blocking pool side: feed bytes, take whole frames."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[str, Any]]:
        self._buf += data
        frames = []
        while len(self._buf) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buf)
            if len(self._buf) < _HEADER.size + size:
                break
            body = bytes(self._buf[_HEADER.size : _HEADER.size + size])
            del self._buf[: _HEADER.size + size]
            frames.append(pickle.loads(body))
        return frames
