"""BPE training, round trips, and the committed tokenizer the presets are sized by."""

from engine.config import preset
from engine.tokenizer import SPECIALS, Tokenizer, load_tokenizer, train_bpe

TEXT = ["def foo(bar):\n    return bar + 1\n", "def foo_bar(baz):\n    return baz * 2\n"] * 20


def test_round_trip_any_text_including_unseen_bytes(tmp_path):
    tok = Tokenizer(train_bpe(TEXT, 20), ["<bos>", "<eos>"])
    for text in TEXT + ["émoji 🚀 and tabs\t\tx", ""]:
        assert tok.decode(tok.encode(text)) == text
    path = tmp_path / "tok.json"
    tok.save(path)
    again = Tokenizer.load(path)
    assert again.encode(TEXT[0]) == tok.encode(TEXT[0]) and again.specials == tok.specials


def test_merges_compress_frequent_words_and_ids_are_dense():
    merges = train_bpe(TEXT, 20)
    tok = Tokenizer(merges, ["<bos>", "<eos>"])
    assert len(merges) == 20 and len(set(merges)) == 20
    assert len(tok.encode(TEXT[0])) < len(TEXT[0].encode()) / 2
    assert tok.specials == {"<bos>": 276, "<eos>": 277} and tok.vocab_size == 278
    assert max(t for text in TEXT for t in tok.encode(text)) < 276


def test_most_frequent_pair_is_merged_first():
    merges = train_bpe(["aaab"] * 3 + ["cd"], 1)
    assert merges == [(ord("a"), ord("a"))]


def test_committed_tokenizer_sizes_the_presets_and_compresses_code():
    tok = load_tokenizer()
    assert [tok.bos_id, tok.eos_id, tok.mask_id, tok.pad_id] == list(range(tok.vocab_size - 4, tok.vocab_size))
    assert list(tok.specials) == list(SPECIALS)
    for name in ("tiny", "small"):
        assert preset(name).model.vocab_size == tok.vocab_size
        assert preset(name).drafter.mask_token_id == tok.mask_id
    code = "    def __init__(self, name):\n        self.name = name\n        return None\n"
    assert tok.decode(tok.encode(code)) == code and len(tok.encode(code)) < len(code) / 2.5
    assert tok.provenance["command"].startswith("python -m engine train-tokenizer")
    assert tok.provenance["corpus"]["split"] == "train"
