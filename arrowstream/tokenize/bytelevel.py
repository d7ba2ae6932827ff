"""Converting a byte-level BPE ``tokenizer.json`` into an equivalent tiktoken encoding.

A GPT-2-style tokenizer (``tokenizers`` model ``BPE`` over the 256 byte-level
symbols, split by a regex) and a tiktoken ``Encoding`` run the same algorithm:
cut the text into pieces with a regex, then merge adjacent byte sequences by
priority until no merge applies. :func:`to_bytelevel_bpe` reads the
tokenizer's JSON and builds what tiktoken needs:

- **bytes**: every vocabulary symbol is mapped back from its byte-level
  character (``Ġ`` is the space byte) to the bytes it stands for;
- **ranks**: a merged token's rank is the position of its merge in the merge
  list, so tiktoken merges in the tokenizer's order; when the tokenizer's ids
  already follow merge order the ids serve as ranks, otherwise a table maps
  tiktoken's values back to the tokenizer's ids. Tokens the tokenizer can
  never produce from their own bytes (no merge path) are left out, so tiktoken
  cannot produce them either;
- **pattern**: the GPT-2 regex for a ``ByteLevel`` pre-tokenizer, or the
  regex a ``Split`` pre-tokenizer states in the JSON (Llama-3-, Qwen- and
  GPT-4o-style tokenizers);
- **added tokens**: matched in the text first, as ``tokenizers`` does, and
  encoded to their ids; **post-processor** tokens (a BOS from
  ``TemplateProcessing``, ``<s>``/``</s>`` from ``RobertaProcessing``) become
  a fixed prefix and suffix.

Anything the conversion cannot reproduce exactly is refused with
:class:`Unconvertible` and a reason: a normalizer, dropout, a
``continuing_subword_prefix`` or ``end_of_word_suffix``, byte fallback, a
pre-tokenizer other than the two shapes above, ``add_prefix_space``, added
tokens with ``lstrip``/``rstrip``/``single_word`` or that are prefixes of one
another, a token made by two merges, missing byte symbols. Refusing is cheap;
what is accepted is then *tested* (:mod:`arrowstream.tokenize.encoders`). Pure
functions of the JSON (and, for the merge-path check, the tokenizer's own BPE
model); the result is immutable and safe to share between threads.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import tiktoken
from tokenizers import Tokenizer

from arrowstream.errors import ArrowStreamError

__all__ = ["GPT2_PATTERN", "ByteLevelBPE", "Unconvertible", "byte_symbols", "check_bytelevel", "to_bytelevel_bpe"]

#: The regex of ``tokenizers``' ``ByteLevel`` pre-tokenizer (``use_regex=True``): GPT-2's.
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_POST_PROCESSORS_WITHOUT_TOKENS = {"ByteLevel"}
_ADDED = ("content", "single_word", "lstrip", "rstrip", "normalized", "special")  # an added token's JSON keys


class Unconvertible(ArrowStreamError):
    """The tokenizer cannot be converted to an exactly equivalent tiktoken encoding.

    ``byte_level`` tells whether it is a byte-level BPE at all (then the
    refusal is worth a warning: a faster backend was close) or another kind of
    tokenizer (WordPiece, Unigram, SentencePiece-style BPE), which simply
    keeps ``tokenizers``.
    """

    def __init__(self, reason: str, *, byte_level: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.byte_level = byte_level


def byte_symbols() -> dict[int, str]:
    """Return GPT-2's byte-to-symbol table: the printable character that stands for each byte.

    Printable Latin-1 bytes stand for themselves; the others are shifted to
    ``U+0100`` and up (the space byte is ``Ġ``, newline ``Ċ``).

    Examples
    --------
    >>> table = byte_symbols()
    >>> table[ord("a")], table[ord(" ")], table[ord("\\n")], len(set(table.values()))
    ('a', 'Ġ', 'Ċ', 256)
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out = {b: chr(b) for b in keep}
    shifted = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + shifted)
            shifted += 1
    return dict(sorted(out.items()))


_SYMBOL_BYTE = {sym: b for b, sym in byte_symbols().items()}


# Each symbol to the Latin-1 character of its byte, and every other Latin-1 character to one
# Latin-1 cannot encode: `str.translate` then `encode("latin-1")` turns a token into its bytes in C
# (a fifth of the time of a lookup per character: 0.22 against 0.04 s for 128k merges), and fails
# on any character that is not a symbol.
_TO_LATIN1 = {ord(sym): chr(b) for sym, b in _SYMBOL_BYTE.items()}
_TO_LATIN1.update({b: "\uffff" for b in range(256) if b not in _TO_LATIN1})


