"""A small GPT-2-style byte-level BPE tokenizer, trained offline on the sample text.

:func:`train_tokenizer` trains one on any texts; :func:`sample_tokenizer`
serves one trained on :func:`~arrowstream.testing.texts.make_texts`, cached
per vocabulary size in this process (each call returns a fresh copy).

Determinism invariant: the same texts and options give the same tokenizer,
with the same library versions.
"""

from __future__ import annotations

from collections.abc import Iterable

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from arrowstream.errors import ConfigError
from arrowstream.testing.texts import _check_int, make_texts

__all__ = ["sample_tokenizer", "train_tokenizer"]

_SAMPLE_TOKENIZER_DOCS = 3000
_SAMPLE_TOKENIZER_SEED = 1234
_SAMPLE_TOKENIZERS: dict[int, tokenizers.Tokenizer] = {}


def train_tokenizer(
    texts: Iterable[str],
    *,
    vocab_size: int = 4096,
    eos_token: str = "<|endoftext|>",
) -> tokenizers.Tokenizer:
    """Train a GPT-2-style byte-level BPE tokenizer.

    The model is :class:`tokenizers.models.BPE` with the
    :class:`~tokenizers.pre_tokenizers.ByteLevel` pre-tokenizer (no prefix
    space) and decoder, so any string round-trips through ``encode`` and
    ``decode``. All 256 byte symbols are in the vocabulary and ``eos_token``
    is a special token. No post-processor is set: ``encode`` adds no tokens.

    Parameters
    ----------
    texts : iterable of str
        Training documents (consumed once).
    vocab_size : int, optional
        Largest vocabulary size, special token included, at least 257 (the
        256 byte symbols plus ``eos_token``). Training stops earlier when the
        texts offer no more merges.
    eos_token : str, optional
        End-of-document special token, non-empty.

    Returns
    -------
    tokenizers.Tokenizer

    Raises
    ------
    ValueError
        If ``vocab_size`` is below 257 or ``eos_token`` is empty.

    Examples
    --------
    >>> tok = train_tokenizer(make_texts(50, seed=3), vocab_size=300)
    >>> text = "The river is quiet, 42 days later?"
    >>> tok.decode(tok.encode(text).ids) == text
    True
    >>> tok.token_to_id("<|endoftext|>"), tok.get_vocab_size() <= 300
    (0, True)
    """
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    _check_int(
        "vocab_size",
        vocab_size,
        minimum=len(alphabet) + 1,
        hint="the 256 byte symbols and `eos_token` need that many; pass a larger size",
    )
    if not isinstance(eos_token, str) or not eos_token:
        raise ConfigError(
            f"`eos_token` must be a non-empty string, got {eos_token!r}; "
            'pass e.g. "<|endoftext|>"'
        )
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[eos_token],
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def sample_tokenizer(vocab_size: int = 4096) -> tokenizers.Tokenizer:
    """Return a byte-level BPE tokenizer trained on the sample text of :func:`make_texts`.

    Trained with :func:`train_tokenizer` on ``make_texts(3000, seed=1234)``
    (eos token ``"<|endoftext|>"``) the first time each ``vocab_size`` is
    asked for, then served from a module-level cache. Each call returns a
    fresh copy, so changing one (padding, truncation) does not affect others.

    Parameters
    ----------
    vocab_size : int, optional
        Largest vocabulary size, as in :func:`train_tokenizer`. The sample
        text has a small vocabulary, so large sizes stop short: check
        ``get_vocab_size()`` for the real size.

    Returns
    -------
    tokenizers.Tokenizer

    Raises
    ------
    ValueError
        If ``vocab_size`` is below 257.

    Examples
    --------
    >>> tok = sample_tokenizer()
    >>> tok.decode(tok.encode("Hello, world.\\n\\nThe end?").ids)
    'Hello, world.\\n\\nThe end?'
    >>> tok.token_to_id("<|endoftext|>")
    0
    """
    _check_int(
        "vocab_size",
        vocab_size,
        minimum=257,
        hint="the 256 byte symbols and the eos token need that many; pass a larger size",
    )
    cached = _SAMPLE_TOKENIZERS.get(vocab_size)
    if cached is None:
        texts = make_texts(_SAMPLE_TOKENIZER_DOCS, seed=_SAMPLE_TOKENIZER_SEED)
        cached = train_tokenizer(texts, vocab_size=vocab_size)
        _SAMPLE_TOKENIZERS[vocab_size] = cached
    return tokenizers.Tokenizer.from_str(cached.to_str())
