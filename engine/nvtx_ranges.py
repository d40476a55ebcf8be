"""NVTX ranges and marks in the engine's domain, switchable off (to measure what they cost).

Every range and mark the engine emits goes through here, with the names of engine/stages.py,
so the contract ddprof relies on lives in one place.
"""

from __future__ import annotations

from contextlib import contextmanager

import nvtx

from engine.stages import DOMAIN


class Nvtx:
    def __init__(self, enabled: bool = True):
        self.enabled = enabled

    @contextmanager
    def range(self, name: str):
        """A push/pop range on the calling thread (nothing at all when disabled)."""
        if not self.enabled:
            yield
            return
        nvtx.push_range(name, domain=DOMAIN)
        try:
            yield
        finally:
            nvtx.pop_range(domain=DOMAIN)

    def mark(self, name: str, payload: int) -> None:
        if self.enabled:
            nvtx.mark(name, payload=int(payload), domain=DOMAIN)
