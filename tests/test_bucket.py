"""Length bucketing: every document once in a row of its own, little padding, exact resume."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arrowstream import (
    ConfigError,
    Dataset,
    StateMismatchError,
    read_parquet,
)
from arrowstream.pack.assemble import PADDED_KEYS
from arrowstream.pack.bucket import BucketPacker
from arrowstream.testing import assert_resumes_identically

from .conftest import BASE, counts_through_a_merge, stop_merge_resume, write_parts
from .conftest import heavy_tail as _heavy_tail
from .conftest import write_named_docs as _write

EOS = 0
def _pipeline(
    root: Path, *, num_epochs: int | None = 1, batch_rows: int = 5, filtered: bool = False, **bucket: object
) -> Dataset:
    options = {"batch_size": 3, "window": 20, "long_docs": "truncate", **bucket}
    if "max_tokens" in bucket:
        options.pop("batch_size")
    ds = read_parquet(root, batch_rows=batch_rows, num_epochs=num_epochs)
    if filtered:  # a filter keeping every row: batch counts can no longer be counted ahead
        ds = ds.filter(pc.field("input_ids").is_valid())
    return ds.tokenize(None, column="input_ids", eos_id=EOS).bucket(**options)


def _check_batch(b: dict, *, pad_id: int = EOS, multiple: int = 1) -> list[np.ndarray]:
    """Check the arrays agree with the padding; return each row's tokens."""
    assert set(b) == set(PADDED_KEYS)
    ids, mask, labels, pos = b["input_ids"], b["attention_mask"], b["labels"], b["position_ids"]
    assert (ids.dtype, mask.dtype, labels.dtype, pos.dtype) == (np.int32, np.int32, np.int64, np.int32)
    rows, width = ids.shape
    assert mask.shape == labels.shape == pos.shape == (rows, width)
    fill = mask.sum(axis=1)
    col = np.arange(width)
    assert np.array_equal(mask, (col < fill[:, None]).astype(np.int32)), "attention_mask is not left-aligned"
    assert width % multiple == 0 and (width - multiple < fill.max() or fill.max() == 0), "width is not the longest"
    real = mask == 1
    assert (ids[~real] == pad_id).all(), "padding is not pad_id"
    assert np.array_equal(labels[real], ids[real].astype(np.int64)), "labels differ from input_ids"
    assert (labels[~real] == -100).all(), "a label on padding"
    assert np.array_equal(pos, np.broadcast_to(col, (rows, width))), "position_ids are not 0..width-1"
    assert b["num_tokens"] == int(fill.sum()) and b["num_padding_tokens"] == ids.size - int(fill.sum())
    assert b["num_docs"] == int(np.count_nonzero(fill))
    return [ids[r, : fill[r]] for r in range(rows) if fill[r]]


def _expected_row(doc: int, n: int, max_len: int | None) -> np.ndarray:
    row = np.r_[(doc + 1) * BASE + np.arange(n), EOS]
    return row if max_len is None else row[:max_len]


