"""Shared tiny models: seeded random target and drafter (built once per test session)."""

import pytest

from engine.config import preset
from engine.drafter import build_drafter
from engine.model import build_target


@pytest.fixture(scope="session")
def tiny():
    p = preset("tiny")
    return build_target(p.model, seed=0), build_drafter(p.drafter, p.model, seed=1)
