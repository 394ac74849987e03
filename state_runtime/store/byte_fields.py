"""Unsigned LEB128 varints and zigzag integers: the field encoding of format 3 headers.

A varint is 7 bits per byte, least significant group first, the high bit set on every byte
but the last (at most 10 bytes for 64 bits). Zigzag maps signed to unsigned (0, -1, 1, -2 →
0, 1, 2, 3) so that small negative numbers stay short. Readers raise ValueError on bytes that
run out or a varint longer than 10 bytes; the caller reports the file as corrupt.
"""

from __future__ import annotations

_MAX_VARINT_BYTES = 10


def varint(n: int) -> bytes:
    """``n`` (>= 0, < 2**64) as an unsigned LEB128 varint."""
    if not 0 <= n < 1 << 64:
        raise ValueError(f"{n} does not fit an unsigned 64-bit varint")
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def zigzag(n: int) -> bytes:
    """Signed ``n`` (64-bit range) as a zigzag varint."""
    return varint((n << 1) if n >= 0 else ((-n) << 1) - 1)


class ByteReader:
    """Reads fields from ``data`` front to back; ValueError when the bytes run out."""

    def __init__(self, data: bytes | memoryview) -> None:
        self.data = memoryview(data)
        self.pos = 0

    @property
    def remaining(self) -> int:
        return len(self.data) - self.pos

    def take(self, size: int) -> memoryview:
        if size < 0 or size > self.remaining:
            raise ValueError(
                f"truncated: needs {size} bytes at offset {self.pos}, {self.remaining} left"
            )
        out = self.data[self.pos : self.pos + size]
        self.pos += size
        return out

    def byte(self) -> int:
        if self.pos >= len(self.data):
            self.take(1)  # raises: truncated
        b = self.data[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        # indexing the view directly: a header is a few dozen varints, and validation parses
        # the header of every file it reads
        data, pos = self.data, self.pos
        if pos < len(data) and data[pos] < 0x80:  # most header fields fit one byte
            self.pos = pos + 1
            return data[pos]
        n = shift = 0
        for _ in range(_MAX_VARINT_BYTES):
            if pos >= len(data):
                self.pos = pos
                self.take(1)  # raises: truncated
            b = data[pos]
            pos += 1
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                self.pos = pos
                if n >= 1 << 64:
                    raise ValueError(f"varint at offset {self.pos} exceeds 64 bits")
                return n
            shift += 7
        self.pos = pos
        raise ValueError(f"varint at offset {self.pos} is longer than {_MAX_VARINT_BYTES} bytes")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) if not n & 1 else -((n + 1) >> 1)
