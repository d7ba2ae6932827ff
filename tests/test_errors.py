"""Bad input gets a clear error naming file, row group and column, or a counted skip."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer, models

from arrowstream import (
    ArrowStreamError,
    ConfigError,
    SchemaError,
    ShardError,
    StateError,
    StateMismatchError,
    read_parquet,
)

from .conftest import write_parts


def _corrupt_data_pages(path: Path) -> None:
    meta = pq.read_metadata(path)
    col = meta.row_group(1).column(0)
    start = col.data_page_offset
    data = bytearray(path.read_bytes())
    for i in range(start + 8, start + col.total_compressed_size - 2):
        data[i] = (data[i] * 7 + 13) % 256
    path.write_bytes(bytes(data))


def test_corrupt_row_group_names_file_row_group_and_column(tmp_path: Path) -> None:
    texts = [f"document number {i} " * 20 for i in range(40)]
    [path] = write_parts(tmp_path, [{"text": texts}], row_group_size=10)
    _corrupt_data_pages(path)
    ds = read_parquet(tmp_path)  # the footer is intact
    with pytest.raises((ShardError, SchemaError)) as info:
        for _ in ds:
            pass
    message = str(info.value)
    assert "part-000.parquet" in message and "row group 1" in message and "text" in message


def test_file_changed_after_opening_is_detected(tmp_path: Path) -> None:
    [path] = write_parts(tmp_path, [{"text": ["a", "b", "c", "d"]}], row_group_size=2)
    ds = read_parquet(tmp_path)
    pq.write_table(pa.table({"text": ["a", "b", "c"]}), path, row_group_size=3)
    with pytest.raises(ShardError, match="part-000.parquet"):
        list(ds)


def test_text_column_of_wrong_type_is_a_schema_error(tmp_path: Path, tokenizer: Tokenizer) -> None:
    write_parts(tmp_path, [{"text": [1, 2]}])
    with pytest.raises(SchemaError, match=r"`text` has type int64.*part-000.parquet"):
        read_parquet(tmp_path).tokenize(tokenizer)


@pytest.mark.parametrize(
    ("values", "advice"),
    [
        (pa.array([b"a", b"b"], pa.large_binary()), "holds bytes, not text"),
        (pa.array(["a", "b"]).dictionary_encode(), "dictionary-encoded"),
        (pa.array([[1], [2]], pa.list_(pa.int32())), r"token ids use `\.tokenize\(None"),
    ],
)
def test_a_text_column_of_another_type_says_what_to_do_with_it(
    tmp_path: Path, tokenizer: Tokenizer, values: pa.Array, advice: str
) -> None:
    pq.write_table(pa.table({"text": values}), tmp_path / "part-000.parquet")
    with pytest.raises(SchemaError, match=r"`text` has type .*part-000.parquet.*needs text \(string\); .*" + advice):
        read_parquet(tmp_path).tokenize(tokenizer)


def _not_utf8(tmp_path: Path) -> Path:
    """A string column whose row 6 (row 1 of row group 1) holds a byte that is not UTF-8 (pyarrow writes it as is)."""
    raw = [b"good text"] * 5 + [b"bad \xff bytes"] + [b"more words"] * 4
    offsets = pa.py_buffer(np.cumsum([0] + [len(r) for r in raw]).astype(np.int32).tobytes())
    values = pa.Array.from_buffers(pa.string(), len(raw), [None, offsets, pa.py_buffer(b"".join(raw))])
    pq.write_table(pa.table({"text": values}), tmp_path / "part-000.parquet", row_group_size=4)
    return tmp_path


def test_text_that_is_not_utf8_names_file_row_group_column_and_row(tmp_path: Path, tokenizer: Tokenizer) -> None:
    from arrowstream.analysis import analyze

    root = _not_utf8(tmp_path)
    with pytest.raises(SchemaError, match=r"part-000\.parquet', row group 1, rows 0\.\.3: column `text` holds bytes "
                       r"that are not UTF-8 text in row 1 \(byte 4 of the document: invalid start byte\)"):
        list(read_parquet(root).tokenize(tokenizer).pack(seq_len=32, batch_size=1))
    with pytest.raises(SchemaError, match=r"shuffle window over .*row group 1.*not UTF-8 text in document \d"):
        list(read_parquet(root).shuffle(seed=1, window=2).tokenize(tokenizer).pack(seq_len=32, batch_size=1))
    for tok in (tokenizer, None):  # polars refuses the file; read row group by row group, the bytes are named
        with pytest.raises(SchemaError, match=r"cannot measure column `text` of '.*part-000\.parquet', row group 1: "
                           r".*not UTF-8"):
            analyze(root, tokenizer=tok)


def test_token_column_of_wrong_type_is_a_schema_error(tmp_path: Path) -> None:
    write_parts(tmp_path, [{"input_ids": ["a", "b"]}])
    with pytest.raises(SchemaError, match="token ids"):
        read_parquet(tmp_path).tokenize(None, column="input_ids", eos_id=0)


def test_missing_text_column_is_a_schema_error(tmp_path: Path, tokenizer: Tokenizer) -> None:
    write_parts(tmp_path, [{"body": ["a"]}])
    with pytest.raises(SchemaError, match="`text` is not among"):
        read_parquet(tmp_path).tokenize(tokenizer)


def test_token_ids_out_of_int32_range_are_an_error(tmp_path: Path) -> None:
    write_parts(tmp_path, [{"input_ids": pa.array([[1, 2**40]], pa.list_(pa.int64()))}])
    ds = read_parquet(tmp_path).tokenize(None, column="input_ids", eos_id=0)
    with pytest.raises(SchemaError, match="int32"):
        list(ds)


def test_nulls_and_empty_texts_are_counted_skips(tmp_path: Path, tokenizer: Tokenizer) -> None:
    write_parts(tmp_path, [{"text": ["a b", None, "", "c", None]}])
    it = read_parquet(tmp_path).tokenize(tokenizer).iter()
    out = [t for b in it for t in b.column("text").to_pylist()]
    assert out == ["a b", "c"]
    stats = it.state_dict()["stats"]
    assert (stats["rows"], stats["docs"], stats["null"], stats["empty"]) == (5, 2, 2, 1)


def test_tokenizer_path_that_does_not_exist(tmp_path: Path) -> None:
    write_parts(tmp_path, [{"text": ["a"]}])
    with pytest.raises(ConfigError, match="does not exist"):
        read_parquet(tmp_path).tokenize(tmp_path / "missing.json")


def test_tokenizer_path_is_loaded(tmp_path: Path, tokenizer_path: Path, tokenizer: Tokenizer) -> None:
    write_parts(tmp_path, [{"text": ["hello world"]}])
    [batch] = list(read_parquet(tmp_path).tokenize(tokenizer_path))
    assert batch.column("input_ids").to_pylist()[0][:-1] == tokenizer.encode("hello world").ids


def test_tokenizer_without_eos_needs_eos_id(tmp_path: Path) -> None:
    write_parts(tmp_path, [{"text": ["a"]}])
    bare = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    with pytest.raises(ConfigError, match="eos_id"):
        read_parquet(tmp_path).tokenize(bare)
    [batch] = list(read_parquet(tmp_path).tokenize(bare, add_eos=False))
    assert batch.column("input_ids").to_pylist() == [[0]]
    [batch] = list(read_parquet(tmp_path).tokenize(bare, eos_id=1))
    assert batch.column("input_ids").to_pylist() == [[0, 1]]
    # an id past the vocabulary would reach the model's embedding (a device-side assert there)
    with pytest.raises(ConfigError, match=r"`eos_id=2` is past the tokenizer's largest id, 1:"):
        read_parquet(tmp_path).tokenize(bare, eos_id=2)


def test_eos_id_check_allows_tokenizers_whose_ids_have_gaps(tmp_path: Path) -> None:
    # two entries, ids 0 and 5: the entry count (2) is not the largest id plus one
    write_parts(tmp_path, [{"text": ["a"]}])
    gaps = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 5}, unk_token="[UNK]"))
    [batch] = list(read_parquet(tmp_path).tokenize(gaps, eos_id=5))
    assert batch.column("input_ids").to_pylist() == [[0, 5]]
    [batch] = list(read_parquet(tmp_path).tokenize(gaps, eos_id=3))  # in a gap: the embedding has the row
    assert batch.column("input_ids").to_pylist() == [[0, 3]]
    with pytest.raises(ConfigError, match=r"`eos_id=6` is past the tokenizer's largest id, 5:"):
        read_parquet(tmp_path).tokenize(gaps, eos_id=6)


def test_state_from_other_data_is_refused(tmp_path: Path) -> None:
    write_parts(tmp_path / "a", [{"text": ["a", "b"]}])
    write_parts(tmp_path / "b", [{"text": ["a", "b", "c"]}])
    it = read_parquet(tmp_path / "a").iter()
    next(it)
    state = json.loads(json.dumps(it.state_dict()))
    with pytest.raises(StateMismatchError, match="other data.*1 file.*2 row"):
        read_parquet(tmp_path / "b").iter(state)


def test_state_with_other_options_says_what_differs(tmp_path: Path) -> None:
    write_parts(tmp_path, [{"input_ids": pa.array([[1, 2, 3]] * 9, pa.list_(pa.int32()))}])
    base = read_parquet(tmp_path).tokenize(None, column="input_ids", eos_id=0)
    it = base.pack(seq_len=4, batch_size=1).iter()
    next(it)
    state = it.state_dict()
    with pytest.raises(StateMismatchError, match=r"`pack.seq_len` was 4, now 8"):
        base.pack(seq_len=8, batch_size=1).iter(state)


def test_a_changed_strategy_is_named_first_and_the_implied_options_counted(tmp_path: Path) -> None:
    write_parts(tmp_path, [{"input_ids": pa.array([[1, 2, 3]] * 9, pa.list_(pa.int32()))}])
    base = read_parquet(tmp_path).tokenize(None, column="input_ids", eos_id=0)
    it = base.pack(seq_len=4, batch_size=1).iter()
    next(it)
    with pytest.raises(StateMismatchError, match=r"options: `pack.strategy` was 'concat', now 'best_fit'; .*and \d+ more\."):
        base.pack(seq_len=4, batch_size=1, strategy="best_fit").iter(it.state_dict())


def test_malformed_and_foreign_states_are_state_errors(tmp_path: Path) -> None:
    write_parts(tmp_path, [{"text": ["a", "b"]}])
    ds = read_parquet(tmp_path)
    sealed = ds.iter().state_dict()
    with pytest.raises(StateError, match="the state was changed after it was saved: its checksum"):
        ds.iter({**sealed, "position": {**sealed["position"], "seq": 1}})  # any edit: well-formed or not
    # the checks below the checksum, as for a state saved before checksums (version 7; version 8 needs one)
    good = {**{k: v for k, v in sealed.items() if k != "checksum"}, "version": 7}
    with pytest.raises(StateError, match="expected an arrowstream state"):
        ds.iter({"epoch": 3})
    with pytest.raises(StateError, match="got 'an empty dict'"):
        ds.iter({})
    with pytest.raises(StateError, match="version"):
        ds.iter({**good, "version": 99})
    bad_pos = {**good, "position": {**good["position"], "seq": 10**6}}
    with pytest.raises(StateError, match="outside"):
        ds.iter(bad_pos)
    for key, value in (("epoch", -1), ("seq", "3"), ("token_offset", True)):
        with pytest.raises(StateError, match=f"position.{key}"):
            ds.iter({**good, "position": {**good["position"], key: value}})
    with pytest.raises(StateError, match="raise `num_epochs`"):
        ds.iter({**good, "position": {**good["position"], "epoch": 1}})
    for key in ("dataset", "stats", "position"):
        with pytest.raises(StateError, match=f"`{key}` should be a dict"):
            ds.iter({**good, key: [1]})
    with pytest.raises(StateError, match="int counters"):
        ds.iter({**good, "stats": {"rows": "many"}})
    with pytest.raises(StateError, match="only stops between documents"):
        ds.iter({**good, "position": {**good["position"], "token_offset": 5}})
    edited = {**good, "position": {**good["position"], "row_group": 7}}
    with pytest.raises(StateError, match="edited"):
        ds.iter(edited)
    assert issubclass(StateMismatchError, ArrowStreamError)


def test_bad_read_options_are_config_errors(tmp_path: Path) -> None:
    write_parts(tmp_path, [{"text": ["a"]}])
    with pytest.raises(ConfigError, match="num_epochs"):
        read_parquet(tmp_path, num_epochs=0)
    with pytest.raises(ConfigError, match="batch_rows"):
        read_parquet(tmp_path, batch_rows=0)
    with pytest.raises(ValueError):  # ConfigError is a ValueError
        read_parquet(tmp_path, num_epochs=-1)


def test_tokenizer_with_padding_or_truncation_is_refused(tmp_path: Path, tokenizer_path: Path) -> None:
    write_parts(tmp_path, [{"text": ["a"]}])
    padded = Tokenizer.from_file(str(tokenizer_path))
    padded.enable_padding()
    with pytest.raises(ConfigError, match="no_padding"):
        read_parquet(tmp_path).tokenize(padded)
    truncating = Tokenizer.from_file(str(tokenizer_path))
    truncating.enable_truncation(max_length=16)
    with pytest.raises(ConfigError, match="no_truncation"):
        read_parquet(tmp_path).tokenize(truncating)


def test_a_lone_special_token_that_is_not_an_eos_is_not_taken_as_eos(tmp_path: Path) -> None:
    from tokenizers import AddedToken

    write_parts(tmp_path, [{"text": ["a"]}])
    tok = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    tok.add_special_tokens([AddedToken("[PAD]", special=True)])
    with pytest.raises(ConfigError, match=r"\[PAD\].*eos_id"):
        read_parquet(tmp_path).tokenize(tok)


def test_negative_token_ids_name_the_file_and_row_group(tmp_path: Path) -> None:
    write_parts(tmp_path, [{"input_ids": pa.array([[1], [2], [3, -4]], pa.list_(pa.int32()))}], row_group_size=2)
    ds = read_parquet(tmp_path).tokenize(None, column="input_ids", eos_id=0)
    with pytest.raises(SchemaError, match=r"part-000\.parquet'?, row group 1.*token id -4"):
        list(ds)


def test_null_token_ids_inside_a_list_are_an_error(tmp_path: Path) -> None:
    write_parts(tmp_path, [{"input_ids": pa.array([[1, None]], pa.list_(pa.int32()))}])
    with pytest.raises(SchemaError, match="null token ids"):
        list(read_parquet(tmp_path).tokenize(None, column="input_ids", eos_id=0))


def test_a_run_can_be_extended_with_more_epochs(tmp_path: Path) -> None:
    write_parts(tmp_path, [{"input_ids": pa.array([[1, 2]] * 3, pa.list_(pa.int32()))}])

    def build(num_epochs: int | None):
        ds = read_parquet(tmp_path, num_epochs=num_epochs)
        return ds.tokenize(None, column="input_ids", eos_id=0).pack(seq_len=3, batch_size=1)

    it = build(1).iter()
    first = list(it)
    state = it.state_dict()
    more = list(build(3).iter(state))
    assert len(more) == 2 * len(first)
    assert [b["input_ids"].tolist() for b in more[: len(first)]] == [b["input_ids"].tolist() for b in first]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"seq_len": True, "batch_size": 1}, "seq_len"),
        ({"seq_len": 4, "batch_size": 1, "pad_id": 2**40}, "pad_id"),
        ({"seq_len": 4, "batch_size": 1, "pad_id": -1}, "pad_id"),
    ],
)
def test_bools_and_out_of_range_pad_ids_are_refused(tmp_path: Path, kwargs: dict, match: str) -> None:
    write_parts(tmp_path, [{"input_ids": pa.array([[1]], pa.list_(pa.int32()))}])
    ds = read_parquet(tmp_path).tokenize(None, column="input_ids", eos_id=0)
    with pytest.raises(ConfigError, match=match):
        ds.pack(**kwargs)
    with pytest.raises(ConfigError, match="num_epochs"):
        read_parquet(tmp_path, num_epochs=True)  # type: ignore[arg-type]


def test_text_that_encodes_to_no_token_counts_as_empty(tmp_path: Path) -> None:
    from tokenizers import pre_tokenizers

    tok = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1, "<eos>": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    write_parts(tmp_path, [{"text": ["a a", "   ", "a"]}])
    it = read_parquet(tmp_path).tokenize(tok, eos_id=2).iter()
    assert [ids for b in it for ids in b.column("input_ids").to_pylist()] == [[0, 0, 2], [0, 2]]
    assert it.stats["empty"] == 1 and it.stats["docs"] == 2


def test_a_refused_state_leaves_the_iterator_as_it_was(tmp_path: Path) -> None:
    from arrowstream.state.checksum import with_checksum

    write_parts(tmp_path, [{"text": ["a", "b", "c", "d"]}], row_group_size=2)
    ds = read_parquet(tmp_path)
    it = ds.iter()
    next(it)
    before = it.state_dict()
    with pytest.raises(StateError, match="changed after it was saved"):
        it.load_state_dict({**before, "stats": {**before["stats"], "rows": 0}})
    before = {k: v for k, v in before.items() if k != "checksum"}  # the checks below it
    bad = with_checksum({**before, "work": {"num_streams": 1, "segments": [[0, 0, 99, 0]]}})
    with pytest.raises(StateError, match="work"):
        it.load_state_dict(bad)
    with pytest.raises(StateError, match="work"):
        it.load_state_dict(with_checksum({**before, "work": {"num_streams": 1, "segments": [["x", 0, 1, 0]]}}))
    with pytest.raises(StateError, match="json.load"):
        it.load_state_dict("state.json")  # type: ignore[arg-type]
    assert {k: v for k, v in it.state_dict().items() if k != "checksum"} == before


def test_a_path_the_filesystem_cannot_look_up_is_a_shard_error_naming_it() -> None:
    from arrowstream import ShardError, read_parquet

    with pytest.raises(ShardError, match=r"cannot look up '/data/a\\x00b'.*check the path"):
        read_parquet("/data/a\x00b")  # pyarrow refuses the path itself (ArrowInvalid before)


def test_a_hand_changed_hash_a_mixture_state_and_no_list_are_named(tmp_path: Path) -> None:
    from arrowstream import merge_states, mix
    from arrowstream.state.checksum import with_checksum
    from arrowstream.testing import example_dir

    ids = read_parquet(example_dir()).tokenize(None, column="ids", eos_id=0)
    ds = ids.pack(seq_len=4, batch_size=2)
    it = ds.iter()
    next(it)
    state = it.state_dict()
    with pytest.raises(StateError, match=r"`options_hash` is None but its options, the same as this pipeline's, hash"):
        ds.iter(with_checksum({k: v for k, v in state.items() if k not in ("options_hash", "checksum")}))
    mixed = mix({"a": ids, "b": ids}, {"a": 1, "b": 1}).pack(seq_len=4, batch_size=2).iter()
    next(mixed)
    with pytest.raises(StateError, match=r"this is a mixture's state \(kind 'mixture', from `mix\(\.\.\.\)`\)"):
        ds.iter(mixed.state_dict())
    for wrong in (None, state):
        with pytest.raises(StateError, match=r"`merge_states` takes a list of states"):
            merge_states(wrong)  # type: ignore[arg-type]


def test_a_state_on_files_rewritten_with_other_data_of_the_same_size_is_refused(tmp_path: Path, tokenizer: Tokenizer) -> None:
    """Paths, sizes and row counts agree; the footers (statistics) do not: other data, refused. Moved bytes resume."""
    import shutil

    data, moved = tmp_path / "data", tmp_path / "moved"
    data.mkdir()
    first = [f"alpha document {i:03d} " * 30 for i in range(50)]
    second = [("zzzzz qqqqqqqq %03d " % i) * 30 for i in range(50)]  # the same lengths: the same file size
    pq.write_table(pa.table({"text": first}), data / "a.parquet", compression="none", row_group_size=10)
    ds = read_parquet(data).tokenize(tokenizer).pack(seq_len=64, batch_size=2)
    it = ds.iter()
    for _ in range(7):
        next(it)
    state = json.loads(json.dumps(it.state_dict()))
    rest = [b["input_ids"].tobytes() for b in it]
    shutil.copytree(data, moved)  # the same bytes elsewhere: the same data
    again = read_parquet(moved).tokenize(tokenizer).pack(seq_len=64, batch_size=2).iter(state)
    assert [b["input_ids"].tobytes() for b in again] == rest
    size = (data / "a.parquet").stat().st_size
    pq.write_table(pa.table({"text": second}), data / "a.parquet", compression="none", row_group_size=10)
    assert (data / "a.parquet").stat().st_size == size
    with pytest.raises(StateMismatchError, match=r"same relative paths, sizes and row counts .* but other contents"):
        read_parquet(data).tokenize(tokenizer).pack(seq_len=64, batch_size=2).iter(state)



def test_a_misspelt_or_missing_option_is_a_config_error_naming_the_nearest(tmp_path: Path) -> None:
    # these were bare TypeErrors naming internal classes, and `.pack(seqlen=...)` sent the user to best_fit
    write_parts(tmp_path, [{"input_ids": pa.array([[1, 2]], pa.list_(pa.int32()))}])
    ids = read_parquet(tmp_path).tokenize(None, column="input_ids", eos_id=0)
    cases = [
        (lambda: read_parquet(tmp_path).tokenize(None, colum="input_ids"), r"`.tokenize` has no option `colum` \(did you mean `column`\?\)"),
        (lambda: ids.pack(seqlen=8, batch_size=1), r"`.pack` has no option `seqlen` \(did you mean `seq_len`\?\)"),
        (lambda: ids.pack(seq_len=8, batch_size=1, strategy="best_fit", windw=4), r"has no option `windw` \(did you mean `window`\?\)"),
        (lambda: ids.pack(seq_len=8), r"`.pack` needs `batch_size`, which was not given"),
        (lambda: ids.bucket(batch_size=2, maxlen=8), r"`.bucket` has no option `maxlen` \(did you mean `max_len`\?\)"),
        (lambda: ids.pack(seq_len=8, batch_size=1, window=4), r"strategy 'concat' takes no \['window'\]"),
    ]
    for make, message in cases:
        with pytest.raises(ConfigError, match=message):
            make()


def test_a_column_some_files_lack_gets_advice_that_can_work(tmp_path: Path) -> None:
    # the filter's message said to add the column to `columns=`, which then failed as drift; the drift
    # message said to "select common columns", which cannot help when the text column is the one missing
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["one"], "lang": ["en"]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"text": ["two"]}), tmp_path / "b.parquet")
    with pytest.raises(SchemaError, match=r"column `lang` is not among them: column `lang` is in .*a\.parquet' but "
                       r"missing from .*b\.parquet' \(schema drift\); filter on a column every file has, or add it"):
        read_parquet(tmp_path).filter(pc.field("lang") == "en")
    with pytest.raises(SchemaError, match=r"every file must have the columns read: read the others only \(`columns=`\), "
                       r"add it to the files that lack it, or read those files apart"):
        read_parquet(tmp_path, columns=["text", "lang"])
