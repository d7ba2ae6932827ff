"""Checks and lookups on a ``tokenizers.Tokenizer`` before it tokenizes anything.

A tokenizer with padding or truncation enabled is refused (ids would depend on
the batch, or documents would lose tokens silently), and the end-of-text id is
found by the usual names among the special tokens.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from typing import Any

from tokenizers import Tokenizer

from arrowstream.errors import ConfigError

__all__ = [
    "check_tokenizer", "find_eos_id", "largest_id_past", "load_tokenizer", "no_eos_message", "refuse_settings",
    "tokenizer_file", "tokenizer_hash",
]

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


def largest_id_past(tokenizer: Tokenizer, token_id: int) -> int | None:
    """Return the tokenizer's largest id when ``token_id`` is past it, else ``None``.

    Ids may have gaps, so the entry count is only a fast lower bound of the
    largest id plus one; the vocabulary is read only past it.

    Examples
    --------
    >>> from tokenizers import Tokenizer, models
    >>> tok = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 5}, unk_token="[UNK]"))
    >>> largest_id_past(tok, 5) is None, largest_id_past(tok, 6)
    (True, 5)
    """
    if token_id < tokenizer.get_vocab_size(with_added_tokens=True):
        return None
    top = max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1)
    return top if token_id > top else None


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
    truncation = tokenizer.truncation
    refuse_settings(
        padding=tokenizer.padding is not None,
        truncation=None if truncation is None else int(truncation.get("max_length") or 0),
    )


def refuse_settings(*, padding: bool, truncation: int | None) -> None:
    """Raise :class:`~arrowstream.errors.ConfigError` for padding, or for truncation (to ``truncation`` tokens); see :func:`check_tokenizer`."""
    if padding:
        raise ConfigError(
            "the tokenizer has padding enabled, which makes a document's ids depend on the "
            "other documents encoded with it: call `tokenizer.no_padding()` (packing pads for you)"
        )
    if truncation is not None:
        raise ConfigError(
            f"the tokenizer truncates to {truncation} tokens, which would cut documents silently: "
            "call `tokenizer.no_truncation()` (packing splits long documents across rows)"
        )


def tokenizer_hash(tokenizer: Tokenizer) -> str:
    """Return a short hash of the tokenizer's full JSON (vocabulary, merges, settings).

    A post-processor that adds nothing to a single sequence (a template of
    just ``$A`` and no special tokens, which transformers adds when it loads
    a tokenizer.json without one) counts as none: the same tokenizer, loaded
    by transformers or not, has one hash, so states, token caches and length
    indexes carry over.

    Examples
    --------
    >>> from arrowstream.testing.data import sample_tokenizer
    >>> len(tokenizer_hash(sample_tokenizer(300)))
    32
    """
    text = tokenizer.to_str()
    if '"post_processor":{"type":"TemplateProcessing"' in text.replace(" ", "") and _noop_template(text):
        plain = Tokenizer.from_str(text)
        plain.post_processor = None
        text = plain.to_str()
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _noop_template(text: str) -> bool:
    """Whether the tokenizer's post-processor is a template that adds nothing to one sequence."""
    post = json.loads(text).get("post_processor") or {}
    return (
        post.get("type") == "TemplateProcessing"
        and post.get("single") == [{"Sequence": {"id": "A", "type_id": 0}}]
        and not post.get("special_tokens")
    )


