"""The engine's tokenizer: bytes for now (a trained BPE with the same interface comes later).

`Tokenizer` is the interface the engine and the serving code rely on; `ByteTokenizer` implements
it with ids 0..255 = UTF-8 bytes, then four specials. `mask_id` is the drafter's MASK token.
"""

from __future__ import annotations

from typing import Protocol


class Tokenizer(Protocol):
    vocab_size: int
    bos_id: int
    eos_id: int
    mask_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    n_bytes = 256
    bos_id = 256
    eos_id = 257
    mask_id = 258
    pad_id = 259
    vocab_size = 260

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < self.n_bytes).decode("utf-8", errors="replace")


def load_tokenizer() -> Tokenizer:
    """The default tokenizer (the byte tokenizer until a trained one exists)."""
    return ByteTokenizer()
