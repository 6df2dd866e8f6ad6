"""UTF-8 decoding of corpus bytes with errors that name the file and the byte offset."""

from __future__ import annotations

from pathlib import Path


def decode_utf8(data: bytes, path: str | Path, offset: int, errors: str, fix: str) -> str:
    """data.decode('utf-8', errors); on failure a ValueError naming the bad byte, its absolute offset
    (`offset` = where `data` starts in the file) and `fix`."""
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{path} is not valid UTF-8: byte 0x{data[exc.start]:02x} at byte offset {offset + exc.start} "
            f"({exc.reason}); fix the file or {fix}"
        ) from None