def _to_bytes(symbols: str) -> bytes | None:
    """Return the bytes a byte-level token stands for, or ``None`` if it is not byte-level.

    Examples
    --------
    >>> _to_bytes("ĠtheĊ"), _to_bytes("a\\x00"), _to_bytes("x☃")
    (b' the\\n', None, None)
    """
    try:
        return symbols.translate(_TO_LATIN1).encode("latin-1")
    except UnicodeEncodeError:
        return None


@dataclass(frozen=True, slots=True)
class ByteLevelBPE:
    """What a tiktoken encoding needs to encode exactly like the tokenizer.

    Attributes
    ----------
    pattern
        The pre-tokenization regex.
    ranks
        Token bytes to tiktoken value (merge priority: lower merges first).
    specials
        Added-token strings matched in the text, to their tiktoken values.
    rank_to_id
        Maps a tiktoken value to the tokenizer's id, or ``None`` when they are
        the same.
    prefix, suffix
        Ids the post-processor adds around every document (empty with
        ``add_special_tokens=False``).
    dropped
        Merged tokens left out because the tokenizer's merges cannot produce
        them from their own bytes.
    """

    pattern: str
    ranks: dict[bytes, int]
    specials: dict[str, int]
    rank_to_id: np.ndarray | None
    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    dropped: int = 0

    @property
    def separator_value(self) -> int:
        """The tiktoken value of the separator :meth:`to_tiktoken` adds: one past every other value."""
        return 1 + max(max(self.ranks.values()), max(self.specials.values(), default=0))

    def to_tiktoken(self, name: str, *, separator: str | None = None) -> tiktoken.Encoding:
        """Build the tiktoken ``Encoding``, with ``separator`` as an extra special token.

        Raises
        ------
        Unconvertible
            tiktoken rejects the pattern (a regex feature its engine lacks).
        """
        specials = dict(self.specials)
        if separator is not None:
            specials[separator] = self.separator_value
        try:
            return tiktoken.Encoding(
                name, pat_str=self.pattern, mergeable_ranks=self.ranks, special_tokens=specials
            )
        except BaseException as exc:  # a Rust panic (PanicException) is not an Exception
            if isinstance(exc, (KeyboardInterrupt, SystemExit, MemoryError)):
                raise
            raise Unconvertible(
                f"tiktoken cannot compile the pre-tokenizer pattern {self.pattern!r}: {exc}",
                byte_level=True,
            ) from exc


def to_bytelevel_bpe(tokenizer: Tokenizer, *, add_special_tokens: bool = True) -> ByteLevelBPE:
    """Convert a byte-level BPE tokenizer, or refuse with the reason.

    Parameters
    ----------
    tokenizer
        The ``tokenizers.Tokenizer``.
    add_special_tokens
        Whether the post-processor's tokens (a BOS, say) are added, as in
        ``tokenizer.encode(..., add_special_tokens=...)``.

    Raises
    ------
    Unconvertible
        Not a byte-level BPE, or a setting tiktoken cannot reproduce exactly: the message says which.

    Examples
    --------
    >>> from arrowstream.testing.data import sample_tokenizer
    >>> spec = to_bytelevel_bpe(sample_tokenizer(300))
    >>> spec.pattern == GPT2_PATTERN, spec.specials, spec.rank_to_id is None
    (True, {'<|endoftext|>': 0}, True)
    >>> from tokenizers import Tokenizer, models
    >>> to_bytelevel_bpe(Tokenizer(models.WordLevel({"a": 0}, unk_token="a")))
    Traceback (most recent call last):
    ...
    arrowstream.tokenize.bytelevel.Unconvertible: the model is `WordLevel`, not a byte-level `BPE`
    """
    model, pattern, matched, prefix, suffix = _settings(tokenizer, add_special_tokens)
    table, dropped = _rank_table(model, tokenizer)
    del model  # the parsed JSON (tens of MB at 128k tokens) goes before the ranks are made
    ids = np.array([tid for _, tid, _ in table], dtype=np.int64)
    if np.all(np.diff(ids[256:]) > 0):  # ids follow merge order: tiktoken can return them as they are
        ranks = {tb: tid for tb, tid, _ in table}
        specials = dict(matched)
        rank_to_id = None
    else:
        ranks = {tb: value for value, (tb, _, _) in enumerate(table)}
        specials = {content: len(table) + k for k, content in enumerate(matched)}
        rank_to_id = np.concatenate([ids, np.fromiter(matched.values(), np.int64, len(matched))])
        rank_to_id = rank_to_id.astype(np.int32)
    return ByteLevelBPE(
        pattern=pattern,
        ranks=ranks,
        specials=specials,
        rank_to_id=rank_to_id,
        prefix=prefix,
        suffix=suffix,
        dropped=dropped,
    )


