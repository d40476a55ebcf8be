"""The engine's tokenizer: a byte-level BPE trained by the project, stored as one small JSON file.

Ids 0..255 are raw bytes (so any text encodes), then one id per learned merge, then the special
tokens `<bos>`, `<eos>`, `<mask>` (the DFlash drafter's MASK input) and `<pad>`. Text is first split
into words (a letter run, a digit run, a punctuation run, each with at most one leading space, or
a whitespace run) so merges never cross word boundaries; indentation runs in source code become
single tokens.

The committed tokenizer (`engine/assets/tokenizer.json`) is trained on the corpus's train split by

    python -m engine train-tokenizer          # 764 merges -> vocabulary 1024

and records that command and the corpus inside the file. Every preset's `vocab_size` and the
drafter's `mask_token_id` come from it (engine/config.py).
"""

from __future__ import annotations

import argparse
import functools
import heapq
import json
import re
import time
from collections import Counter, defaultdict
from pathlib import Path

from engine import arguments
from engine.errors import EngineError

ASSET = Path(__file__).parent / "assets" / "tokenizer.json"
SPECIALS = ("<bos>", "<eos>", "<mask>", "<pad>")
DEFAULT_MERGES = 764  # 256 bytes + 764 merges + 4 specials = 1024 ids
WORD = re.compile(rb" ?[A-Za-z_]+| ?[0-9]+| ?[^\sA-Za-z_0-9]+|\s+(?!\S)|\s+")


def _words(text: str) -> list[bytes]:
    # surrogateescape: text from argv that was not UTF-8 holds its raw bytes as surrogates; a byte-level
    # tokenizer takes those bytes as they are.
    return WORD.findall(text.encode("utf-8", "surrogateescape"))


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


class Tokenizer:
    """encode/decode with learned merges; special tokens follow the merges in id order."""

    def __init__(self, merges: list[tuple[int, int]], specials: list[str] = SPECIALS, provenance: dict | None = None):
        self.merges = [tuple(m) for m in merges]
        self.rank = {pair: i for i, pair in enumerate(self.merges)}
        self.bytes_of = [bytes([i]) for i in range(256)]
        for a, b in self.merges:
            self.bytes_of.append(self.bytes_of[a] + self.bytes_of[b])
        self.specials = {name: len(self.bytes_of) + i for i, name in enumerate(specials)}
        self.vocab_size = len(self.bytes_of) + len(specials)
        self.provenance = provenance or {}  # how the file was made: command, corpus
        self._cache: dict[bytes, list[int]] = {}

    def _special(self, name: str) -> int:
        if name not in self.specials:
            raise EngineError(f"tokenizer has no {name} token (specials: {', '.join(self.specials)})")
        return self.specials[name]

    @property
    def bos_id(self) -> int:
        return self._special("<bos>")

    @property
    def eos_id(self) -> int:
        return self._special("<eos>")

    @property
    def mask_id(self) -> int:
        return self._special("<mask>")

    @property
    def pad_id(self) -> int:
        return self._special("<pad>")

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
        """Text of the byte and merge ids; special tokens are dropped."""
        n = len(self.bytes_of)
        return b"".join(self.bytes_of[i] for i in ids if i < n).decode("utf-8", errors="replace")

    def save(self, path: Path) -> None:
        names = sorted(self.specials, key=self.specials.get)
        Path(path).write_text(json.dumps({"provenance": self.provenance, "specials": names, "merges": self.merges}))

    @classmethod
    def load(cls, path: Path) -> Tokenizer:
        try:
            data = json.loads(Path(path).read_text())
            return cls([tuple(m) for m in data["merges"]], data["specials"], data.get("provenance"))
        except FileNotFoundError:
            raise EngineError(f"{path}: tokenizer file not found (python -m engine train-tokenizer writes it)"
                              ) from None
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise EngineError(f"{path}: not a tokenizer file ({type(e).__name__}: {e})") from None


@functools.cache
def load_tokenizer() -> Tokenizer:
    """The committed tokenizer every preset, workload and training run uses."""
    return Tokenizer.load(ASSET)


def register(subcommands) -> None:
    parser = subcommands.add_parser("train-tokenizer", help="train the engine's BPE tokenizer on the corpus",
                                    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--merges", type=int, default=DEFAULT_MERGES, help=f"BPE merges (default {DEFAULT_MERGES})")
    parser.add_argument("--out", type=Path, default=ASSET, help="where to write the JSON (default: the committed one)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from engine import corpus

    if args.merges < 0:
        raise EngineError(f"--merges must be >= 0 (got {args.merges})")
    arguments.output_file(args.out, "--out")
    start = time.perf_counter()
    texts = [corpus.text_of(path) for path in corpus.files("train")]
    merges = train_bpe(texts, args.merges)
    provenance = {"command": args.command_line, "corpus": corpus.describe("train")}
    tokenizer = Tokenizer(merges, SPECIALS, provenance)
    tokenizer.save(args.out)
    chars = sum(len(t) for t in texts)
    tokens = sum(len(tokenizer.encode(t)) for t in texts)
    print(f"wrote {args.out}: vocabulary {tokenizer.vocab_size}, {chars / tokens:.2f} characters per token "
          f"on the train split, {time.perf_counter() - start:.1f} s")
    return 0