def load_tokenizer(tokenizer: Tokenizer | Any | str | os.PathLike[str]) -> Tokenizer:
    """Return ``tokenizer`` itself (an :class:`~arrowstream.tokenize.encoders.Encoder`'s tokenizer, a transformers fast tokenizer's backend), or load it from a ``tokenizer.json`` path.

    A transformers ``PreTrainedTokenizerFast`` is used through its
    ``backend_tokenizer``, which holds its special-token settings (the
    post-processor that adds BOS, for example); a directory it was saved to
    (``save_pretrained``) through the ``tokenizer.json`` in it. A path gives
    a new object at every call (pipelines share one per file:
    :class:`~arrowstream.tokenize.source.TokenizerSource`).

    Raises
    ------
    ConfigError
        The path does not exist or is not a tokenizers JSON file.

    Examples
    --------
    >>> from arrowstream.testing.data import sample_tokenizer
    >>> tok = sample_tokenizer(300)
    >>> load_tokenizer(tok) is tok
    True
    """
    from arrowstream.tokenize.encoders import Encoder  # which imports this module

    if isinstance(tokenizer, Encoder):
        return tokenizer.tokenizer
    return _load_tokenizer(tokenizer)


def _load_tokenizer(tokenizer: Tokenizer | str | os.PathLike[str] | Any) -> Tokenizer:
    """Return ``tokenizer`` (or its ``tokenizers`` core), or load it from a path; see :func:`load_tokenizer`."""
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if isinstance(backend, Tokenizer):  # a transformers fast tokenizer: its `tokenizers` core
        return backend
    if hasattr(tokenizer, "convert_tokens_to_ids") and hasattr(tokenizer, "vocab_size"):
        raise ConfigError(
            f"{type(tokenizer).__name__} is a slow transformers tokenizer (no `tokenizers` backend): "
            "load the fast one (`AutoTokenizer.from_pretrained(..., use_fast=True)`), or pass the "
            "path of its tokenizer.json"
        )
    if isinstance(tokenizer, (str, os.PathLike)):
        path = tokenizer_file(os.fspath(tokenizer))
        try:
            return Tokenizer.from_file(path)
        except Exception as exc:  # tokenizers raises a bare Exception on bad JSON
            raise ConfigError(f"cannot load tokenizer {path!r}: {exc}") from exc
    raise ConfigError(
        "`tokenizer` must be a tokenizers.Tokenizer, a transformers fast tokenizer, a path to a "
        f"tokenizer.json, or None for a column of token ids; got {type(tokenizer).__name__!r}"
    )


def tokenizer_file(path: str) -> str:
    """Return the ``tokenizer.json`` that ``path`` names: itself, or the one in a directory a fast tokenizer was saved to.

    Raises
    ------
    ConfigError
        There is no such file.
    """
    if os.path.isdir(path):
        inside = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(inside):
            raise ConfigError(
                f"tokenizer {path!r} is a directory without a tokenizer.json: pass the path of "
                "the tokenizer.json file (a fast tokenizer saves one), or a `tokenizers.Tokenizer`"
            )
        return inside
    if not os.path.isfile(path):
        raise ConfigError(
            f"tokenizer file {path!r} does not exist: pass the path of a `tokenizer.json` "
            "saved by the `tokenizers` library, or a `tokenizers.Tokenizer`"
        )
    return path


def no_eos_message(specials: Iterable[str] | None, column: str) -> str:
    """What to do when ``add_eos=True`` finds no EOS id among the tokenizer's ``specials`` (``None``: no tokenizer, the column must hold token ids).

    Examples
    --------
    >>> print(no_eos_message(None, "text"))  # doctest: +ELLIPSIS
    `add_eos=True` needs an EOS id: with `tokenizer=None` column `text` must hold token ids, and `eos_id=` ...
    """
    if specials is None:
        return (
            f"`add_eos=True` needs an EOS id: with `tokenizer=None` column `{column}` must hold token ids, "
            "and `eos_id=` the id of the end-of-text token that tokenized them (or `add_eos=False` when "
            "they already end with it); to tokenize text, pass a tokenizer"
        )
    return (
        "`add_eos=True` needs an EOS id and none was found among the tokenizer's special tokens "
        f"{sorted(specials)!r}: pass `eos_id=` "
        "(for example `tokenizer.token_to_id('<|endoftext|>')`) or `add_eos=False`"
    )

