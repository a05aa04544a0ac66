"""release_memory hands freed heap pages back to the OS (the training memory check reads the host's
available memory, which pages glibc keeps after a model is freed do not count as)."""

from __future__ import annotations

import psutil

from traceops.memory import release_memory


def test_freed_heap_pages_return_to_the_os():
    process = psutil.Process()
    # Many small blocks (below glibc's mmap threshold) come from the heap, where free() keeps them.
    blocks = [bytearray(32 * 1024) for _ in range(12_000)]  # ~375 MiB
    for block in blocks:
        block[::4096] = b"x" * len(block[::4096])  # touch every page
    held = process.memory_info().rss
    del blocks
    release_memory()
    after = process.memory_info().rss
    assert held - after > 200 * 2**20, (held, after)
