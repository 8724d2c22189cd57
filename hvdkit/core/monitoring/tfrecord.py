"""CRC-32C (Castagnoli) and TFRecord framing: the byte layer of TensorBoard event files.

    blob = frame_record(data)   # length, masked CRC of the length, data, masked CRC of the data

Pure Python and the standard library only; no TensorFlow, no TensorBoard.
"""

from __future__ import annotations

import struct

__all__ = ["crc32c", "masked_crc32c", "frame_record"]


def _make_crc32c_table(poly=0x82F63B78):  # Castagnoli, bit-reflected
    def entry(crc):
        for _ in range(8):
            crc = (crc >> 1) ^ poly if crc & 1 else crc >> 1
        return crc

    return tuple(entry(byte) for byte in range(256))


_CRC32C_TABLE = _make_crc32c_table()


def crc32c(data: bytes, crc: int = 0) -> int:
    """CRC-32C (Castagnoli) of ``data``, continuing from ``crc``; ``crc32c(b"123456789") == 0xE3069283``."""
    crc ^= 0xFFFFFFFF
    table = _CRC32C_TABLE
    for byte in bytes(data):
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """The masked CRC-32C that TFRecord framing stores (a CRC of data holding CRCs stays useful)."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame_record(data: bytes) -> bytes:
    """One TFRecord: length, masked CRC of the length, the data, masked CRC of the data."""
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))