def check_bytelevel(tokenizer: Tokenizer, *, add_special_tokens: bool = True) -> None:
    """Refuse now what :func:`to_bytelevel_bpe` refuses for the tokenizer's settings (raise :class:`Unconvertible`).

    All but the merges, read from the tokenizer's parts, not its whole JSON (0.3 s at 128k tokens),
    so an encoder may convert later (about 1.5 s at 128k): the merges are looked at then.

    >>> from tokenizers import Tokenizer, models
    >>> check_bytelevel(Tokenizer(models.WordLevel({"a": 0}, unk_token="a")))
    Traceback (most recent call last):
    ...
    arrowstream.tokenize.bytelevel.Unconvertible: the model is `WordLevel`, not a byte-level `BPE`
    """
    spec = {
        "model": _model_settings(tokenizer),
        "added_tokens": [{"id": tid, **{k: getattr(t, k) for k in _ADDED}} for tid, t in sorted(
            tokenizer.get_added_tokens_decoder().items())],
        **{
            part: None if (obj := getattr(tokenizer, part)) is None else json.loads(obj.__getstate__())
            for part in ("normalizer", "pre_tokenizer", "post_processor")
        },
    }
    _settings(tokenizer, add_special_tokens, spec)


def _model_settings(tokenizer: Tokenizer) -> dict[str, Any]:
    """The model's part of the tokenizer's JSON, its vocabulary cut to the byte symbols (all that is looked at)."""
    model = tokenizer.model
    kind = type(model).__name__
    if kind != "BPE":
        return {"type": kind}
    keys = ("dropout", "continuing_subword_prefix", "end_of_word_suffix", "byte_fallback")
    out = {"type": kind, **{key: getattr(model, key) for key in keys}}
    out["vocab"] = {sym: tid for sym in _SYMBOL_BYTE if (tid := model.token_to_id(sym)) is not None}
    out["dropout"] = float(str(np.float32(out["dropout"]))) if out["dropout"] else out["dropout"]  # as the JSON
    return out


def _settings(
    tokenizer: Tokenizer, add_special_tokens: bool, spec: dict[str, Any] | None = None
) -> tuple[dict[str, Any], str, dict[str, int], tuple[int, ...], tuple[int, ...]]:
    """The model, split pattern, added tokens and post-processor's tokens of ``spec`` (else the JSON), checked."""
    spec = json.loads(tokenizer.to_str()) if spec is None else spec
    model = spec.get("model") or {}
    _check_model(model, spec.get("pre_tokenizer"))
    pattern = _pattern(spec.get("pre_tokenizer"))
    _check_normalizer(spec.get("normalizer"))
    matched = _added_tokens(spec.get("added_tokens") or [], tokenizer.encode_special_tokens)
    prefix, suffix = _post_tokens(spec.get("post_processor")) if add_special_tokens else ((), ())
    return model, pattern, matched, prefix, suffix


def _check_model(model: dict[str, Any], pre: Any) -> None:
    kind = model.get("type")
    if kind != "BPE":
        raise Unconvertible(f"the model is `{kind}`, not a byte-level `BPE`", byte_level=False)
    vocab = model.get("vocab") or {}
    if not _mentions_byte_level(pre) or any(s not in vocab for s in _SYMBOL_BYTE):
        # SentencePiece-style BPE (Metaspace, byte fallback) and the like: a different scheme.
        raise Unconvertible(
            "the tokenizer is a `BPE` but not byte-level (no `ByteLevel` pre-tokenizer, or its "
            "vocabulary lacks some of the 256 byte symbols)",
            byte_level=False,
        )
    if model.get("dropout") not in (None, 0, 0.0):
        raise Unconvertible(
            f"the model has BPE dropout {model['dropout']!r}: its ids are random; tiktoken has "
            "no dropout (set `tokenizer.model.dropout = None` for deterministic ids)",
            byte_level=True,
        )
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise Unconvertible(f"the model sets `{key}`={model[key]!r}, which tiktoken has no notion of", byte_level=True)
    if model.get("byte_fallback"):
        raise Unconvertible("the model sets `byte_fallback`, which tiktoken has no notion of", byte_level=True)


