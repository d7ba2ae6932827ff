"""Checks and lookups on a ``tokenizers.Tokenizer`` before it tokenizes anything.

A tokenizer with padding or truncation enabled is refused (ids would depend on
the batch, or documents would lose tokens silently), and the end-of-text id is
found by the usual names among the special tokens.
"""

from __future__ import annotations

from tokenizers import Tokenizer

from arrowstream.errors import ConfigError

__all__ = ["check_tokenizer", "find_eos_id"]

_EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[EOS]", "<|im_end|>")


def find_eos_id(tokenizer: Tokenizer) -> int | None:
    """Return the id of the tokenizer's end-of-text special token, or ``None``.

    Looks for the usual names (``<|endoftext|>``, ``</s>``, ``<eos>``, ...)
    among the special tokens; any other name needs an explicit ``eos_id``.
    """
    specials = _special_tokens(tokenizer)
    for name in _EOS_NAMES:
        if name in specials:
            return specials[name]
    return None


def _special_tokens(tokenizer: Tokenizer) -> dict[str, int]:
    return {
        tok.content: idx
        for idx, tok in tokenizer.get_added_tokens_decoder().items()
        if tok.special
    }


def check_tokenizer(tokenizer: Tokenizer) -> None:
    """Refuse settings that make ids depend on batching or cut documents silently.

    Raises
    ------
    ConfigError
        Padding is enabled (ids would depend on which documents share a
        batch) or truncation is enabled (documents would lose tokens silently).
    """
    if tokenizer.padding is not None:
        raise ConfigError(
            "the tokenizer has padding enabled, which makes a document's ids depend on the "
            "other documents encoded with it: call `tokenizer.no_padding()` (packing pads for you)"
        )
    if tokenizer.truncation is not None:
        raise ConfigError(
            f"the tokenizer truncates to {tokenizer.truncation.get('max_length')} tokens, which "
            "would cut documents silently: call `tokenizer.no_truncation()` (packing splits long "
            "documents across rows)"
        )