def _check_epoch(
    batches: list, lengths: list[int], *, max_len: int | None = None, drop_long: bool = False,
    emitted_once: bool = True, multiple: int = 1,
) -> Counter:
    """Each row holds one whole (or truncated) document; return how often each document came."""
    seen: Counter = Counter()
    for b in batches:
        for row in _check_batch(b, multiple=multiple):
            owners = np.unique(row[row != EOS] // BASE)
            assert owners.size == 1, f"a row mixes documents {owners.tolist()}"
            doc = int(owners[0]) - 1
            assert np.array_equal(row, _expected_row(doc, lengths[doc], max_len)), f"document {doc}"
            seen[doc] += 1
    if emitted_once:
        expect = {
            i for i, n in enumerate(lengths) if not (drop_long and max_len is not None and n + 1 > max_len)
        }
        assert set(seen) == expect and set(seen.values()) <= {1}, "a document is missing or repeated"
    return seen


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lengths=st.lists(st.integers(1, 70), min_size=1, max_size=60),
    mode=st.sampled_from(["batch_size", "max_tokens"]),
    size=st.integers(1, 6),
    budget=st.integers(8, 200),
    window=st.integers(1, 25),
    max_len=st.one_of(st.none(), st.integers(1, 60)),
    drop_long=st.booleans(),
    multiple=st.sampled_from([1, 1, 4, 8]),
    drop_last=st.booleans(),
    batch_rows=st.integers(1, 9),
)
def test_every_document_once_in_a_row_of_its_own(
    tmp_path_factory: pytest.TempPathFactory,
    lengths: list[int],
    mode: str,
    size: int,
    budget: int,
    window: int,
    max_len: int | None,
    drop_long: bool,
    multiple: int,
    drop_last: bool,
    batch_rows: int,
) -> None:
    root = _write(tmp_path_factory.mktemp("bk"), lengths)
    options: dict = {"window": window, "pad_to_multiple_of": multiple, "drop_last": drop_last,
                     "long_docs": "drop" if drop_long else "truncate"}
    if mode == "batch_size":
        options["batch_size"] = size
    else:
        options["max_tokens"] = budget
        if max_len is not None:
            max_len = min(max_len, budget // multiple * multiple)
    ds = _pipeline(root, batch_rows=batch_rows, max_len=max_len, **options)
    limit = ds.packer.max_len
    it = ds.iter()
    batches = list(it)
    stats = it.stats
    seen = _check_epoch(
        batches, lengths, max_len=limit, drop_long=drop_long, emitted_once=False, multiple=multiple
    )
    assert set(seen.values()) <= {1}
    partial = 0
    for b in batches:
        rows = b["input_ids"].shape[0]
        if mode == "batch_size":
            partial += rows < size
            assert rows <= size
        else:
            assert b["input_ids"].size <= budget, "max_tokens exceeded"
    assert partial <= (0 if drop_last else 1)
    # every document and token is emitted or counted, once
    n_docs, n_tokens = len(lengths), sum(n + 1 for n in lengths)
    assert sum(seen.values()) + stats.get("dropped_docs", 0) + stats.get("long_docs_dropped", 0) == n_docs
    assert stats.get("tokens", 0) + stats.get("dropped_tokens", 0) + stats.get("truncated_tokens", 0) + stats.get(
        "long_tokens_dropped", 0
    ) == n_tokens
    if not drop_last:
        assert stats.get("dropped_docs", 0) == 0
    # deterministic: the same options give the same bytes
    again = list(_pipeline(root, batch_rows=batch_rows, max_len=max_len, **options))
    assert [b["input_ids"].tobytes() for b in again] == [b["input_ids"].tobytes() for b in batches]


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"window": 1},  # leftovers pile up over windows until a batch is full
        {"batch_size": 4, "max_len": 20, "drop_last": True, "pad_to_multiple_of": 8},
        {"max_tokens": 64},
        {"max_tokens": 100, "max_len": 30, "long_docs": "drop", "pad_to_multiple_of": 8, "drop_last": True},
    ],
)
def test_resumes_identically_at_every_step_across_epochs(tmp_path: Path, options: dict) -> None:
    root = _write(tmp_path, _heavy_tail(90, seed=1))
    ds = _pipeline(root, num_epochs=2, **options)
    assert assert_resumes_identically(ds, min_epochs=2) > 4


@pytest.mark.filterwarnings("ignore::arrowstream.DataLossWarning")  # estimated batch counts: drops are the point
@pytest.mark.parametrize("options", [{"batch_size": 2}, {"max_tokens": 48}])
def test_resumes_identically_with_shuffle_and_consumers(tmp_path: Path, options: dict) -> None:
    root = _write(tmp_path, _heavy_tail(120, seed=2))
    ds = read_parquet(root, batch_rows=4, num_epochs=2).shuffle(seed=3, window=2)
    ds = ds.tokenize(None, column="input_ids", eos_id=EOS).bucket(window=9, long_docs="truncate", **options)
    assert assert_resumes_identically(lambda: ds.iter(rank=1, world_size=2), min_epochs=2) > 4


