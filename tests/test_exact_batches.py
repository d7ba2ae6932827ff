"""Even batches counted, not estimated, when every consumer's tokens are known before the epoch."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from tokenizers import Tokenizer

from arrowstream import read_parquet
from arrowstream.pipeline.plan import Plan
from arrowstream.testing import assert_resumes_identically

from .conftest import heavy_tail, named_docs, write_parts


def _ids(tmp_path: Path, n: int = 200) -> Path:
    docs = named_docs(heavy_tail(n, seed=3, cap=60))
    parts = [{"input_ids": pa.array(docs[a : a + 50], pa.list_(pa.int32()))} for a in range(0, n, 50)]
    write_parts(tmp_path, parts, row_group_size=10)
    return tmp_path


def _targets(ds, world: int) -> list[int]:
    return [ds.iter(rank=r, world_size=world).state_dict()["packer"]["target"] for r in range(world)]


def test_whole_row_groups_are_counted_from_the_footers(tmp_path: Path) -> None:
    ds = read_parquet(_ids(tmp_path)).tokenize(None, column="input_ids", eos_id=0).pack(seq_len=16, batch_size=2)
    plan = Plan.of(ds)
    targets = _targets(ds, 4)
    assert len(set(targets)) == 1 and targets[0] > 0
    # 20 row groups: the footers weigh them, and only the row group each of the 3 cuts falls in is read
    assert plan.token_counts is not None and 1 <= plan.token_counts.num_reads <= 3
    before = plan.token_counts.num_reads
    _targets(ds, 2)  # one more cut
    assert plan.token_counts.num_reads <= before + 1


def test_shuffled_row_ranges_count_the_rows_they_hold(tmp_path: Path) -> None:
    ds = read_parquet(_ids(tmp_path)).shuffle(seed=1, window=2)
    ds = ds.tokenize(None, column="input_ids", eos_id=0).pack(seq_len=16, batch_size=2)
    _targets(ds, 3)
    counts = Plan.of(ds).token_counts
    assert counts is not None and counts.num_reads == 20  # half row groups: every row group's rows


def test_tokens_are_not_counted_behind_a_filter(tmp_path: Path) -> None:
    ds = read_parquet(_ids(tmp_path)).filter(pc.field("input_ids").is_valid())
    ds = ds.tokenize(None, column="input_ids", eos_id=0).pack(seq_len=16, batch_size=2)
    assert Plan.of(ds).token_counts is None  # a filter may drop rows nobody can count ahead


STRATEGIES = {
    "concat": lambda ds: ds.pack(seq_len=16, batch_size=2),
    "best_fit": lambda ds: ds.pack(seq_len=16, batch_size=2, strategy="best_fit", window=12),
    "bucket batch_size": lambda ds: ds.bucket(batch_size=3, window=12),
    "bucket max_tokens": lambda ds: ds.bucket(max_tokens=96, window=12),
}


def _every_consumer(ds, world: int, workers: int) -> tuple[Counter, list[int], list[Counter]]:
    """Run every consumer (rank x worker) to its end: the tokens emitted, each rank's steps and counters."""
    seen: Counter = Counter()
    steps, stats = [], []
    for rank in range(world):
        steps.append(0)
        stats.append(Counter())
        for worker in range(workers):
            it = ds.iter(rank=rank, world_size=world, worker=worker, num_workers=workers)
            for batch in it:
                steps[-1] += 1
                seen.update(_emitted(batch))
            stats[-1].update(it.stats)
    return seen, steps, stats