def _mentions_byte_level(pre: Any) -> bool:
    if not isinstance(pre, dict):
        return False
    if pre.get("type") == "ByteLevel":
        return True
    return pre.get("type") == "Sequence" and any(_mentions_byte_level(p) for p in pre.get("pretokenizers") or [])


def _pattern(pre: Any) -> str:
    """Return the regex that cuts text into pieces, for the two supported pre-tokenizer shapes."""
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else [pre]
    steps = list(steps or [])
    byte_level = steps[-1] if steps and steps[-1].get("type") == "ByteLevel" else None
    described = json.dumps(pre, sort_keys=True)
    if byte_level is None or len(steps) > 2:
        raise Unconvertible(
            f"the pre-tokenizer {described} is not `ByteLevel` or `Split(regex)` + `ByteLevel`; "
            "tiktoken cannot reproduce it",
            byte_level=True,
        )
    if byte_level.get("add_prefix_space"):
        raise Unconvertible(
            "the `ByteLevel` pre-tokenizer has `add_prefix_space=True` (a space added before "
            "each text and after each added token), which tiktoken does not do",
            byte_level=True,
        )
    if len(steps) == 1:
        if not byte_level.get("use_regex", True):
            raise Unconvertible("the `ByteLevel` pre-tokenizer does not split (`use_regex=False`)", byte_level=True)
        return GPT2_PATTERN
    split = steps[0]
    regex = (split.get("pattern") or {}).get("Regex") if split.get("type") == "Split" else None
    if (
        regex is None
        or str(split.get("behavior")).lower() != "isolated"
        or split.get("invert")
        or byte_level.get("use_regex", True)
    ):
        raise Unconvertible(
            f"the pre-tokenizer {described} is not `Split(Regex, behavior='Isolated', "
            "invert=False)` followed by `ByteLevel(use_regex=False)`; tiktoken cannot reproduce it",
            byte_level=True,
        )
    return str(regex)


def _check_normalizer(normalizer: Any) -> None:
    if normalizer is None:
        return
    if normalizer.get("type") == "Sequence" and not normalizer.get("normalizers"):
        return
    raise Unconvertible(
        f"the tokenizer has a `{normalizer.get('type')}` normalizer, which tiktoken cannot "
        "reproduce (it encodes the text as it is)",
        byte_level=True,
    )


def _added_tokens(added: list[dict[str, Any]], encode_special_tokens: bool) -> dict[str, int]:
    """Return the added tokens ``tokenizers`` matches in the text: content -> id."""
    matched: dict[str, int] = {}
    flags = set()
    for tok in added:
        content = tok.get("content") or ""
        for key in ("lstrip", "rstrip", "single_word"):
            if tok.get(key):
                raise Unconvertible(
                    f"added token {content!r} sets `{key}`, which tiktoken's special-token "
                    "matching does not do",
                    byte_level=True,
                )
        if not content or (tok.get("special") and encode_special_tokens):
            continue  # with `encode_special_tokens`, a special token's text is encoded as text
        matched[content] = int(tok["id"])
        flags.add(bool(tok.get("normalized")))
    ordered = sorted(matched)
    for a, b in itertools.pairwise(ordered):
        if b.startswith(a):  # tokenizers takes the longest match, tiktoken whichever it tries first
            raise Unconvertible(
                f"added token {a!r} is a prefix of added token {b!r}; tiktoken may match either",
                byte_level=True,
            )
    if len(flags) > 1 and _overlapping(ordered):
        # tokenizers matches unnormalized added tokens first, then normalized ones; one
        # leftmost pass agrees with that only when no two can overlap in a text.
        raise Unconvertible(
            "normalized and unnormalized added tokens can overlap in a text; tokenizers matches "
            "them in two passes, tiktoken in one",
            byte_level=True,
        )
    return matched


def _overlapping(contents: list[str]) -> bool:
    starts = {c[:i] for c in contents for i in range(1, len(c))}
    if any(c[i:] in starts for c in contents for i in range(1, len(c))):
        return True
    return any(a != b and a in b for a in contents for b in contents)