@pytest.mark.parametrize("options", [{"batch_size": 4}, {"max_tokens": 96}])
def test_resume_rereads_at_most_the_current_windows(tmp_path: Path, options: dict) -> None:
    window, batch_rows = 16, 5
    root = _write(tmp_path, _heavy_tail(300, seed=3))
    ds = _pipeline(root, window=window, batch_rows=batch_rows, **options)
    it = ds.iter()
    batches, states = [], []
    for b in it:
        batches.append(b["input_ids"].tobytes())
        state = json.loads(json.dumps(it.state_dict()))
        states.append(state)
        assert len(json.dumps(state)) < 4096
        if state["held"] is None:
            continue
        held = state["held"]["docs"]
        # the resume reads from the earliest held document: in this window or the one before
        assert state["position"]["seq"] == min(seq for _, seq, *_ in held)
        span = state["held"]["read"][1] - state["position"]["seq"]
        assert span <= 2 * (window + batch_rows - 1), span
    step = len(states) // 2
    assert states[step]["held"] is not None
    assert [b["input_ids"].tobytes() for b in ds.iter(states[step])] == batches[step + 1 :]


def test_padding_is_much_lower_than_random_batching(tmp_path: Path) -> None:
    lengths = _heavy_tail(600, seed=4)
    root = _write(tmp_path, lengths)
    B = 8
    rows = np.array(lengths) + 1  # with EOS
    groups = [rows[i : i + B] for i in range(0, rows.size, B)]
    random_pad = sum(int(g.max()) * g.size - int(g.sum()) for g in groups) / sum(
        int(g.max()) * g.size for g in groups
    )
    for window, most in ((1, 1.0), (256, 0.25)):
        ds = _pipeline(root, batch_size=B, window=window, batch_rows=1)
        batches = list(ds)
        _check_epoch(batches, lengths)
        pad = sum(b["num_padding_tokens"] for b in batches) / sum(b["input_ids"].size for b in batches)
        if window == 1:  # no look-ahead: batches of B consecutive documents, as random batching
            assert pad == pytest.approx(random_pad)
        else:
            assert pad < most * random_pad, (pad, random_pad)
    pads = {}
    for window in (1, 256):
        budget = list(_pipeline(root, max_tokens=256, window=window, batch_rows=1))
        _check_epoch(budget, lengths)
        assert all(b["input_ids"].size <= 256 for b in budget)
        pads[window] = sum(b["num_padding_tokens"] for b in budget) / sum(b["input_ids"].size for b in budget)
    assert pads[256] < 0.35 * pads[1], pads
    assert len({b["input_ids"].shape[0] for b in budget}) > 3  # short documents, more rows


def test_batch_order_is_shuffled_within_a_window(tmp_path: Path) -> None:
    lengths = _heavy_tail(200, seed=5)
    root = _write(tmp_path, lengths)
    widths = [b["input_ids"].shape[1] for b in _pipeline(root, batch_size=4, window=1000)]
    assert len(widths) == 50
    steps = np.diff(widths)
    assert (steps > 0).any() and (steps < 0).any(), "lengths rise monotonically over the window"
    assert sorted(widths) != widths
    other = [b["input_ids"].shape[1] for b in _pipeline(root, batch_size=4, window=1000, seed=1)]
    assert sorted(other) == sorted(widths) and other != widths  # the seed orders the same batches


@pytest.mark.parametrize(("before", "after"), [(2, 3), (3, 2)])
@pytest.mark.parametrize("options", [{"batch_size": 3}, {"max_tokens": 80}])
def test_elastic_resume_emits_held_documents_exactly_once(
    tmp_path: Path, before: int, after: int, options: dict
) -> None:
    lengths = _heavy_tail(150, seed=6)
    root = _write(tmp_path, lengths)
    ds = _pipeline(root, even_batches=False, **options)
    seen = stop_merge_resume(ds, before, after)
    _check_epoch(seen, lengths, max_len=ds.packer.max_len)


def _through_three_ranks(ds: Dataset) -> tuple[list[Counter], int, int, list[dict]]:
    """Run each of 3 ranks to its end: batches per epoch per rank, documents and tokens emitted, each rank's stats."""
    counts, docs, tokens, every_stats = [], 0, 0, []
    for rank in range(3):
        it = ds.iter(rank=rank, world_size=3)
        per_epoch: Counter = Counter()
        for b in it:
            per_epoch[it.state_dict()["packer"]["epoch"]] += 1
            docs += b["num_docs"]
            tokens += b["num_tokens"]
        counts.append(per_epoch)
        every_stats.append(it.stats)
    return counts, docs, tokens, every_stats