def _emitted(batch) -> list[int]:
    ids, labels = batch["input_ids"], batch["labels"]
    real = batch["segment_ids"] > 0 if "segment_ids" in batch else batch["attention_mask"] > 0
    return ids[real & (ids > 0)].tolist() if labels is not None else []


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("workers", [1, 2])  # DataLoader workers: none (the rank's own process), or 2
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_strategy_counts_exactly_and_drops_nothing(
    tmp_path: Path, strategy: str, shuffle: bool, world: int, workers: int
) -> None:
    from .conftest import heavy_tail, named_docs

    docs = named_docs(heavy_tail(200, seed=3, cap=60))
    ds = read_parquet(_ids(tmp_path), batch_rows=8)
    if shuffle:
        ds = ds.shuffle(seed=5, window=2)
    ds = STRATEGIES[strategy](ds.tokenize(None, column="input_ids", eos_id=0))
    assert ds.balance.startswith("counted: token ids")
    seen, steps, stats = _every_consumer(ds, world, workers)
    assert sum(s["dropped_docs"] + s["dropped_tokens"] for s in stats) == 0
    assert seen == Counter(t for doc in docs for t in doc)  # every document's tokens, once
    assert len(set(steps)) == 1  # every rank takes the same steps


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize(("world", "workers"), [(8, 1), (4, 2), (3, 3)])
def test_fewer_batches_than_consumers_start_fresh_and_pad(tmp_path: Path, strategy: str, world: int, workers: int) -> None:
    """An evaluation set smaller than the job: consumers with no token pad to the others' count, from a fresh start."""
    docs = named_docs([20, 9, 14])  # 46 tokens with their EOS: 2 batches of 32 tokens at most
    write_parts(tmp_path, [{"input_ids": pa.array(docs, pa.list_(pa.int32()))}], row_group_size=2)
    ds = STRATEGIES[strategy](read_parquet(tmp_path).tokenize(None, column="input_ids", eos_id=0))
    seen, steps, _ = _every_consumer(ds, world, workers)
    assert seen == Counter(t for doc in docs for t in doc)  # every token once
    assert len(set(steps)) == 1 and steps[0] >= 1  # every rank takes the same steps
    empty = next(c for c in range(world * workers)  # a consumer with no document resumes too
                 if ds.iter(rank=c // workers, world_size=world, worker=c % workers,
                            num_workers=workers).state_dict()["work"]["segments"][0][1:3] == [0, 0])
    assert assert_resumes_identically(
        lambda: ds.iter(rank=empty // workers, world_size=world, worker=empty % workers, num_workers=workers)
    ) >= 0


def test_text_is_estimated(tmp_path: Path, tokenizer: Tokenizer) -> None:
    write_parts(tmp_path, [{"text": ["some words here"] * 30}], row_group_size=10)
    assert Plan.of(read_parquet(tmp_path).tokenize(tokenizer).pack(seq_len=16, batch_size=2)).token_counts is None


@pytest.mark.parametrize("shuffle", [False, True])
def test_counted_even_batches_resume_exactly(tmp_path: Path, shuffle: bool) -> None:
    ds = read_parquet(_ids(tmp_path), num_epochs=2)
    if shuffle:
        ds = ds.shuffle(seed=4, window=3)
    ds = ds.tokenize(None, column="input_ids", eos_id=0).pack(seq_len=16, batch_size=2)
    assert assert_resumes_identically(lambda: ds.iter(rank=2, world_size=3), min_epochs=2) > 10


def _texts(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    words = ["alpha", "beta gamma", "delta epsilon zeta eta", "theta"]
    texts = [" ".join(words[: 1 + i % 4]) * (1 + i % 5) for i in range(120)]
    write_parts(root, [{"text": texts[:60]}, {"text": texts[60:]}], row_group_size=10)
    return root


def test_a_complete_read_only_token_cache_counts_text_exactly(tmp_path: Path, tokenizer: Tokenizer) -> None:
    root, cache = _texts(tmp_path), tmp_path / "cache"

    def build(even_batches: bool = True, **options):
        ds = read_parquet(root).tokenize(tokenizer, cache=cache, **options)
        return ds.pack(seq_len=16, batch_size=2, even_batches=even_batches)

    assert Plan.of(build()).token_counts is None  # a writable cache fills as consumers run
    list(build())  # fills the cache
    assert Plan.of(build(cache_write=False)).token_counts is not None
    ds = build(cache_write=False)
    reference = [t for b in build(even_batches=False) for t in b["input_ids"][b["segment_ids"] > 0].tolist()]
    counts, emitted, dropped = [], [], 0
    for rank in range(3):
        it = ds.iter(rank=rank, world_size=3)
        batches = list(it)
        counts.append(len(batches))
        emitted += [t for b in batches for t in b["input_ids"][b["segment_ids"] > 0].tolist()]
        dropped += it.stats["dropped_tokens"]
    assert len(set(counts)) == 1 and dropped == 0
    assert sorted(emitted) == sorted(reference)  # every token of the epoch, once
    # the entries' footers weigh the 12 row groups; only the entries the 2 cuts fall in are read
    assert Plan.of(ds).token_counts.num_reads <= 2


def test_an_incomplete_read_only_cache_is_estimated(tmp_path: Path, tokenizer: Tokenizer) -> None:
    root, cache = _texts(tmp_path), tmp_path / "cache"
    it = read_parquet(root).tokenize(tokenizer, cache=cache).iter()
    next(it)  # one chunk: some row groups kept, not all
    it.close()
    ds = read_parquet(root).tokenize(tokenizer, cache=cache, cache_write=False).pack(seq_len=16, batch_size=2)
    assert Plan.of(ds).token_counts is None


def test_the_dataset_says_how_batch_counts_are_made_equal(tmp_path: Path, tokenizer: Tokenizer) -> None:
    ids = read_parquet(_ids(tmp_path / "ids")).tokenize(None, column="input_ids", eos_id=0)
    assert ids.pack(seq_len=16, batch_size=2).balance.startswith("counted: token ids")
    assert ids.pack(seq_len=16, batch_size=2, even_batches=False).balance == "off: even_batches=False"
    assert ids.bucket(batch_size=2).balance == (
        "counted: token ids (whole row groups from the footers; batches by running bucket on the lengths, "
        "from a length index where there is one, else read)"
    )
    no_index = read_parquet(_ids(tmp_path / "ids")).tokenize(None, column="input_ids", eos_id=0, length_index=False)
    assert no_index.bucket(batch_size=2).balance.endswith("batches by running bucket on the lengths)")
    root, cache = _texts(tmp_path), tmp_path / "cache"
    text = read_parquet(root).tokenize(tokenizer, cache=cache)
    assert "arrowstream cache" in text.pack(seq_len=16, batch_size=2).balance
    list(text)
    counted = read_parquet(root).tokenize(tokenizer, cache=cache, cache_write=False).pack(seq_len=16, batch_size=2)
    assert counted.balance == "counted: a read-only token cache (whole row groups from the footers)"
    filtered = read_parquet(root).filter(pc.field("text") != "").tokenize(tokenizer).pack(seq_len=16, batch_size=2)
    assert filtered.balance.startswith("estimated:")


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize(("world", "workers"), [(2, 1), (3, 1), (4, 1), (2, 2), (3, 2), (2, 3)])
@pytest.mark.parametrize(("seq_len", "batch_size"), [(64, 4), (8, 2)])
def test_concat_shares_of_whole_batches_pad_a_rank_at_most_once(
    tmp_path: Path, shuffle: bool, world: int, workers: int, seq_len: int, batch_size: int
) -> None:
    docs = named_docs(heavy_tail(200, seed=3, cap=60))
    ds = read_parquet(_ids(tmp_path), batch_rows=8)
    if shuffle:
        ds = ds.shuffle(seed=6, window=2)
    # batches of 256 tokens, or of 16: then documents (up to 61 tokens) span several shares
    ds = ds.tokenize(None, column="input_ids", eos_id=0).pack(seq_len=seq_len, batch_size=batch_size)
    seen, per_rank, stats = _every_consumer(ds, world, workers)
    rank_padding = [s["padding_batches"] for s in stats]
    totals = sum(stats, Counter())
    assert len(set(per_rank)) == 1  # every rank takes the same steps
    assert max(rank_padding) <= 1, rank_padding  # whole batches per share: a rank pads once at most
    assert seen == Counter(t for doc in docs for t in doc)  # every token once, split documents too
    assert totals["rows"] == totals["docs"] == 200 and totals["dropped_tokens"] == 0  # a split row counts once
    # the real batches are the fewest the tokens fill: only the epoch's last batch is partial
    assert sum(per_rank) - sum(rank_padding) == -(-totals["tokens"] // (seq_len * batch_size))
    assert ds.iter(rank=0, world_size=world).state_dict()["work"]["by"] == "batches"


@pytest.mark.parametrize("shuffle", [False, True])
def test_shares_that_begin_inside_a_document_resume_exactly(tmp_path: Path, shuffle: bool) -> None:
    ds = read_parquet(_ids(tmp_path), num_epochs=2, batch_rows=8)
    if shuffle:
        ds = ds.shuffle(seed=4, window=3)
    ds = ds.tokenize(None, column="input_ids", eos_id=0).pack(seq_len=8, batch_size=2)
    def split(consumer: int) -> bool:  # a share that begins or ends inside a document
        segments = ds.iter(rank=consumer // 2, world_size=2, worker=consumer % 2, num_workers=2).state_dict()["work"]["segments"]
        return segments[0][3] > 0 or len(segments[-1]) == 5

    consumers = [c for c in range(4) if split(c)]
    assert len(consumers) >= 2
    for consumer in consumers[:2]:
        steps = assert_resumes_identically(
            lambda: ds.iter(rank=consumer // 2, world_size=2, worker=consumer % 2, num_workers=2),
            min_epochs=2,
        )
        assert steps > 10


def test_a_drop_at_an_estimated_count_is_never_silent(tmp_path: Path) -> None:
    from arrowstream import DataLossWarning

    ds = read_parquet(_ids(tmp_path)).filter(pc.field("input_ids").is_valid())  # batch counts estimated
    ds = ds.tokenize(None, column="input_ids", eos_id=0).pack(seq_len=16, batch_size=2, strategy="best_fit", window=16)
    dropped = 0
    with pytest.warns(DataLossWarning, match=r"[\d,]+ token\(s\) dropped \([\d,]+ whole document\(s\); other tokens dropped are the ends") as caught:
        for rank in range(3):
            it = ds.iter(rank=rank, world_size=3)
            list(it)
            dropped += it.stats["dropped_tokens"]
    assert dropped > 0 and len(caught) >= 1
    assert "ds.balance" in str(caught[0].message)


def test_estimated_shares_hold_equal_estimated_tokens_and_bucket_by_documents_equal_rows(
    tmp_path: Path, tokenizer: Tokenizer
) -> None:
    root = _texts(tmp_path)
    text = read_parquet(root).tokenize(tokenizer)
    state = text.pack(seq_len=16, batch_size=2).iter(rank=0, world_size=3).state_dict()
    assert state["work"]["by"] == "estimate"
    assert text.bucket(batch_size=4).iter(rank=0, world_size=3).state_dict()["work"]["by"] == "rows"
    assert text.bucket(max_tokens=64).iter(rank=0, world_size=3).state_dict()["work"]["by"] == "estimate"


def test_the_token_rate_sample_weighs_its_rows_by_their_bytes(tmp_path: Path, tokenizer: Tokenizer) -> None:
    # each row group starts with short documents and ends with long ones (the same tokens per byte):
    # its first rows are not its average rows, so taking them as a plain share of the row group's
    # bytes gives 2.5 times too many bytes, and too low a rate
    texts = [("word " * (50 if i % 400 < 200 else 200)).strip() for i in range(3200)]
    write_parts(tmp_path, [{"text": texts}], row_group_size=400)  # 8 row groups: 128 rows sampled of each
    ds = read_parquet(tmp_path).tokenize(tokenizer).pack(seq_len=16, batch_size=2)
    plan = Plan.of(ds)
    sample = plan.sample()
    tokens = sum(int(b["num_tokens"]) for b in read_parquet(tmp_path).tokenize(tokenizer).pack(seq_len=16, batch_size=2))
    true_rate = tokens / float(plan.read_bytes().sum())
    assert abs(sample.token_rate / true_rate - 1) < 0.15, (sample.token_rate, true_rate)


def test_counting_keeps_a_few_row_groups_of_counts_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import arrowstream.distributed.tokens as tokens

    monkeypatch.setattr(tokens, "KEPT_SHARDS", 3)
    ds = read_parquet(_ids(tmp_path)).shuffle(seed=2, window=2)
    ds = ds.tokenize(None, column="input_ids", eos_id=0).pack(seq_len=64, batch_size=4)
    counts, dropped = [], 0
    for rank in range(3):
        it = ds.iter(rank=rank, world_size=3)
        counts.append(sum(1 for _ in it))
        dropped += it.stats["dropped_tokens"]
    assert len(set(counts)) == 1 and dropped == 0  # still exact
    assert len(Plan.of(ds).token_counts._lengths) <= 3  # flat memory, whatever the corpus


@pytest.mark.parametrize(("world", "workers"), [(3, 2), (4, 2), (2, 3)])
def test_a_ranks_workers_end_when_their_data_does_and_the_rank_pads_once(
    tmp_path: Path, world: int, workers: int
) -> None:
    # best_fit is counted by packing the shares' documents (cut between documents): the workers'
    # own batch counts differ
    ds = read_parquet(_ids(tmp_path)).tokenize(None, column="input_ids", eos_id=0)
    ds = ds.pack(seq_len=16, batch_size=2, strategy="best_fit", window=12)
    counts, natural, dropped = [], [], 0
    for rank in range(world):
        for worker in range(workers):
            it = ds.iter(rank=rank, world_size=world, worker=worker, num_workers=workers)
            counts.append(sum(1 for _ in it))
            natural.append(counts[-1] - it.stats["padding_batches"])
            dropped += it.stats["dropped_tokens"]
    ranks = [sum(counts[r * workers : (r + 1) * workers]) for r in range(world)]
    assert len(set(ranks)) == 1 and dropped == 0  # DDP needs equal steps per rank, and nothing is dropped
    assert len(set(counts)) > 1  # workers of a rank may end at different times
    # the rank's padding, not each worker's: never more than padding every worker to the largest count
    padding = ranks[0] * world - sum(natural)
    assert padding < max(natural) * len(natural) - sum(natural), (counts, natural)
    # and spread over the rank's workers with the fewest batches first
    for r in range(world):
        own = counts[r * workers : (r + 1) * workers]
        nat = natural[r * workers : (r + 1) * workers]
        assert max(own) - min(own) <= max(max(nat) - min(nat), 1)


@pytest.mark.parametrize("strategy", ["best_fit", "bucket batch_size", "bucket max_tokens"])
def test_counted_packings_resume_exactly(tmp_path: Path, strategy: str) -> None:
    root = _ids(tmp_path)

    def build():
        ds = read_parquet(root, num_epochs=2, batch_rows=8).shuffle(seed=4, window=3)
        return STRATEGIES[strategy](ds.tokenize(None, column="input_ids", eos_id=0))

    assert build().balance.startswith("counted")
    steps = assert_resumes_identically(lambda: build().iter(rank=1, world_size=3), every=3, min_epochs=2)
    assert steps > 10


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize(("before", "after"), [(4, 3), (2, 4), (1, 2)])
def test_counted_batches_hold_after_elastic_resumes_over_two_epochs(
    tmp_path: Path, strategy: str, before: int, after: int
) -> None:
    import json
    from arrowstream import merge_states

    from .conftest import heavy_tail, named_docs

    docs = named_docs(heavy_tail(200, seed=3, cap=60))
    ds = read_parquet(_ids(tmp_path), batch_rows=8, num_epochs=2).shuffle(seed=5, window=2)
    ds = STRATEGIES[strategy](ds.tokenize(None, column="input_ids", eos_id=0))
    seen: Counter = Counter()
    states = []
    for rank in range(before):  # uneven progress, some into the second epoch
        it = ds.iter(rank=rank, world_size=before)
        for _, batch in zip(range(3 + 5 * rank), it):
            seen.update(_emitted(batch))
        states.append(json.loads(json.dumps(it.state_dict())))
    merged = json.loads(json.dumps(merge_states(states)))
    steps, dropped, padding = [], 0, []
    for rank in range(after):
        it = ds.iter(merged, rank=rank, world_size=after)
        batches = list(it)
        steps.append(len(batches))
        for batch in batches:
            seen.update(_emitted(batch))
        dropped += it.stats["dropped_docs"] + it.stats["dropped_tokens"]
        padding += [e["padding_batches"] for e in it.epoch_stats.values()]
    assert dropped == 0
    if strategy == "concat":  # the rest of the epoch is re-dealt in whole batches too
        assert max(padding) <= 1, padding
    assert seen == Counter({t: 2 * n for t, n in Counter(t for doc in docs for t in doc).items()})
    assert len(set(steps)) == 1  # every rank of the new topology takes the same steps


def test_files_that_differ_in_tokens_per_byte_are_estimated_each_with_its_own_rate(
    tmp_path: Path, tokenizer: Tokenizer
) -> None:
    import warnings

    import numpy as np

    from arrowstream import DataLossWarning
    from arrowstream.distributed.balance import token_estimates
    from arrowstream.testing.texts import make_texts

    rng = np.random.default_rng(0)
    alphabet = np.array(list("abcdefghijklmnopqrstuvwxyz0123456789"))
    parts = []
    for f in range(4):  # prose, identifiers, prose, identifiers: a few times the tokens per byte
        texts = make_texts(300, seed=f, mean_log_words=3.0)
        if f % 2:
            texts = [" ".join("".join(rng.choice(alphabet, len(w))) for w in t.split()) for t in texts]
        parts.append({"text": texts})
    write_parts(tmp_path, parts, row_group_size=50)
    ds = read_parquet(tmp_path).tokenize(tokenizer).pack(seq_len=64, batch_size=2)
    plan = Plan.of(ds)
    sample = plan.sample()
    estimates = plan.estimated_tokens()
    true = np.array([
        sum(len(e.ids) + 1 for e in tokenizer.encode_batch(plan.make_reader().read(s).column("text").to_pylist()))
        for s in range(ds.manifest.num_shards)
    ])
    # every file's estimate within 10 % of its tokens; one rate for all is off by far more
    files = ds.manifest.shard_file
    per_file = np.bincount(files, estimates) / np.bincount(files, true)
    assert np.abs(per_file - 1).max() < 0.1, np.round(per_file, 2)
    one_rate = np.bincount(files, plan.read_bytes() * sample.token_rate) / np.bincount(files, true)
    assert np.abs(one_rate - 1).max() > 0.25, np.round(one_rate, 2)
    # the sample of a shard's own file is preferred to a nearer one of another file
    own = token_estimates(np.arange(4), type(sample)(4, 4.0, 4, np.ones(4), shards=np.array([0, 3]),
                          rates=np.array([1.0, 3.0])), np.ones(4), shard_file=np.array([0, 0, 0, 1]))
    assert own.tolist() == [1.0, 1.0, 1.0, 3.0]
    dropped = total = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataLossWarning)
        for rank in range(3):
            it = ds.iter(rank=rank, world_size=3)
            list(it)
            dropped += it.stats["dropped_tokens"]
            total += it.stats["tokens"] + it.stats["dropped_tokens"]
    assert dropped / total < 0.05, dropped / total  # one rate for all dropped about a fifth here
