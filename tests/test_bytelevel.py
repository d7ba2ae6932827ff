"""Which tokenizers the tiktoken conversion takes: the settings checked up front agree with the conversion's."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from arrowstream.testing.data import sample_tokenizer
from arrowstream.tokenize.bytelevel import Unconvertible, _settings, check_bytelevel, to_bytelevel_bpe


def _copy() -> Tokenizer:
    return Tokenizer.from_str(sample_tokenizer(300).to_str())


def _with(change: Callable[[Tokenizer], None]) -> Callable[[], Tokenizer]:
    def make() -> Tokenizer:
        tok = _copy()
        change(tok)
        return tok

    return make


def _model(**options: object) -> Callable[[], Tokenizer]:
    def make() -> Tokenizer:
        tok = _copy()
        tok.model = models.BPE(tok.get_vocab(with_added_tokens=False), [], **options)  # the merges do not matter here
        return tok

    return make


SPLIT = pre_tokenizers.Split(pattern=Regex(r"\s+|\w+|[^\w\s]+"), behavior="isolated")

VARIANTS: dict[str, Callable[[], Tokenizer]] = {
    "plain": _copy,
    "nfkc": _with(lambda t: setattr(t, "normalizer", normalizers.NFKC())),
    "empty normalizer sequence": _with(lambda t: setattr(t, "normalizer", normalizers.Sequence([]))),
    "lowercase sequence": _with(lambda t: setattr(t, "normalizer", normalizers.Sequence([normalizers.Lowercase()]))),
    "dropout": _model(dropout=0.1),
    "no dropout, rebuilt": _model(),
    "continuing subword prefix": _model(continuing_subword_prefix="##"),
    "end of word suffix": _model(end_of_word_suffix="</w>"),
    "byte fallback": _model(byte_fallback=True),
    "word level": _with(lambda t: setattr(t, "model", models.WordLevel({"a": 0}, unk_token="a"))),
    "metaspace": _with(lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Metaspace())),
    "whitespace": _with(lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Whitespace())),
    "no pre-tokenizer": _with(lambda t: setattr(t, "pre_tokenizer", None)),
    "prefix space": _with(lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.ByteLevel(add_prefix_space=True))),
    "no regex": _with(lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))),
    "split then byte level": _with(lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Sequence(
        [SPLIT, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))),
    "split then byte level with regex": _with(lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Sequence(
        [SPLIT, pre_tokenizers.ByteLevel(add_prefix_space=False)]))),
    "lstrip token": _with(lambda t: t.add_tokens([AddedToken("<|x|>", lstrip=True)])),
    "single word token": _with(lambda t: t.add_special_tokens([AddedToken("<|y|>", single_word=True)])),
    "prefix tokens": _with(lambda t: t.add_special_tokens(["<|ab", "<|abc|>"])),
    "mixed normalized": _with(lambda t: t.add_tokens([AddedToken("xy", normalized=True), AddedToken("yz", normalized=False)])),
    "bos template": _with(lambda t: setattr(t, "post_processor", processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)]))),
    "pair template": _with(lambda t: setattr(t, "post_processor", processors.TemplateProcessing(
        single="$A <|endoftext|> <|endoftext|>", special_tokens=[("<|endoftext|>", 0)]))),
    "roberta": _with(lambda t: setattr(t, "post_processor", processors.RobertaProcessing(("</s>", 1), ("<s>", 2)))),
    "byte level post": _with(lambda t: setattr(t, "post_processor", processors.ByteLevel())),
    "decoder only": _with(lambda t: setattr(t, "decoder", decoders.ByteLevel())),
}


def _refusal(run: Callable[[], object]) -> str | None:
    try:
        run()
    except Unconvertible as exc:
        return exc.reason
    return None


@pytest.mark.parametrize("add_special_tokens", [True, False])
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_the_settings_checked_up_front_refuse_as_the_conversion_does(name: str, add_special_tokens: bool) -> None:
    tok = VARIANTS[name]()
    full = _refusal(lambda: _settings(tok, add_special_tokens))  # from the tokenizer's whole JSON
    assert _refusal(lambda: check_bytelevel(tok, add_special_tokens=add_special_tokens)) == full
    if full is not None:
        assert _refusal(lambda: to_bytelevel_bpe(tok, add_special_tokens=add_special_tokens)) == full


def test_the_variants_cover_both_answers() -> None:
    refused = {name for name, make in VARIANTS.items() if _refusal(lambda: check_bytelevel(make())) is not None}
    assert {"nfkc", "dropout", "word level", "prefix space", "lstrip token", "metaspace"} <= refused
    assert {"plain", "empty normalizer sequence", "split then byte level", "decoder only"}.isdisjoint(refused)


def test_a_token_made_by_two_merges_is_refused_naming_them() -> None:
    from .test_encoders import hand_made

    twice = hand_made([("a", "b"), ("b", "c"), ("ab", "c"), ("a", "bc")], ignore_merges=False)
    with pytest.raises(Unconvertible, match=r"token 'abc' is made by two merges \(\('ab', 'c'\) and \('a', 'bc'\)\)"):
        to_bytelevel_bpe(twice)
