"""Shared tiny models (built once per test session): a seeded random target and drafter, whose drafts
are almost never accepted, and the committed trained pair, whose drafts often are."""

import pytest

from engine.config import preset
from engine.drafter import build_drafter
from engine.generate import load_models
from engine.model import build_target


@pytest.fixture(scope="session")
def tiny():
    p = preset("tiny")
    return build_target(p.model, seed=0), build_drafter(p.drafter, p.model, seed=1)


@pytest.fixture(scope="session")
def trained():
    return load_models("tiny", seed=0, device="cpu")
