"""A set of a dataset's line numbers as a bitmap: the lines that have their row.

A resume of a million rows used to hold one dict entry per done line (about 100 bytes each,
BENCHMARKS.md "Soak"); a bit per line of the dataset is 125 KB for a million lines.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator


class LineSet:
    """Non-negative ints, one bit each; `len` is the number of members, kept as they are added."""

    __slots__ = ("_bits", "_count")

    def __init__(self, lines: Iterable[int] = ()) -> None:
        self._bits = bytearray()
        self._count = 0
        for line in lines:
            self.add(line)

    def __contains__(self, line: object) -> bool:
        if type(line) is not int or line < 0:
            return False
        byte = line >> 3
        return byte < len(self._bits) and bool(self._bits[byte] >> (line & 7) & 1)

    def add(self, line: int) -> bool:
        """Add `line`; whether it was new."""
        byte = line >> 3
        bits = self._bits
        if byte >= len(bits):
            # Grow by half again at least: rows arrive in about line order.
            bits.extend(bytes(max(byte + 1 - len(bits), len(bits) >> 1, 64)))
        mask = 1 << (line & 7)
        if bits[byte] & mask:
            return False
        bits[byte] |= mask
        self._count += 1
        return True

    def discard(self, line: int) -> None:
        """Take `line` out, if it is there (a row taken back: engine/run/requeue.py)."""
        if line in self:
            self._bits[line >> 3] &= ~(1 << (line & 7)) & 0xFF
            self._count -= 1

    def update(self, lines: Iterable[int]) -> None:
        for line in lines:
            self.add(line)

    def copy(self) -> LineSet:
        other = LineSet()
        other._bits = bytearray(self._bits)
        other._count = self._count
        return other

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __iter__(self) -> Iterator[int]:
        for byte, value in enumerate(self._bits):
            if value:
                base = byte << 3
                for bit in range(8):
                    if value >> bit & 1:
                        yield base + bit

    def to_bytes(self) -> bytes:
        """The bitmap, trailing zero bytes dropped (line n is bit n % 8 of byte n // 8)."""
        return bytes(self._bits.rstrip(b"\x00"))

    @classmethod
    def from_bytes(cls, data: bytes) -> LineSet:
        lines = cls()
        lines._bits = bytearray(data)
        lines._count = int.from_bytes(data, "little").bit_count()
        return lines

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LineSet):
            return NotImplemented
        return self._count == other._count and self.to_bytes() == other.to_bytes()

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"LineSet({len(self)} lines)"
