"""Varints read back as written, one byte or many, and malformed ones are refused."""

from __future__ import annotations

import pytest

from state_runtime.store.byte_fields import ByteReader, varint, zigzag


@pytest.mark.parametrize("n", [0, 1, 0x7F, 0x80, 300, 1 << 35, (1 << 64) - 1])
def test_varint_round_trip_and_position(n: int) -> None:
    reader = ByteReader(varint(n) + b"\x05")
    assert reader.varint() == n
    assert reader.pos == len(varint(n))
    assert reader.varint() == 5
    assert reader.remaining == 0


@pytest.mark.parametrize("n", [0, -1, 1, -64, 63, -(1 << 63), (1 << 63) - 1])
def test_zigzag_round_trip(n: int) -> None:
    assert ByteReader(zigzag(n)).zigzag() == n


def test_truncated_varints_are_refused() -> None:
    with pytest.raises(ValueError, match="truncated"):
        ByteReader(b"").varint()
    with pytest.raises(ValueError, match="truncated"):
        ByteReader(b"\x80\x80").varint()


def test_overlong_varints_are_refused() -> None:
    with pytest.raises(ValueError, match="exceeds 64 bits"):
        ByteReader(b"\xff" * 9 + b"\x02").varint()  # 2**64, in ten bytes
    with pytest.raises(ValueError, match="longer than"):
        ByteReader(b"\xff" * 11 + b"\x01").varint()