def _post_tokens(post: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Return the ids the post-processor puts before and after a single text."""
    if post is None:
        return (), ()
    kind = post.get("type")
    if kind in _POST_PROCESSORS_WITHOUT_TOKENS:
        return (), ()
    if kind == "Sequence":
        parts = [_post_tokens(p) for p in post.get("processors") or []]
        adding = [p for p in parts if p != ((), ())]
        if len(adding) > 1:
            raise Unconvertible("more than one post-processor adds tokens", byte_level=True)
        return adding[0] if adding else ((), ())
    if kind == "RobertaProcessing" or kind == "BertProcessing":
        return (int(post["cls"][1]),), (int(post["sep"][1]),)
    if kind == "TemplateProcessing":
        specials = post.get("special_tokens") or {}
        before: list[int] = []
        after: list[int] = []
        seen_a = False
        for piece in post.get("single") or []:
            if "Sequence" in piece:
                if piece["Sequence"].get("id") != "A" or seen_a:
                    raise Unconvertible(f"unsupported `TemplateProcessing` template {post['single']!r}", byte_level=True)
                seen_a = True
            else:
                name = piece["SpecialToken"]["id"]
                (after if seen_a else before).extend(int(i) for i in specials[name]["ids"])
        if not seen_a:
            raise Unconvertible(f"unsupported `TemplateProcessing` template {post['single']!r}", byte_level=True)
        return tuple(before), tuple(after)
    raise Unconvertible(
        f"the `{kind}` post-processor may add tokens tiktoken cannot reproduce; pass "
        "`add_special_tokens=False` if the pipeline does not need them",
        byte_level=True,
    )


def _merges(model: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for merge in model.get("merges") or []:
        a, b = merge.split(" ", 1) if isinstance(merge, str) else merge
        yield a, b


def _made_twice(model: dict[str, Any], product: str) -> Unconvertible:
    """Why ``product`` is refused: two merges make it (found again, on this path only; `tokenizers` keeps no merge twice)."""
    first, second = [(a, b) for a, b in _merges(model) if a + b == product][:2]
    why = f"token {product!r} is made by two merges ({first!r} and {second!r}); tiktoken gives each token one rank"
    return Unconvertible(why, byte_level=True)


def _rank_table(model: dict[str, Any], tokenizer: Tokenizer) -> tuple[list[tuple[bytes, int, str]], int]:
    """Return ``(bytes, id, symbols)`` per token in rank order (bytes 0-255, then merges), and the count dropped."""
    vocab: dict[str, int] = model["vocab"]
    table = [(bytes([b]), vocab[sym], sym) for b, sym in byte_symbols().items()]
    made: set[str] = set()  # the products only (a 128k vocabulary's pairs cost tens of MB): see _made_twice
    merged = []
    for a, b in _merges(model):
        product = a + b
        if product in made:
            raise _made_twice(model, product)
        made.add(product)
        raw = _to_bytes(product)
        if raw is None or product not in vocab:
            raise Unconvertible(f"the merge {a!r} + {b!r} does not make a byte-level token", byte_level=True)
        merged.append((raw, vocab[product], product))
    if model.get("ignore_merges"):
        # The model returns a whole piece found in the vocabulary without merging; tiktoken
        # does the same, and also builds such a token from two parts, which the model does not.
        table += merged
        known = {raw for raw, _, _ in table}
        extra = sorted(
            (tid, raw, sym) for sym, tid in vocab.items()
            if sym not in made and len(sym) > 1 and (raw := _to_bytes(sym)) is not None and raw not in known
        )
        for tid, raw, sym in extra:
            for i in range(1, len(raw)):
                if raw[:i] in known and raw[i:] in known:
                    raise Unconvertible(
                        f"token {sym!r} is in the vocabulary without a merge, yet tiktoken would "
                        f"build it from {raw[:i]!r} + {raw[i:]!r}",
                        byte_level=True,
                    )
        return table + [(raw, tid, sym) for tid, raw, sym in extra], 0
    # Keep a merged token only if the model makes it from its own bytes: a token it cannot
    # reach alone it cannot reach inside longer text either (merges only ever join
    # neighbours), and tiktoken must not take the shortcut to it.
    bpe = tokenizer.model
    kept = [row for row in merged if [t.id for t in bpe.tokenize(row[2])] == [row[1]]]
    return table + kept, len(merged) - len(kept)
