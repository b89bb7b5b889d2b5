"""Shelf copies (``artifacts.atomic.clone_file``): a large file is byte-copied with O_DIRECT writes, the last partial
block through the page cache; the copy is the source byte for byte at every size around the alignment and chunk
edges, and a filesystem that refuses O_DIRECT gets the ordinary copy."""
import os

import pytest

from omni_export.artifacts import atomic


@pytest.mark.parametrize("size", [0, 100, 4096, 3 * 4096 + 17, (8 << 20) + 5, 2 * (8 << 20)])
def test_direct_copy_is_the_source_byte_for_byte(tmp_path, monkeypatch, size):
    monkeypatch.setattr(atomic, "DIRECT_COPY_MIN", 0)
    src, dst = tmp_path / "a.bin", tmp_path / "b.bin"
    src.write_bytes(os.urandom(size))
    used = []
    direct = atomic._copy_direct
    monkeypatch.setattr(atomic, "_copy_direct", lambda s, d: used.append(1) or direct(s, d))
    atomic.clone_file(src, dst)
    assert dst.read_bytes() == src.read_bytes() and used == [1]


def test_a_filesystem_without_o_direct_gets_the_ordinary_copy(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic, "DIRECT_COPY_MIN", 0)
    src, dst = tmp_path / "a.bin", tmp_path / "b.bin"
    src.write_bytes(os.urandom(3 * 4096 + 1))
    opened = os.open

    def no_direct(path, flags, *a):
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(22, "Invalid argument")
        return opened(path, flags, *a)
    monkeypatch.setattr(atomic.os, "open", no_direct)
    assert atomic._copy_direct(src, dst) is False
    atomic.clone_file(src, dst)
    assert dst.read_bytes() == src.read_bytes()