@pytest.mark.filterwarnings("ignore::arrowstream.DataLossWarning")  # estimated batch counts may drop
@pytest.mark.parametrize("counted", [True, False])
@pytest.mark.parametrize("options", [{"batch_size": 3}, {"max_tokens": 80}])
def test_even_batches_give_equal_counts_and_account_for_every_document(
    tmp_path: Path, options: dict, counted: bool
) -> None:
    lengths = _heavy_tail(200, seed=7)
    root = _write(tmp_path, lengths)
    ds = _pipeline(root, num_epochs=2, filtered=not counted, **options)
    assert ds.balance.startswith("counted" if counted else "estimated")
    counts, docs, tokens, every_stats = _through_three_ranks(ds)
    dropped_docs, dropped_tokens, padding, drained = 0, 0, 0, 0
    for stats in every_stats:
        dropped_docs += stats.get("dropped_docs", 0)
        dropped_tokens += stats.get("dropped_tokens", 0) + stats.get("truncated_tokens", 0)
        drained += stats.get("dropped_tokens", 0)
        padding += stats.get("padding_batches", 0)
    assert all(c == counts[0] for c in counts) and len(counts[0]) == 2
    assert docs + dropped_docs == 2 * len(lengths)
    assert tokens + dropped_tokens == 2 * sum(n + 1 for n in lengths)
    if counted:  # the packer run over the known lengths: nothing beyond the count
        assert dropped_docs == 0 and drained == 0
    elif "batch_size" in options:  # rows are exact and every row is a document: never short
        assert padding == 0 and dropped_docs <= 2 * 3 * 2 * options["batch_size"]


@pytest.mark.filterwarnings("ignore::arrowstream.DataLossWarning")  # estimated batch counts may drop
@pytest.mark.parametrize("counted", [True, False])
@pytest.mark.parametrize("options", [{"batch_size": 3, "max_len": 24}, {"max_tokens": 64}])
def test_even_batches_with_split_documents_give_equal_counts_and_account_for_every_token(
    tmp_path: Path, options: dict, counted: bool
) -> None:
    lengths = _heavy_tail(200, seed=7)
    root = _write(tmp_path, lengths)
    ds = _pipeline(root, num_epochs=2, filtered=not counted, long_docs="split", **options)
    assert max(lengths) + 1 > ds.packer.max_len
    counts, _, tokens, every_stats = _through_three_ranks(ds)
    dropped = sum(stats.get("dropped_tokens", 0) for stats in every_stats)
    split = sum(stats["long_docs_split"] for stats in every_stats)
    assert all(c == counts[0] for c in counts) and len(counts[0]) == 2
    assert split > 0 and tokens + dropped == 2 * sum(n + 1 for n in lengths)
    if counted:  # counted by running the bucketer (pieces included) over the known lengths: nothing dropped
        assert dropped == 0


