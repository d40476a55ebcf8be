"""Byte-level BPE: trained by the project on text every machine has, saved as one small JSON file.

Ids 0..255 are raw bytes (so any text encodes), then one id per learned merge, then the special
tokens. Text is first split into words (a letter run, a digit run, a punctuation run, each with at
most one leading space, or a whitespace run) so merges never cross word boundaries; indentation
runs in source code become single tokens.
"""

from __future__ import annotations

import heapq
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

WORD = re.compile(rb" ?[A-Za-z_]+| ?[0-9]+| ?[^\sA-Za-z_0-9]+|\s+(?!\S)|\s+")


def _words(text: str) -> list[bytes]:
    return WORD.findall(text.encode("utf-8"))


def train_bpe(texts, n_merges: int) -> list[tuple[int, int]]:
    """Learn `n_merges` merges, most frequent adjacent pair first (ties: smallest pair ids)."""
    counts = Counter(w for text in texts for w in _words(text))
    words = [list(w) for w in counts]
    freq = list(counts.values())
    pair_count: Counter = Counter()
    where: dict[tuple[int, int], set[int]] = defaultdict(set)
    for i, symbols in enumerate(words):
        for pair in zip(symbols, symbols[1:]):
            pair_count[pair] += freq[i]
            where[pair].add(i)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    merges = []
    while heap and len(merges) < n_merges:
        neg, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -neg or -neg == 0:
            continue  # stale entry: the count changed since it was pushed
        new_id = 256 + len(merges)
        merges.append(pair)
        changed = set()
        for i in list(where.pop(pair, ())):
            old = words[i]
            for p in zip(old, old[1:]):
                pair_count[p] -= freq[i]
                changed.add(p)
            merged, j = [], 0
            while j < len(old):
                if j + 1 < len(old) and (old[j], old[j + 1]) == pair:
                    merged.append(new_id)
                    j += 2
                else:
                    merged.append(old[j])
                    j += 1
            words[i] = merged
            for p in zip(merged, merged[1:]):
                pair_count[p] += freq[i]
                where[p].add(i)
                changed.add(p)
        pair_count.pop(pair, None)
        for p in changed - {pair}:
            if pair_count[p] > 0:
                heapq.heappush(heap, (-pair_count[p], p))
    return merges


class BPETokenizer:
    """encode/decode with learned merges; special tokens follow the merges in id order."""

    def __init__(self, merges: list[tuple[int, int]], specials: list[str]):
        self.merges = [tuple(m) for m in merges]
        self.rank = {pair: i for i, pair in enumerate(self.merges)}
        self.bytes_of = [bytes([i]) for i in range(256)]
        for a, b in self.merges:
            self.bytes_of.append(self.bytes_of[a] + self.bytes_of[b])
        self.specials = {name: len(self.bytes_of) + i for i, name in enumerate(specials)}
        self.vocab_size = len(self.bytes_of) + len(specials)
        self._cache: dict[bytes, list[int]] = {}

    def _encode_word(self, word: bytes) -> list[int]:
        cached = self._cache.get(word)
        if cached is not None:
            return cached
        symbols = list(word)
        while len(symbols) > 1:
            ranked = [(self.rank.get(p, len(self.rank)), j) for j, p in enumerate(zip(symbols, symbols[1:]))]
            best, j = min(ranked)
            if best == len(self.rank):
                break
            symbols[j:j + 2] = [256 + best]
        self._cache[word] = symbols
        return symbols

    def encode(self, text: str) -> list[int]:
        return [t for w in _words(text) for t in self._encode_word(w)]

    def decode(self, ids) -> str:
        n = len(self.bytes_of)
        return b"".join(self.bytes_of[i] for i in ids if i < n).decode("utf-8", errors="replace")

    def save(self, path: Path) -> None:
        names = sorted(self.specials, key=self.specials.get)
        Path(path).write_text(json.dumps({"merges": self.merges, "specials": names}))

    @classmethod
    def load(cls, path: Path) -> BPETokenizer:
        data = json.loads(Path(path).read_text())
        return cls([tuple(m) for m in data["merges"]], data["specials"])
