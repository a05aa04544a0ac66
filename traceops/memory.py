"""Hand memory a finished model freed back to the operating system.

CPython frees a model's tensors when its last reference goes, but glibc keeps the freed heap pages in
the process, so the host's available memory (what the training memory check and other processes see)
stays low after each adapter: a night that trained two adapters looked 8 GiB short to the third one's
check. ``release_memory`` collects garbage, empties the accelerator cache and asks glibc to return its
free pages (``malloc_trim``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys


def release_memory() -> None:
    """Collect unreachable objects, empty torch's CUDA cache (when torch is loaded and a GPU is
    present) and return free heap pages to the OS where the C library can (glibc's ``malloc_trim``)."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
    name = ctypes.util.find_library("c")
    if name is None:
        return
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return
    trim(0)