def _check_split_epoch(batches: list, lengths: list[int], *, max_len: int, multiple: int = 1) -> None:
    """Every document comes whole, as rows of at most ``max_len`` tokens whose concatenation in emission order is it."""
    pieces: dict[int, list[np.ndarray]] = {}
    for b in batches:
        for row in _check_batch(b, multiple=multiple):
            assert row.size <= max_len
            owners = np.unique(row[row != EOS] // BASE)
            doc = int(owners[0]) - 1 if owners.size else None
            if doc is None:  # a piece holding only the EOS: the document before it in the stream
                doc = next(d for d in sorted(pieces) if sum(p.size for p in pieces[d]) == lengths[d])
            assert owners.size <= 1, f"a row mixes documents {owners.tolist()}"
            pieces.setdefault(doc, []).append(row)
    assert sorted(pieces) == list(range(len(lengths))), "a document is missing"
    for doc, rows in pieces.items():
        assert np.array_equal(np.concatenate(rows), _expected_row(doc, lengths[doc], None)), f"document {doc}"
        assert all(r.size == max_len for r in rows[:-1]), f"document {doc}: a piece before its last is short"


@pytest.mark.parametrize("options", [{"batch_size": 3, "max_len": 32}, {"max_tokens": 64}])
def test_long_documents_are_split_by_default_every_token_once_in_order(tmp_path: Path, options: dict) -> None:
    lengths = [5, 100, 7, 40, 3, 200, 31, 64, 9]  # with EOS: 101, 41, 201, 65 tokens are longer than 32 or 64
    root = _write(tmp_path, lengths, files=1)
    ds = read_parquet(root, batch_rows=2).tokenize(None, column="input_ids", eos_id=EOS).bucket(window=4, **options)
    assert ds.packer.long_docs == "split"
    it = ds.iter()
    batches = list(it)
    max_len = ds.packer.max_len
    _check_split_epoch(batches, lengths, max_len=max_len)
    long = [n + 1 for n in lengths if n + 1 > max_len]
    assert it.stats["long_docs_split"] == len(long)
    assert not it.stats.get("truncated_tokens")
    assert it.stats["tokens"] == sum(n + 1 for n in lengths)


@pytest.mark.parametrize(
    "options",
    [
        {"batch_size": 3, "max_len": 20, "long_docs": "split"},
        {"window": 1, "max_len": 16, "long_docs": "split"},
        {"batch_size": 4, "max_len": 24, "long_docs": "split", "drop_last": True, "pad_to_multiple_of": 8},
        {"max_tokens": 48, "long_docs": "split"},
    ],
)
def test_split_documents_resume_identically_at_every_step_across_epochs(tmp_path: Path, options: dict) -> None:
    root = _write(tmp_path, _heavy_tail(90, seed=1))
    ds = _pipeline(root, num_epochs=2, **options)
    assert assert_resumes_identically(ds, min_epochs=2) > 4
    assert list(ds.iter())  # (and pieces of long documents were made)
    it = ds.iter()
    for _ in it:
        pass
    assert it.stats["long_docs_split"] > 0


@pytest.mark.parametrize(("before", "after"), [(2, 3), (3, 2)])
@pytest.mark.parametrize("options", [{"batch_size": 3, "max_len": 24}, {"max_tokens": 40}])
def test_an_elastic_resume_emits_every_piece_of_split_documents_once(
    tmp_path: Path, before: int, after: int, options: dict
) -> None:
    lengths = _heavy_tail(150, seed=6)
    root = _write(tmp_path, lengths)
    ds = _pipeline(root, even_batches=False, long_docs="split", **options)
    assert max(lengths) + 1 > ds.packer.max_len
    seen = stop_merge_resume(ds, before, after)
    _check_split_epoch(seen, lengths, max_len=ds.packer.max_len)


@pytest.mark.parametrize("long_docs", ["truncate", "split"])
def test_a_long_document_held_through_a_merge_is_counted_once(tmp_path: Path, long_docs: str) -> None:
    # counted when read, a held long document was counted by the consumer that held it and again by
    # the one it was dealt to
    root = _write(tmp_path, _heavy_tail(150, seed=4, cap=200))
    ds = _pipeline(root, even_batches=False, long_docs=long_docs, max_len=32)
    keys = ("long_docs_split", "long_docs_truncated", "truncated_tokens", "tokens")
    whole, merged = counts_through_a_merge(ds, 2, 3, keys)
    assert whole[keys[0] if long_docs == "split" else keys[1]] > 5
    assert merged == whole


@pytest.mark.parametrize("seed", [1, 7])
def test_a_truncated_document_in_a_dropped_batch_is_counted_truncated_and_dropped(tmp_path: Path, seed: int) -> None:
    # drop_last drops the epoch's last, partial batch; a truncated document in it must still count its
    # truncated tokens, or they are counted nowhere (these seeds put one there)
    lengths = _heavy_tail(41, seed=seed, cap=120)
    root = _write(tmp_path, lengths, files=1)
    it = _pipeline(root, max_len=32, long_docs="truncate", drop_last=True).iter()
    for _ in it:
        pass
    stats = it.stats
    assert stats["dropped_docs"] > 0 and stats["long_docs_truncated"] > 0
    assert stats["tokens"] + stats["dropped_tokens"] + stats["truncated_tokens"] == sum(n + 1 for n in lengths)


def test_long_documents_are_truncated_or_dropped_and_counted(tmp_path: Path) -> None:
    lengths = [5, 100, 7, 40, 3]
    root = _write(tmp_path, lengths, files=1)
    it = _pipeline(root, max_len=32, long_docs="truncate").iter()
    _check_epoch(list(it), lengths, max_len=32)
    stats = it.stats
    assert (stats["long_docs_truncated"], stats["truncated_tokens"]) == (2, (101 - 32) + (41 - 32))
    assert stats["tokens"] == sum(min(n + 1, 32) for n in lengths)
    it = _pipeline(root, max_len=32, long_docs="drop").iter()
    _check_epoch(list(it), lengths, max_len=32, drop_long=True)
    stats = it.stats
    assert (stats["long_docs_dropped"], stats["long_tokens_dropped"]) == (2, 101 + 41)
    # with a token budget, a row never outgrows it: max_len defaults to max_tokens
    budget = _pipeline(root, max_tokens=48, pad_to_multiple_of=16)
    assert budget.packer.max_len == 48
    _check_epoch(list(budget), lengths, max_len=48, multiple=16)


def test_loss_mask_reaches_the_labels(tmp_path: Path) -> None:
    docs = [[11, 12, 13, 14], [21, 22], [31, 32, 33, 34, 35]]
    masks = [[0, 0, 1, 1], [1, 0], [0, 1, 1, 0, 1]]
    write_parts(
        tmp_path,
        [{"input_ids": pa.array(docs, pa.list_(pa.int32())), "mask": pa.array(masks, pa.list_(pa.int8()))}],
        row_group_size=2,
    )
    ds = read_parquet(tmp_path, batch_rows=1).tokenize(
        None, column="input_ids", add_eos=False, loss_mask="mask"
    ).bucket(batch_size=2)
    trained = {int(t) for b in ds for t in b["labels"][b["labels"] != -100]}
    assert trained == {13, 14, 21, 32, 33, 35}
    assert assert_resumes_identically(ds) == sum(1 for _ in ds) >= 2


def test_options_and_state_name_the_bucketer(tmp_path: Path) -> None:
    root = _write(tmp_path, _heavy_tail(30, seed=8))
    ds = _pipeline(root, max_tokens=64, pad_to_multiple_of=8)
    spec = ds.options()["pack"]
    assert spec["strategy"] == "bucket" and spec["max_tokens"] == 64 and spec["max_len"] == 64
    it = ds.iter()
    next(it)
    state = json.loads(json.dumps(it.state_dict()))
    with pytest.raises(StateMismatchError, match="pack.max_tokens"):
        _pipeline(root, max_tokens=32).iter(state)
    with pytest.raises(StateMismatchError, match="pack.strategy"):
        read_parquet(root, batch_rows=5).tokenize(None, column="input_ids", eos_id=EOS).pack(
            seq_len=8, batch_size=2
        ).iter(state)


def test_to_torch_gives_tensors_of_varying_shape(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    root = _write(tmp_path, _heavy_tail(40, seed=9))
    ds = _pipeline(root, batch_size=4, window=40)
    arrays = list(ds)
    tensors = list(ds.to_torch())
    assert len({t["input_ids"].shape for t in tensors}) > 1
    for a, t in zip(arrays, tensors, strict=True):
        assert t["attention_mask"].dtype == torch.int32 and t["labels"].dtype == torch.int64
        assert np.array_equal(t["input_ids"].numpy(), a["input_ids"])
    kept = next(iter(ds.to_torch(columns=["input_ids", "attention_mask"])))
    assert sorted(kept) == ["attention_mask", "input_ids"]
    with pytest.raises(ConfigError, match="`columns` must name some of the batch keys"):
        ds.to_torch(columns=["segment_ids"])


def test_options_are_checked(tmp_path: Path) -> None:
    root = _write(tmp_path, [3, 4])
    base = read_parquet(root).tokenize(None, column="input_ids", eos_id=EOS)
    with pytest.raises(ConfigError, match="exactly one of `batch_size`.*got both"):
        base.bucket(batch_size=2, max_tokens=64)
    with pytest.raises(ConfigError, match="exactly one of `batch_size`.*got neither"):
        base.bucket()
    with pytest.raises(ConfigError, match="`.pack` and `.bucket` are alternatives"):
        base.pack(seq_len=8, batch_size=2).bucket(batch_size=2)
    with pytest.raises(ConfigError, match="`.pack` and `.bucket` are alternatives"):
        base.bucket(batch_size=2).pack(seq_len=8, batch_size=2)
    with pytest.raises(ConfigError, match="`.bucket` needs tokens"):
        read_parquet(root).bucket(batch_size=2)
    with pytest.raises(ConfigError, match="`long_docs` must be one of \\['split', 'truncate', 'drop'\\]"):
        base.bucket(batch_size=2, long_docs="cut")
    base.bucket(max_tokens=64, max_len=60, pad_to_multiple_of=32)  # 60 pads to 64: fits
    with pytest.raises(ConfigError, match="`max_len` must fit one row in `max_tokens` \\(64\\)"):
        base.bucket(max_tokens=64, max_len=65, pad_to_multiple_of=32)
    with pytest.raises(ConfigError, match="`pad_to_multiple_of` \\(128\\) is larger than `max_tokens`"):
        base.bucket(max_tokens=64, pad_to_multiple_of=128)
    with pytest.raises(ConfigError, match="`batch_size` must be a positive int, got 0"):
        base.bucket(batch_size=0)


def test_truncated_documents_leave_the_store_once_they_go_out(tmp_path: Path) -> None:
    # a truncated document's one piece never reached its document's end, so the store kept it for the rest of the
    # epoch: 7,583 documents held at batch 2,000 where the state named 430, and every snapshot copied their sizes
    rng = np.random.default_rng(5)
    root = _write(tmp_path, [int(n) for n in rng.integers(5, 80, size=1200)], files=2, rg=50)
    ds = read_parquet(root).tokenize(None, column="input_ids", eos_id=EOS)
    it = ds.bucket(batch_size=4, window=32, max_len=24, long_docs="truncate").iter()
    held = []
    for step, _ in enumerate(it):
        if step % 25 == 0:
            held.append(len(it._run.store))  # the run's own store: what a snapshot copies
    assert it.stats["long_docs_truncated"] > 500 and len(held) > 8
    assert max(held) <= 2 * 32 + 50, held  # about a window and a read batch, whatever the step


def _cut_reference(lengths: list[int], max_tokens: int, multiple: int) -> list[list[int]]:
    """The token-budget cut in plain Python: sort by length (stable), grow each batch while rows x width fit."""
    order = sorted(range(len(lengths)), key=lambda k: lengths[k])
    width = [max(1, -(-lengths[k] // multiple)) * multiple for k in order]
    batches, i = [], 0
    while i < len(order):
        j = i + 1
        while j < len(order) and (j - i + 1) * width[j] <= max_tokens:
            j += 1
        batches.append(order[i:j])
        i = j
    return batches


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 70), max_size=60),
    st.sampled_from([1, 4, 8]),
    st.integers(8, 200),
    st.booleans(),
)
def test_a_token_budget_plan_cuts_as_the_plain_python_reference(
    lengths: list[int], multiple: int, max_tokens: int, final: bool
) -> None:
    packer = BucketPacker(max_tokens=max_tokens, pad_to_multiple_of=multiple)
    batches, left = packer.plan(lengths, final=final)
    cut = len(lengths) - len(left)
    assert left == list(range(cut, len(lengths)))  # what waits is the newest documents
    assert batches == _cut_reference(lengths[:cut], max_tokens, multiple)


def test_a_batch_that_fills_the_budget_exactly_takes_its_last_document() -> None:
    # sorted 2, 2, 2, 2, 4, 4: four rows of 2 make 8 tokens, two rows of 4 make 8
    assert BucketPacker(max_tokens=8).plan([4, 4, 2, 2, 2, 2], final=True) == ([[2, 3, 4, 5], [0, 1]], [])
