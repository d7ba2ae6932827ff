"""Tokenization: text column to a flat ``int32`` token array plus offsets.

With a ``tokenizers.Tokenizer``, texts are encoded in slices of about
``slice_bytes`` of text by an :class:`~arrowstream.tokenize.encoders.Encoder`: tokie
or tiktoken for a byte-level BPE once shown to give the tokenizer's very ids
(several times faster), else the tokenizer's own batch encoder (its Rust thread pool).
Up to ``num_inflight`` slices encode at once, from that many Python threads;
both backends release the GIL while encoding. The ids are flattened once per
slice into numpy, never per token in a Python loop of ours. With ``tokenizer=None`` the column already holds token ids
(``list<int32>`` or ``list<int64>``, large lists too) and is used as is,
zero-copy where the type allows.

Null documents are dropped and counted as ``null``; empty ones (no text, or no
tokens) as ``empty``. With ``add_eos`` every document ends with the EOS id.

Deterministic: a document's tokens depend only on its text, never on how rows
are sliced or which backend encodes them, so outputs do not depend on batch
sizes or row-group layout, and the backend does not enter the options hash.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tokenizers import Tokenizer

from arrowstream.checks import check_int
from arrowstream.core.stage import KnownTokens, Stage
from arrowstream.errors import ConfigError, SchemaError
from arrowstream.io.arrays import bools_to_numpy, from_numpy, numbers_to_numpy
from arrowstream.io.chunk import Chunk, tokens_to_arrow
from arrowstream.io.manifest import Manifest
from arrowstream.io.reader import Reader, ShardReader
from arrowstream.tokenize.cache import IDS_COLUMN, CachedReader, TokenCache
from arrowstream.tokenize.encoders import BACKENDS, Encoder, load_tokenizer, tokenizer_hash
from arrowstream.tokenize.known import known_tokens
from arrowstream.tokenize.lengths import LengthIndex
from arrowstream.tokenize.text import text_advice, texts_of
from arrowstream.tokenize.slicing import SLICE_BYTES, TOKIE_SLICE_BYTES, slice_bounds, slice_budgets
from arrowstream.tokenize.source import TokenizerSource
from arrowstream.tokenize.tokenizer import check_tokenizer, find_eos_id, no_eos_message
from arrowstream.tokenize.verdicts import default_verdict_dir

__all__ = ["Tokenize", "check_tokenizer", "find_eos_id", "load_tokenizer", "tokenizer_hash"]

_INT32_MAX = np.iinfo(np.int32).max


class Tokenize(Stage):
    """Turn a text column (or a column of token ids) into tokens.

    Parameters
    ----------
    tokenizer
        A ``tokenizers.Tokenizer``, a path to a ``tokenizer.json`` (or to a
        directory holding one), an
        :class:`~arrowstream.tokenize.encoders.Encoder` (a tokenizer with its backend
        options), a transformers fast tokenizer (``PreTrainedTokenizerFast``,
        used through its ``backend_tokenizer``, its ``eos_token_id`` the EOS),
        or ``None`` when ``column`` already holds token ids.
    column
        The text (or token-id) column.
    add_eos
        Append the EOS id to every document.
    eos_id
        The EOS id; when ``None``, a transformers tokenizer's ``eos_token_id``,
        else found among the tokenizer's special tokens.
    add_special_tokens
        Passed to the tokenizer (its post-processor may add BOS and the like).
    slice_bytes
        Text per encoder call once warmed up; ``None`` (the default): 2 MiB
        while tokie encodes, 256 KiB otherwise (see :attr:`slice_budget`). A
        rest under a quarter of it joins the slice before it.
        Memory grows with ``num_inflight * slice_bytes`` (each call's
        temporary strings and ids). Over the tiktoken backend, 256 KiB with 3
        calls in flight measured about 7 % faster than 1 MiB with 4, with a
        quarter less peak memory; over tokie, whose calls are each several
        times quicker, 1 MiB measured a third faster than 256 KiB end to end,
        and 2 MiB about 10 % faster again (see "Encoder calls" in
        ``docs/guide.md``).
    first_slice_bytes
        Text in the first call after a start or resume; slices double from
        there up to ``slice_bytes`` (smaller gives an earlier first batch).
    num_inflight
        Encoder calls in flight at once, from that many Python threads (a
        ``tokenizers`` call also uses the tokenizer's own thread pool). More
        than one keeps the cores busy while the results of a finished call are
        turned into arrays; 3 measured best on 2 cores. tokie calls run one
        at a time in a process (each spreads over every core); the others
        wait their turn with their texts ready. Output does not depend on it.
    backend
        ``"auto"`` (default): the fastest backend shown to give the
        tokenizer's ids: tokie (when installed, ``arrowstream[fast]``), then
        tiktoken for a byte-level BPE, else ``tokenizers``; ``"tokie"``,
        ``"tiktoken"`` or ``"tokenizers"`` forces one (see
        :mod:`arrowstream.tokenize.encoders`). The ids,
        and so the options hash and saved states, are the same either way;
        :attr:`backend` tells which one encodes.
    length_index
        Where to find a length index of this tokenizer and column (made by
        :func:`~arrowstream.build_length_index` or ``arrowstream index``),
        which makes even batches over text exact; ``None`` (default): beside
        the data, in ``<root>/_arrowstream_index``, used when there is one;
        a path: that directory, which must cover the data; ``False``: none.
        Over token ids, an index of their counts (``arrowstream index PATH
        --column ids``) spares reading ids to weigh parts of row groups.
        It never changes a consumer's documents (see ``docs/training.md``).
    loss_mask
        With ``tokenizer=None``: a column of per-token loss masks (a list of
        booleans or integers per row, as long as the row's token ids; true or
        non-zero: the token carries loss). Masked tokens get ``-100`` in
        ``labels`` after packing (for instruction tuning: mask the prompt). An
        appended EOS carries loss.

    Examples
    --------
    >>> import numpy as np, pyarrow as pa
    >>> from arrowstream.io.chunk import Chunk, tokens_to_arrow
    >>> batch = pa.record_batch({"ids": pa.array([[5, 6], [7]], pa.list_(pa.int64()))})
    >>> chunk = Chunk(epoch=0, shard=0, seq_start=0, seq_end=2, row_start=0,
    ...               seq=np.arange(2), batch=batch)
    >>> [out] = Tokenize(None, column="ids", eos_id=0).apply(chunk)
    >>> out.tokens.tolist(), out.offsets.tolist()
    ([5, 6, 0, 7, 0], [0, 3, 5])
    """

    name = "tokenize"
    counters = ("null", "empty")
    #: The encoder of a text column (``None`` for token ids).
    encoder: Encoder | None

    def __init__(
        self,
        tokenizer: Tokenizer | Encoder | str | os.PathLike[str] | None,
        *,
        column: str = "text",
        add_eos: bool = True,
        eos_id: int | None = None,
        add_special_tokens: bool = True,
        slice_bytes: int | None = None,
        first_slice_bytes: int = 1 << 16,
        num_inflight: int = 3,
        loss_mask: str | None = None,
        backend: str = "auto",
        cache: str | os.PathLike[str] | None = None,
        cache_write: bool = True,
        length_index: str | os.PathLike[str] | bool | None = None,
    ) -> None:
        if backend not in BACKENDS:
            raise ConfigError(f"`backend` must be one of {BACKENDS!r}, got {backend!r}")
        given = tokenizer if isinstance(tokenizer, Encoder) else None
        if given is not None and backend != "auto" and backend != given.requested:
            raise ConfigError(
                f"`backend={backend!r}` contradicts the encoder passed, built with "
                f"backend={given.requested!r}: pass one or the other"
            )
        self.source = None if tokenizer is None else given.source if given else TokenizerSource.of(tokenizer, default_verdict_dir())
        if loss_mask is not None and (self.source is not None or not isinstance(loss_mask, str)):
            raise ConfigError(
                f"`loss_mask` names a column of per-token masks aligned with token ids, so it "
                f"needs `tokenizer=None` and a column name; got loss_mask={loss_mask!r} with "
                f"{'a tokenizer' if self.source is not None else 'no tokenizer'}: tokenize "
                "ahead of time and store the ids and the mask side by side"
            )
        self.loss_mask = loss_mask
        if self.source is not None:
            self.source.facts.check()
        self.column = column
        self.add_eos = bool(add_eos)
        self.add_special_tokens = bool(add_special_tokens)
        self.slice_bytes = check_int("slice_bytes", slice_bytes, none_ok=True)
        self.first_slice_bytes = check_int("first_slice_bytes", first_slice_bytes)
        self.num_inflight = check_int("num_inflight", num_inflight)
        self.expensive = self.source is not None
        if eos_id is None and self.source is not None:  # a transformers tokenizer names its EOS
            named = getattr(tokenizer, "eos_token_id", None)
            eos_id = named if isinstance(named, int) else self.source.facts.eos_id()
        if add_eos and eos_id is None:
            raise ConfigError(no_eos_message(None if self.source is None else self.source.facts.specials, column))
        if eos_id is not None and (
            isinstance(eos_id, bool) or not isinstance(eos_id, (int, np.integer))
            or not 0 <= int(eos_id) <= _INT32_MAX
        ):
            raise ConfigError(f"`eos_id` must be a non-negative int32, got {eos_id!r}")
        if eos_id is not None and self.source is not None:
            top = self.source.largest_id_past(int(eos_id))
            if top is not None:  # the model's embedding would index past its table, far from here
                raise ConfigError(
                    f"`eos_id={int(eos_id)}` is past the tokenizer's largest id, {top:,}: "
                    "pass the id of its end-of-text token (leave `eos_id` out to have it found), or add the token "
                    "to the tokenizer"
                )
        self.eos_id = None if eos_id is None else int(eos_id)
        self.encoder = None
        if given is not None and given.add_special_tokens == self.add_special_tokens:
            self.encoder = given
        elif given is not None:
            self.encoder = Encoder(
                given.source,
                backend=given.requested,
                add_special_tokens=self.add_special_tokens,
                cache_dir=given.cache_dir,
                sample_bytes=given.sample_bytes,
            )
        elif self.source is not None:
            self.encoder = Encoder(self.source, backend=backend, add_special_tokens=self.add_special_tokens)
        self._hash = None if self.encoder is None else self.encoder.hash
        self.cache: TokenCache | None = None
        if cache is not None:
            if self.encoder is None:
                raise ConfigError(
                    "`cache` keeps the ids a tokenizer makes, but this column already holds token "
                    "ids: drop `cache=`"
                )
            self.cache = TokenCache(cache, self.setting, writable=cache_write)
        if length_index is True:
            raise ConfigError(
                "`length_index` is a directory, None (look beside the data) or False (none); got True"
            )
        self.length_index = length_index

    @property
    def tokenizer(self) -> Tokenizer | None:
        """The tokenizer (``None`` for a column of token ids), loaded now if it was given as a file and not loaded yet."""
        return None if self.source is None else self.source.get()

    @property
    def setting(self) -> dict[str, Any]:
        """What defines a text's ids: tokenizer hash, column, ``add_special_tokens`` (caches and indexes key on it)."""
        return {"tokenizer": self._hash, "column": self.column, "add_special_tokens": self.add_special_tokens}

    @property
    def backend(self) -> str | None:
        """The encoder backend now in use: ``"tokie"``, ``"tiktoken"``, ``"tokenizers"``, or ``None`` for token ids.

        It may fall back once (tokie to tiktoken, or either to
        ``"tokenizers"``) while the first documents are checked, with a
        warning; the ids never differ.
        """
        return None if self.encoder is None else self.encoder.backend

    @property
    def slice_budget(self) -> int:
        """Bytes of text per encoder call once warmed up: ``slice_bytes``, or by the backend now in use.

        Examples
        --------
        >>> from arrowstream.testing.data import sample_tokenizer
        >>> Tokenize(sample_tokenizer(300), backend="tiktoken").slice_budget
        262144
        >>> Tokenize(sample_tokenizer(300), backend="tiktoken", slice_bytes=1000).slice_budget
        1000
        """
        if self.slice_bytes is not None:
            return self.slice_bytes
        return TOKIE_SLICE_BYTES if self.backend == "tokie" else SLICE_BYTES

    def __repr__(self) -> str:
        what = "ids" if self.encoder is None else f"tokenizer={self._hash!r}, backend={self.backend!r}"
        return f"Tokenize(column={self.column!r}, {what})"

    def spec(self) -> dict[str, Any]:
        out = {
            "column": self.column,
            "tokenizer": self._hash,
            "add_eos": self.add_eos,
            "eos_id": self.eos_id,
            "add_special_tokens": self.add_special_tokens,
        }
        if self.loss_mask is not None:  # only when set: other pipelines keep their options hash
            out["loss_mask"] = self.loss_mask
        return out

    def columns(self) -> set[str] | None:
        return {self.column} if self.loss_mask is None else {self.column, self.loss_mask}

    def check(self, manifest: Manifest, schema: pa.Schema) -> pa.Schema:
        idx = schema.get_field_index(self.column)
        if idx < 0 and self.column in manifest.drift:
            raise SchemaError(manifest.drift[self.column])
        if idx < 0:
            raise SchemaError(
                f"column `{self.column}` is not among the columns read {schema.names!r} "
                f"(first file {manifest.paths[0]!r}): pass `column=` or add it to `columns=`"
            )
        dtype = schema.field(idx).type
        if self.source is not None and not pa.types.is_string(dtype):
            raise SchemaError(
                f"column `{self.column}` has type {dtype} (first file {manifest.paths[0]!r}) but "
                f"a tokenizer needs text (string); {text_advice(dtype)}"
            )
        if self.source is None and not (
            pa.types.is_list(dtype) and pa.types.is_integer(dtype.value_type)
        ):
            raise SchemaError(
                f"column `{self.column}` has type {dtype} (first file {manifest.paths[0]!r}) but "
                "`.tokenize(None, ...)` expects token ids (a list of integers: list, large_list or a list view "
                "of any integer type); "
                "for text pass a tokenizer"
            )
        if self.loss_mask is not None:
            m = schema.get_field_index(self.loss_mask)
            if m < 0:
                raise SchemaError(
                    f"loss mask column `{self.loss_mask}` is not among the columns read "
                    f"{schema.names!r} (first file {manifest.paths[0]!r}): check the name or add "
                    "it to `columns=`"
                )
            mtype = schema.field(m).type
            if not (
                pa.types.is_list(mtype)
                and (pa.types.is_boolean(mtype.value_type) or pa.types.is_integer(mtype.value_type))
            ):
                raise SchemaError(
                    f"loss mask column `{self.loss_mask}` has type {mtype} (first file "
                    f"{manifest.paths[0]!r}) but a loss mask is a list of booleans or integers "
                    "per row, one per token id"
                )
        ids = pa.field("input_ids", pa.list_(pa.int32()))
        if "input_ids" in schema.names:
            return schema.set(schema.get_field_index("input_ids"), ids)
        return schema.append(ids)

    @property
    def reads_token_ids(self) -> bool:  # type: ignore[override]
        """True for a pre-tokenized column or a token cache: the ids are read, not made."""
        return self.source is None or self.cache is not None

    def known_tokens(self, manifest: Manifest) -> KnownTokens | None:
        """Each row's ids plus EOS (0 for a null or empty row), where they are known before reading.

        From a column of token ids, a complete read-only token cache, or a
        length index that covers the data (see :func:`~arrowstream.tokenize.known.known_tokens`).
        """
        index = None
        if self.length_index is not False:
            index = LengthIndex(manifest, self.setting, self.length_index or None, spare=self.encoder is None)  # type: ignore[arg-type]
        return known_tokens(
            manifest, self.column, eos=int(self.add_eos), ids=self.encoder is None, cache=self.cache, index=index
        )

    def wrap_reader(self, reader: ShardReader, *, keep_text: bool) -> Reader:
        """With a token cache, wrap ``reader`` in a :class:`CachedReader` that brings the ids along."""
        if self.cache is None:
            return reader
        return CachedReader(reader, self.cache, self.column, self.encode_array, keep_text=keep_text)

    def encode_array(self, texts: pa.Array) -> pa.Array:
        """Encode a text array into ``list<int32>`` ids (no EOS), null for a null text."""
        assert self.encoder is not None
        valid = bools_to_numpy(texts.is_valid())
        # an empty text keeps no id, as the stage drops it before encoding (a post-processor
        # would give it a BOS)
        present = numbers_to_numpy(pc.binary_length(texts)) > 0
        texts_present = texts.filter(from_numpy(present)).to_pylist()
        flat, lens = (
            self.encoder.encode(texts_present) if texts_present else (np.empty(0, np.int32), np.zeros(0, np.int64))
        )
        all_lens = np.zeros(len(texts), dtype=np.int64)
        all_lens[present] = lens
        offsets = np.zeros(len(texts) + 1, dtype=np.int32)
        np.cumsum(all_lens, out=offsets[1:])
        return pa.ListArray.from_arrays(
            from_numpy(offsets), from_numpy(flat, pa.int32()), mask=from_numpy(~valid)
        )

    def split(self, chunk: Chunk, *, warm: int = 0) -> Iterable[Chunk]:
        """Drop (and count) null and empty documents, then cut the text into slices.

        Slices grow from ``first_slice_bytes`` (doubling per slice, counting the
        ``warm`` slices this stream already cut) to ``slice_bytes``: small first
        slices give an early first batch, large later ones keep the encoder
        efficient.
        """
        assert chunk.batch is not None
        if IDS_COLUMN in chunk.batch.schema.names:  # ids from the token cache: nothing to encode
            col = chunk.batch.column(IDS_COLUMN)
            chunk = chunk.with_rows(bools_to_numpy(col.is_valid()), "null")
            lengths = numbers_to_numpy(pc.list_value_length(chunk.batch.column(IDS_COLUMN)))
            return [chunk.with_rows(lengths > 0, "empty")]
        col = chunk.batch.column(self.column)
        chunk = chunk.with_rows(bools_to_numpy(col.is_valid()), "null")
        col = chunk.batch.column(self.column)
        lengths = pc.binary_length(col) if self.source is not None else pc.list_value_length(col)
        lengths = numbers_to_numpy(lengths)
        chunk = chunk.with_rows(lengths > 0, "empty")
        if self.source is None or chunk.num_docs == 0:
            return [chunk]
        most = self.slice_budget
        budgets = slice_budgets(min(self.first_slice_bytes, most), most, warm)
        return chunk.split(slice_bounds(lengths[lengths > 0], budgets))

    def run(self, piece: Chunk) -> Chunk:
        """Encode one slice (or take its ids as they are)."""
        if piece.num_docs == 0:
            return replace(piece, tokens=np.empty(0, np.int32), offsets=np.zeros(1, np.int64))
        assert piece.batch is not None
        if IDS_COLUMN in piece.batch.schema.names:
            out = self._from_ids(piece, piece.batch.column(IDS_COLUMN))
            assert out.batch is not None
            return replace(out, batch=out.batch.drop_columns([IDS_COLUMN]))
        if self.source is None:
            return self._from_ids(piece, piece.batch.column(self.column))
        return self._encode(piece)

    def _encode(self, chunk: Chunk) -> Chunk:
        assert self.encoder is not None and chunk.batch is not None
        flat, lens = self.encoder.encode(texts_of(chunk, self.column))
        return self._finish(chunk, flat, lens)

    def _from_ids(self, chunk: Chunk, col: pa.Array) -> Chunk:
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks()
        offsets = col.offsets.to_numpy().astype(np.int64)
        values_arr = col.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
        if values_arr.null_count:
            raise SchemaError(
                f"column `{self.column}` holds null token ids inside a list: token ids must be "
                "non-null integers; drop or fix those rows"
            )
        values = values_arr.to_numpy()
        if values.size and (values.min() < 0 or values.max() > _INT32_MAX):
            bad = values.min() if values.min() < 0 else values.max()
            raise SchemaError(
                f"column `{self.column}` holds token id {int(bad)}: token ids must be "
                "non-negative and fit in int32"
            )
        values = values.astype(np.int32, copy=False)
        mask = None if self.loss_mask is None else self._mask(chunk, offsets)
        return self._finish(chunk, values, np.diff(offsets), mask)

    def _mask(self, chunk: Chunk, offsets: np.ndarray) -> np.ndarray:
        """Return the flat boolean loss mask, checked against the token ids' lengths."""
        assert chunk.batch is not None and self.loss_mask is not None
        col = chunk.batch.column(self.loss_mask)
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks()
        lens = pc.list_value_length(col).to_numpy(zero_copy_only=False)
        valid = bools_to_numpy(col.is_valid())
        ids_lens = np.diff(offsets)
        bad = np.flatnonzero(~valid | (np.nan_to_num(lens, nan=-1) != ids_lens))
        if bad.size:
            i = int(bad[0])
            got = "null" if not valid[i] else f"{int(lens[i])} values"
            raise SchemaError(
                f"loss mask column `{self.loss_mask}` has {got} in row {int(chunk.seq[i])} of the "
                f"epoch's order, where `{self.column}` has {int(ids_lens[i])} token ids: a loss "
                "mask needs one value per token id in every row"
            )
        values = col.values.slice(int(col.offsets[0].as_py()), int(lens.sum()))
        if values.null_count:
            raise SchemaError(
                f"loss mask column `{self.loss_mask}` holds nulls inside a list: use true/false "
                "(or 1/0) for every token"
            )
        return values.to_numpy(zero_copy_only=False).astype(bool, copy=False)

    def _finish(
        self, chunk: Chunk, flat: np.ndarray, lens: np.ndarray, mask: np.ndarray | None = None
    ) -> Chunk:
        if (lens == 0).any():  # texts that encode to no token at all (a normalizer ate them)
            keep = lens > 0
            flat_chunk = replace(chunk, tokens=flat, offsets=_offsets(lens), mask=mask)
            chunk = flat_chunk.with_rows(keep, "empty")
            flat, lens, mask = chunk.tokens, lens[keep], chunk.mask
        if self.add_eos:
            out = np.empty(flat.size + lens.size, dtype=np.int32)
            eos_at = np.cumsum(lens + 1) - 1
            out[eos_at] = self.eos_id
            is_text = np.ones(out.size, dtype=bool)  # a scatter of the few EOS, not a mask of them
            is_text[eos_at] = False
            out[is_text] = flat
            if mask is not None:
                with_eos = np.ones(out.size, dtype=bool)  # the EOS carries loss
                with_eos[is_text] = mask
                mask = with_eos
            flat, lens = out, lens + 1
        offsets = _offsets(lens)
        batch = chunk.batch
        if batch is not None:  # later stages (a length filter) and unpacked output see the ids
            ids = tokens_to_arrow(flat, offsets)
            names = batch.schema.names
            batch = (
                batch.set_column(names.index("input_ids"), "input_ids", ids)
                if "input_ids" in names
                else batch.append_column("input_ids", ids)
            )
        return replace(chunk, tokens=flat, offsets=offsets, batch=batch, mask=mask)


def _offsets(lens: np.ndarray) -> np.ndarray:
    offsets = np.zeros(lens.size + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    return offsets
