"""BPE training and round trips."""

from engine.bpe import BPETokenizer, train_bpe

TEXT = ["def foo(bar):\n    return bar + 1\n", "def foo_bar(baz):\n    return baz * 2\n"] * 20


def test_round_trip_any_text_including_unseen_bytes(tmp_path):
    tok = BPETokenizer(train_bpe(TEXT, 20), ["<bos>", "<eos>"])
    for text in TEXT + ["émoji 🚀 and tabs\t\tx", ""]:
        assert tok.decode(tok.encode(text)) == text
    path = tmp_path / "tok.json"
    tok.save(path)
    again = BPETokenizer.load(path)
    assert again.encode(TEXT[0]) == tok.encode(TEXT[0]) and again.specials == tok.specials


def test_merges_compress_frequent_words_and_ids_are_dense():
    merges = train_bpe(TEXT, 20)
    tok = BPETokenizer(merges, ["<bos>", "<eos>"])
    assert len(merges) == 20 and len(set(merges)) == 20
    assert len(tok.encode(TEXT[0])) < len(TEXT[0].encode()) / 2
    assert tok.specials == {"<bos>": 276, "<eos>": 277} and tok.vocab_size == 278
    assert max(t for text in TEXT for t in tok.encode(text)) < 276


def test_most_frequent_pair_is_merged_first():
    merges = train_bpe(["aaab"] * 3 + ["cd"], 1)
    assert merges == [(ord("a"), ord("a"))]
