"""Which NVTX ranges are steps and stages: the engine's own contract, or a user's `--stage-map FILE`.

The analysis never names `ddtree` or a stage string itself; it asks a StageMap. The default map
is built from engine/stages.py (the contract the engine emits). A stage-map file lets the toolkit
read other engines' traces (e.g. SGLang's ranges) by mapping their range names onto the six
stages and `step`, in JSON or TOML:

    domain = "sglang"            # optional: only ranges and marks of this NVTX domain; absent: any
    tokens = "tokens"            # optional: the mark whose integer payload counts tokens
    [ranges]                     # range name -> step or one of the six stages
    decode_step = "step"
    draft_extend = "draft"
    target_verify = "verify"
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ddprof.errors import DdprofError
from engine.stages import DOMAIN, STAGES, STEP, TOKENS_MARK

TARGETS = (STEP, *STAGES)


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """json.loads keeps the last of repeated keys; a stage map naming a range twice is a mistake
    (TOML refuses it too)."""
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise _DuplicateKey(f"{key!r} appears twice")
        seen[key] = value
    return seen


@dataclass(frozen=True)
class StageMap:
    """domain: the NVTX domain read (None: every domain); ranges: range name -> STEP or a stage;
    tokens: the mark name whose payloads are generated tokens; source: the file, None for the default."""

    domain: str | None
    ranges: dict[str, str]
    tokens: str = TOKENS_MARK
    source: Path | None = field(default=None, compare=False)

    @classmethod
    def default(cls) -> StageMap:
        return cls(DOMAIN, {name: name for name in TARGETS})

    @classmethod
    def from_file(cls, path: Path) -> StageMap:
        path = Path(path)
        if not path.is_file():
            raise DdprofError(f"{path}: stage map not found")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise DdprofError(f"{path}: cannot read stage map ({getattr(exc, 'strerror', None) or exc})") from None
        try:
            data = tomllib.loads(text) if path.suffix.lower() == ".toml" else json.loads(text, object_pairs_hook=_unique_keys)
        except (tomllib.TOMLDecodeError, json.JSONDecodeError, _DuplicateKey, RecursionError) as exc:
            kind = "TOML" if path.suffix.lower() == ".toml" else "JSON"
            raise DdprofError(f"{path}: stage map is not valid {kind} ({exc})") from None
        if not isinstance(data, dict):
            raise DdprofError(f"{path}: stage map must be an object with a `ranges` table")
        unknown = set(data) - {"domain", "tokens", "ranges"}
        if unknown:
            raise DdprofError(f"{path}: unknown stage map keys {sorted(unknown)} (allowed: domain, tokens, ranges)")
        ranges = data.get("ranges")
        if not isinstance(ranges, dict) or not ranges:
            raise DdprofError(f"{path}: stage map needs a `ranges` table mapping range names to step or a stage")
        for name, target in ranges.items():
            if target not in TARGETS:
                raise DdprofError(f"{path}: range {name!r} maps to {target!r}, not one of {', '.join(TARGETS)}")
        if STEP not in ranges.values():
            raise DdprofError(f"{path}: stage map maps no range to {STEP!r}; steps are what the analysis counts")
        if not set(ranges.values()) & set(STAGES):
            raise DdprofError(f"{path}: stage map maps no range to a stage ({', '.join(STAGES)}); "
                              "there would be nothing to attribute")
        if data.get("domain") is not None and not isinstance(data["domain"], str):  # null: any domain
            raise DdprofError(f"{path}: stage map `domain` must be a string (or null: any domain)")
        if "tokens" in data and not isinstance(data["tokens"], str):
            raise DdprofError(f"{path}: stage map `tokens` must be a string")
        return cls(data.get("domain"), dict(ranges), data.get("tokens", TOKENS_MARK), path)

    def describe(self) -> str:
        """How error messages name what was looked for."""
        where = f"NVTX domain {self.domain!r}" if self.domain is not None else "any NVTX domain"
        return where + (f" (stage map {self.source})" if self.source else "")
