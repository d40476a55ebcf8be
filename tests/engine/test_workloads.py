"""Workload generators: reproducible, lengths as documented, prompts that are real stdlib text."""

import statistics

import pytest

from engine.errors import EngineError
from engine.tokenizer import load_tokenizer
from engine.corpus import stdlib_files
from engine.workloads import WORKLOADS, _text_of, generate

TOKENIZER = load_tokenizer()


def test_same_seed_same_requests_other_seed_other_requests():
    first = generate("chat", 20, seed=7, tokenizer=TOKENIZER)
    assert first == generate("chat", 20, seed=7, tokenizer=TOKENIZER)
    other = generate("chat", 20, seed=8, tokenizer=TOKENIZER)
    assert [r.prompt_tokens for r in first] != [r.prompt_tokens for r in other]
    assert [r.request_id for r in first] == list(range(20))


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_lengths_follow_the_documented_distribution(name):
    spec = WORKLOADS[name]
    requests = generate(name, 300, seed=0, tokenizer=TOKENIZER)
    prompts = [len(r.prompt_tokens) for r in requests]
    answers = [r.max_new_tokens for r in requests]
    assert spec.prompt.lo <= min(prompts) and max(prompts) <= spec.prompt.hi
    assert spec.answer.lo <= min(answers) and max(answers) <= spec.answer.hi
    for drawn, dist in ((prompts, spec.prompt), (answers, spec.answer)):
        if dist.sigma == 0:
            assert set(drawn) == {dist.median}
        else:  # a log-normal's median is exp(mu); clipping leaves the middle alone
            assert abs(statistics.median(drawn) / dist.median - 1) < 0.15
            assert len(set(drawn)) > 20


def test_max_new_tokens_rescales_answers_and_sets_fixed_ones():
    scaled = generate("chat", 100, seed=0, tokenizer=TOKENIZER, max_new_tokens=24)
    full = generate("chat", 100, seed=0, tokenizer=TOKENIZER)
    hi = WORKLOADS["chat"].answer.hi
    assert [r.max_new_tokens for r in scaled] == [max(1, round(r.max_new_tokens * 24 / hi)) for r in full]
    assert max(r.max_new_tokens for r in scaled) <= 24 and len({r.max_new_tokens for r in scaled}) > 5
    assert [r.prompt_tokens for r in scaled] == [r.prompt_tokens for r in full]
    assert {r.max_new_tokens for r in generate("fixed", 10, seed=0, tokenizer=TOKENIZER, max_new_tokens=7)} == {7}


@pytest.mark.parametrize("name, kind", [("code", "source"), ("chat", "docstrings")])
def test_prompts_are_real_standard_library_text(name, kind):
    corpus = "\n\n".join(_text_of(path, kind) for path in stdlib_files())
    for request in generate(name, 8, seed=3, tokenizer=TOKENIZER):
        assert request.prompt_tokens[0] == TOKENIZER.bos_id
        text = TOKENIZER.decode(request.prompt_tokens[1:]).rstrip("\ufffd")  # a cut may split a UTF-8 char
        assert len(text) > 10 and text in corpus


def test_unknown_workload_is_an_engine_error():
    with pytest.raises(EngineError, match="unknown workload 'nope'; choose one of chat, code, long-context, fixed"):
        generate("nope", 1, seed=0, tokenizer=TOKENIZER)
