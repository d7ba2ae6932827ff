#!/usr/bin/env python
"""The mutation check: deliberate bugs that the test suite must catch.

Each mutant is a plausible bug, written as one exact text replacement in one
module. For each, this script copies the checkout to a temporary directory,
applies the replacement there (the work tree is never touched), runs the
tests that guard against that bug, and reports ``killed`` when they fail (as
they must) or ``SURVIVED`` when they pass. It first runs the same tests on the
unchanged copy, so a test that fails anyway is not taken for a kill.

Run it by hand after changing the tests or the code they guard::

    python tests/mutations.py             # every mutant, about 2-3 minutes
    python tests/mutations.py --list      # names and what each one breaks
    python tests/mutations.py shard-order-ignores-epoch --show   # one, with its diff

Exit status 0 when every mutant was killed, 1 when one survived, 2 when a
mutant no longer applies (the code it names moved: update it here).
"""

from __future__ import annotations

import argparse
import difflib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    """A deliberate bug: replace ``old`` by ``new`` in ``path``; ``tests`` must then fail."""

    name: str
    hole: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTANTS = [
    Mutant(
        "ramp-resume-rereads-the-cut-chunk",
        "a resume whose read mark is inside a chunk (a ramp-up window ended there) takes the whole chunk as new",
        "arrowstream/pack/lookahead.py",
        "        before, after = chunk.split(np.array([k]))\n        return before, after",
        "        return None, chunk",
        ("tests/test_ramp.py",),
    ),
    Mutant(
        "bucket-ramp-emits-every-batch",
        "a small ramp-up window emits all its batches, cut from a small pool (more padding)",
        "arrowstream/pack/bucketrun.py",
        "        if ramping and not final and batches:",
        "        if False:",
        ("tests/test_ramp.py",),
    ),
    Mutant(
        "windows-never-ramp",
        "look-ahead windows are full from the start: the first batch waits for a whole window",
        "arrowstream/pack/lookahead.py",
        "    if not ramp or window <= RAMP_FIRST:",
        "    if True:",
        ("tests/test_ramp.py",),
    ),
    Mutant(
        "best-fit-ramps-every-epoch",
        "best_fit ramps its windows at every epoch, not only the first (later epochs change)",
        "arrowstream/pack/bestfit.py",
        "ramp=self.ramp and self.epoch == 0)",
        "ramp=self.ramp)",
        ("tests/test_ramp.py",),
    ),
    Mutant(
        "old-states-ramp",
        "a bucket state saved before the ramp resumes with it (its run goes on differently)",
        "arrowstream/state/packers.py",
        '                bool(data.get("ramp", False)),\n            )\n        except (KeyError, TypeError, ValueError) as exc:\n'
        '            raise _malformed(exc) from exc\n\n    def to_dict(self) -> dict[str, Any]:\n'
        '        """Return the part as a state holds it."""\n        return {\n            **self.progress.to_dict(),\n'
        '            "read": list(self.read),\n            "window"',
        '                bool(data.get("ramp", True)),\n            )\n        except (KeyError, TypeError, ValueError) as exc:\n'
        '            raise _malformed(exc) from exc\n\n    def to_dict(self) -> dict[str, Any]:\n'
        '        """Return the part as a state holds it."""\n        return {\n            **self.progress.to_dict(),\n'
        '            "read": list(self.read),\n            "window"',
        ("tests/test_ramp.py",),
    ),
    Mutant(
        "prefetch-state-runs-ahead",
        "with batches made ahead, state_dict() gives the producer's position, past batches not yet trained on",
        "arrowstream/pytorch.py",
        "if self._handed is not None:  # batches are made ahead",
        "if False:  # batches are made ahead",
        ("tests/test_torch_prefetch.py",),
    ),
    Mutant(
        "text-path-imports-pandas",
        "a fresh process pays about 0.15 s to import pandas on its first slice",
        "arrowstream/tokenize/__init__.py",
        "        lengths = numbers_to_numpy(lengths)\n",
        "        lengths = lengths.to_numpy(zero_copy_only=False)\n",
        ("tests/test_warm_start.py",),
    ),
    Mutant(
        "stored-sample-ignored",
        "a process with a stored verdict samples the documents again (the warm start lost)",
        "arrowstream/tokenize/encoders.py",
        'if verdict is not None and verdict["ok"] and documents_vouched(verdict, tokie=self._tokie is not None) >= self._sample_left:',
        "if False:",
        ("tests/test_warm_start.py",),
    ),
    Mutant(
        "sample-not-remembered",
        "the end of the document sample is not stored, so every later process samples again",
        "arrowstream/tokenize/sampling.py",
        "            self._remember_sample()\n",
        "            pass\n",
        ("tests/test_warm_start.py",),
    ),
    Mutant(
        "sample-deaf-to-other-processes",
        "an encoder mid-sample never looks at what other processes stored",
        "arrowstream/tokenize/encoders.py",
        "if not self._sample_left or self._proven_elsewhere():",
        "if not self._sample_left:",
        ("tests/test_warm_start.py",),
    ),
    Mutant(
        "skipped-rows-flow-on",
        "the rows of a skipped row group go on as nulls instead of being counted as unreadable",
        "arrowstream/io/source.py",
        'yield chunk.with_rows(~skipped[a:b], "unreadable") if unreadable else chunk',
        "yield chunk",
        ("tests/test_skip.py",),
    ),
    Mutant(
        "pin-ignores-the-etag",
        "an object replaced by one of the same size is read with the old footer",
        "arrowstream/io/manifest.py",
        "if etag is not None and etag != f.etag:",
        "if False:",
        ("tests/test_storage.py",),
    ),
    Mutant(
        "reader-rereads-footers",
        "opening a file for its row groups reads its footer again, though discovery or the manifest file has it",
        "arrowstream/io/reader.py",
        "metadata=self.manifest.footer(path))",
        "metadata=None)",
        ("tests/test_storage.py",),
    ),
    Mutant(
        "reads-never-retried",
        "a transient storage error ends the run at once",
        "arrowstream/io/reader.py",
        "if attempt < attempts and cause is not None and transient(cause):",
        "if False:",
        ("tests/test_storage.py",),
    ),
    Mutant(
        "merge-pools-one-epoch-ahead",
        "a merge of drifted consumers pools only the next epoch: shares of later epochs are lost or read twice",
        "arrowstream/distributed/topology.py",
        "for e in range(at + 1, last + 1):  # epochs it has not begun: its whole share",
        "for e in range(at + 1, min(last, epoch + 1) + 1):  # epochs it has not begun: its whole share",
        ("tests/test_mixture_strategies.py",),
    ),
    Mutant(
        "later-work-not-saved",
        "an iterator forgets the shares a merge dealt beyond the next epoch",
        "arrowstream/pipeline/snapshot.py",
        "later_work=tuple(ahead[1:]),",
        "later_work=(),",
        ("tests/test_mixture_strategies.py",),
    ),
    Mutant(
        "mixture-rows-in-source-order",
        "a mixture's batch lays each source's rows out in source order, not in the slots the schedule gave",
        "arrowstream/pack/layout.py",
        'order = np.argsort(dest, kind="stable")',
        "order = np.arange(dest.size)",
        ("tests/test_mixture.py",),
    ),
    Mutant(
        "mixture-pads-with-one-id",
        "every row of a mixture's batch pads with the first source's pad id",
        "arrowstream/mixture/rows.py",
        "if pad_ids[source] != pad:",
        "if False:",
        ("tests/test_mixture_strategies.py",),
    ),
    Mutant(
        "bucketed-mixture-ignores-the-schedule",
        "a bucketed mixture always takes the first source's batch",
        "arrowstream/mixture/iterator.py",
        "batch, counts = self._bucketed(int(ids[0]), int(rows[0]))",
        "batch, counts = self._bucketed(0, int(rows[0]))",
        ("tests/test_mixture_strategies.py",),
    ),
    Mutant(
        "mixture-encoder-per-source",
        "sources with one tokenizer keep one encoder each, so its proof runs once per source",
        "arrowstream/mixture/mix.py",
        "shared = seen.setdefault(key, encoder)",
        "shared = encoder",
        ("tests/test_mixture_strategies.py",),
    ),
    Mutant(
        "reweight-stage-from-zero",
        "a re-weighted mixture counts the new shares from the run's first row, not the row reached",
        "arrowstream/mixture/reweight.py",
        '"stages": [Stage(row, current.counts), *later],',
        '"stages": [Stage(0, current.counts), *later],',
        ("tests/test_mixture.py",),
    ),
    Mutant(
        "reweight-forgets-left-out-sources",
        "a source a re-weighting leaves out loses its place",
        "arrowstream/mixture/reweight.py",
        '"dormant": {name: st for name, st in known.items() if name not in names},',
        '"dormant": {},',
        ("tests/test_mixture.py",),
    ),
    Mutant(
        "reweight-one-worker-counts-the-rank",
        "a worker takes its own batch count for its rank's steps when re-weighting",
        "arrowstream/mixture/reweight.py",
        'steps = sum(int(s["position"]["batches"]) for s in rank_state["states"])',
        'steps = int(state["position"]["batches"])',
        ("tests/test_mixture.py",),
    ),
    Mutant(
        "mixture-elastic-restarts-schedule",
        "a mixture resumed on another topology restarts its schedule at row 0",
        "arrowstream/mixture/iterator.py",
        '            "origin": int(state["rows"]),\n',
        '            "origin": 0,\n',
        ("tests/test_mixture.py",),
    ),
    Mutant(
        "mixture-resume-restarts-schedule",
        "a resumed mixture forgets its batch count: it restarts the schedule with the sources where they were",
        "arrowstream/mixture/iterator.py",
        '        self._batches = 0 if own is None else own["batches"]\n',
        "        self._batches = 0\n",
        ("tests/test_mixture.py",),
    ),
    Mutant(
        "mixture-any-rotation",
        "a period of the mixture's schedule may be rotated by any amount (some break the one-row bound)",
        "arrowstream/mixture/schedule.py",
        "    out = np.flatnonzero(ok)\n",
        "    out = np.arange(period)\n",
        ("tests/test_mixture.py",),
    ),
    Mutant(
        "mixture-periods-never-rotate",
        "every period of the schedule starts at the same row: a worker on every W-th step keeps one phase",
        "arrowstream/mixture/schedule.py",
        "        pick = (np.modf((period_index + 1) * _SILVER)[0] * rotations.size).astype(np.int64)\n",
        "        pick = np.zeros(period_index.shape, np.int64)\n",
        ("tests/test_mixture.py",),
    ),
    Mutant(
        "mixture-slots-fixed",
        "a rank takes the same positions of every global step",
        "arrowstream/mixture/schedule.py",
        "    offset = int(math.modf((step + 1) * _STEP)[0] * n)\n",
        "    offset = 0\n",
        ("tests/test_mixture.py",),
    ),
    Mutant(
        "mixture-stage-counts-from-zero",
        "a stage's shares are counted from the run's first row, not the stage's",
        "arrowstream/mixture/schedule.py",
        "        local = rows - stage.start\n",
        "        local = rows\n",
        ("tests/test_mixture.py",),
    ),
    Mutant(
        "grown-epoch-over-all-files",
        "after files were added, the begun epoch's layout is cut over every file",
        "arrowstream/pipeline/growth.py",
        "        if epoch < self.until_epoch:\n            return self.old.layout(epoch, num_streams, by)\n",
        "",
        ("tests/test_growth.py",),
    ),
    Mutant(
        "grown-workers-disagree",
        "each DataLoader worker works out alone where added files join",
        "arrowstream/state/ranks.py",
        'return state if own is not None and state is not None and state.get("kind") == "rank" else own',
        "return own",
        ("tests/test_growth.py",),
    ),
    Mutant(
        "grown-join-ignores-saved",
        "a grown run's state forgets the epoch the added files join at",
        "arrowstream/pipeline/growth.py",
        'until = saved.get("until_epoch")',
        "until = None",
        ("tests/test_growth.py",),
    ),
    Mutant(
        "resume-reads-before-position",
        "a resume reads (and discards) every row group before its position",
        "arrowstream/io/source.py",
        "    first = layout.find_window(stream, start_seq)\n",
        "    first = layout.find_window(stream, start_seq)\n"
        "    for skipped in windows[:first]:\n"
        "        _read_piece(reader, int(skipped.shards[0]), 0, 1)\n",
        ("tests/test_reads.py",),
    ),
    Mutant(
        "consumer-reads-other-shares",
        "every consumer also reads the first row group of every other consumer's stream",
        "arrowstream/io/source.py",
        "    windows = layout.windows(stream)\n",
        "    for other in range(layout.num_streams):\n"
        "        if other != stream and layout.windows(other):\n"
        "            _read_piece(reader, int(layout.windows(other)[0].shards[0]), 0, 1)\n"
        "    windows = layout.windows(stream)\n",
        ("tests/test_reads.py",),
    ),
    Mutant(
        "shard-order-ignores-epoch",
        "the shard permutation is the same every epoch (the window permutation still varies)",
        "arrowstream/io/layout.py",
        "perm = permutation(self.unit_shard.size, seed, epoch, 0)",
        "perm = permutation(self.unit_shard.size, seed, 0, 0)",
        ("tests/test_shuffle.py",),
    ),
    Mutant(
        "best-fit-not-decreasing",
        "best fit places documents in arrival order instead of longest first",
        "arrowstream/pack/bestfit.py",
        "for piece in sorted(pieces, key=lambda p: -p[2]):",
        "for piece in pieces:",
        ("tests/test_bestfit.py",),
    ),
    Mutant(
        "best-fit-is-next-fit",
        "a document goes into the newest row or a new one (next fit), not the tightest",
        "arrowstream/pack/bestfit.py",
        "            at = bisect_left(free, (n, -1))\n",
        "            newest = [k for k, f in enumerate(free) if f[1] == len(self.open) - 1 and f[0] >= n]\n"
        "            at = newest[0] if newest else len(free)\n",
        ("tests/test_bestfit.py",),
    ),
    Mutant(
        "tiktoken-never-emits",
        "past the document sample the encoder still returns `tokenizers`' ids",
        "arrowstream/tokenize/encoders.py",
        "        if tok is None:\n            return fast.encode(texts, self._reference)  # type: ignore[no-any-return]\n",
        "        if tok is None:\n            return self._reference(texts)\n",
        ("tests/test_encoders.py", "tests/test_resume_contract.py"),
    ),
    Mutant(
        "cache-identity-without-footer",
        "a token cache entry is matched by path, size and row counts only",
        "arrowstream/io/manifest.py",
        '"row_counts": list(f.row_counts), "footer": f.footer}',
        '"row_counts": list(f.row_counts)}',
        ("tests/test_cache.py",),
    ),
    Mutant(
        "state-dict-has-side-effects",
        "saving a best-fit state reorders the open rows, so saving changes what comes next",
        "arrowstream/pack/bestfit.py",
        "    def _packer_state(self, progress: Progress, read: tuple[int, int, int]) -> BestFitState:\n",
        "    def _packer_state(self, progress: Progress, read: tuple[int, int, int]) -> BestFitState:\n"
        "        self.open.reverse()\n",
        ("tests/test_bestfit.py",),
    ),
    Mutant(
        "layout-cache-ignores-epoch",
        "the description keeps the first epoch's order for every epoch: resumes agree only while "
        "the saving and the resuming iterator share one Dataset",
        "arrowstream/pipeline/plan.py",
        "        key = (epoch, num_streams, by)\n        layout = self._layouts.get(key)\n",
        "        key = (num_streams, by)  # type: ignore[assignment]\n        layout = self._layouts.get(key)\n"
        "        if layout is not None:\n            layout.epoch = epoch\n",
        ("tests/test_resume_contract.py",),
    ),
    Mutant(
        "state-shape-varies",
        "counters appear in the state on first use, so its keys change between steps",
        "arrowstream/pipeline/snapshot.py",
        "stats = {**dict.fromkeys(self.counters, 0), **stats}",
        "stats = dict(stats)",
        ("tests/test_resume_contract.py",),
    ),
    Mutant(
        "reader-imports-the-pipeline",
        "the reader reaches up into the pipeline layer (inside a function, so nothing breaks at import)",
        "arrowstream/io/reader.py",
        "    def close(self) -> None:\n        \"\"\"Close the open files.\"\"\"\n",
        "    def _plan(self) -> None:\n        from arrowstream.pipeline import plan  # noqa: F401\n\n"
        "    def close(self) -> None:\n        \"\"\"Close the open files.\"\"\"\n",
        ("tests/test_layers.py",),
    ),
    Mutant(
        "cut-document-resumed-from-wrong-offset",
        "a document cut at a checkpoint resumes one token early and loses its last (EOS kept, same count)",
        "arrowstream/io/chunk.py",
        "tokens=self.tokens[skip:], offsets=offsets",
        "tokens=np.concatenate([self.tokens[skip - 1 : length - 2], self.tokens[length - 1 :]]), offsets=offsets",
        ("tests/test_topology.py::test_elastic_resume_emits_the_rest_exactly_once",),
    ),
    Mutant(
        "pruning-forgets-nulls",
        "the statistics kept for pruning say a column has no null where it has some, so `is_null` prunes row groups that match",
        "arrowstream/io/statistics.py",
        "    return (low, high, None if st.null_count > 0 else low)\n",
        "    return (low, high, low)\n",
        ("tests/test_statistics.py",),
    ),
    Mutant(
        "state-envelope-drops-held",
        "the typed state writes no held documents, so an elastic resume of a look-ahead packer loses them",
        "arrowstream/state/envelope.py",
        '            "held": None if self.held is None else self.held.to_dict(),\n',
        '            "held": None,\n',
        ("tests/test_state.py",),
    ),
    Mutant(
        "counted-target-is-the-smallest",
        "over token ids the batch target is the smallest consumer's count, so the others drop their tail",
        "arrowstream/distributed/tokens.py",
        "        return [max(counts, default=0)] * len(counts)\n",
        "        return [min(counts, default=0)] * len(counts)\n",
        ("tests/test_topology.py",),
    ),
    Mutant(
        "counted-streams-by-rows",
        "shares are cut by equal rows, counted or estimated, so consumers pad several batches",
        "arrowstream/pipeline/plan.py",
        '        return "batches" if self.packer.exact_batches(0) is not None else "tokens"  # type: ignore[union-attr]\n',
        '        return "rows"\n',
        ("tests/test_exact_batches.py",),
    ),
    Mutant(
        "concat-shares-of-equal-tokens",
        "a counted concat's shares hold equal tokens, not whole batches, so every worker ends with a partial batch",
        "arrowstream/distributed/tokens.py",
        "    ends = np.array([min(i * num_batches // n * per_batch, total) for i in range(n + 1)], dtype=np.int64)\n",
        "    ends = np.array([total * i // n for i in range(n + 1)], dtype=np.int64)\n",
        ("tests/test_exact_batches.py",),
    ),
    Mutant(
        "share-tail-not-trimmed",
        "a share that ends inside a document emits the whole document, which the next share also emits in part",
        "arrowstream/pipeline/reading.py",
        "                if take and out.seq_end == hi:  # the last document's rest is another consumer's\n",
        "                if False:\n",
        ("tests/test_exact_batches.py",),
    ),
    Mutant(
        "split-row-counted-twice",
        "a row split between two shares is counted in `rows` and `docs` by both",
        "arrowstream/io/chunk.py",
        "        cut = 1 if self.tail_take and seq == self.seq_end else 0\n",
        "        cut = 0\n",
        ("tests/test_exact_batches.py",),
    ),
    Mutant(
        "elastic-concat-re-dealt-by-rows",
        "an elastic resume of a counted concat re-deals the rest of the epoch by equal rows, not whole batches",
        "arrowstream/pipeline/plan.py",
        '        mode = self.streams_by\n        if mode == "rows":\n            return None\n',
        "        return None\n",
        ("tests/test_exact_batches.py::test_counted_batches_hold_after_elastic_resumes_over_two_epochs",),
    ),
    Mutant(
        "index-pages-unchecked",
        "length index pages are read without their checksums, so a flipped bit goes unnoticed",
        "arrowstream/tokenize/lengths.py",
        "page_checksum_verification=True))",
        "page_checksum_verification=False))",
        ("tests/test_length_index.py::test_a_corrupt_index_entry_is_named_not_trusted",),
    ),
    Mutant(
        "main-process-state-of-a-worker-loader",
        "the main process's `tds.state_dict()` answers for a dataset its DataLoader workers iterate",
        "arrowstream/pytorch.py",
        "        if get_worker_info() is None and self._worker_ran is not None and self._worker_ran.value:\n",
        "        if False:\n",
        ("tests/test_pytorch.py::test_the_main_process_state_of_a_dataset_its_workers_iterate_is_refused",),
    ),
    Mutant(
        "batches-collated-again",
        "a DataLoader at its default batch_size stacks packed batches into a new leading dimension",
        "arrowstream/pytorch.py",
        "default_collate_fn_map[Batch] = _refuse_collate\n",
        "",
        ("tests/test_pytorch.py::test_default_collation_of_arrowstream_batches_is_refused",),
    ),
    Mutant(
        "loader-state-before-the-last-drop",
        "a worker's last batch carries the state from before its end, so a drop at an estimated target never reaches the loader",
        "arrowstream/pytorch.py",
        '        held[STATE_KEY] = state_tag(it, last=True, stream=stream)\n',
        '        held[STATE_KEY] = {**held[STATE_KEY], "last": True} if STATE_KEY in held else state_tag(it, last=True, stream=stream)\n',
        ("tests/test_pytorch.py::test_the_loader_counts_what_its_workers_did_drops_included",),
    ),
    Mutant(
        "cli-ctrl-c-saves-nothing",
        "Ctrl-C during `arrowstream stream --save-state` saves nothing",
        "arrowstream/cli/stream.py",
        "        if not args.save_state:\n            raise\n",
        "        raise\n",
        ("tests/test_cli_stream.py::test_ctrl_c_or_sigterm_saves_the_state_and_exits_quietly",),
    ),
    Mutant(
        "filter-literal-left-not-mirrored",
        "a --filter comparison with the literal on the left keeps its operator (`3 > n` read as `n > 3`)",
        "arrowstream/cli/expressions.py",
        "        mirrored = _MIRROR.get(type(op), type(op))\n",
        "        mirrored = type(op)\n",
        ("tests/test_cli_stream.py::test_filter_conditions_select_what_they_say",),
    ),
    Mutant(
        "iter-sets-up-eagerly",
        "`ds.iter()` samples and counts before returning, so it takes a second before the first `next()`",
        "arrowstream/pipeline/iterator.py",
        "        if saved is not None:  # what a loaded state implies is checked at the call that loads it\n            self._start()\n",
        "        self._start()\n",
        ("tests/test_plan.py::test_iter_returns_at_once_and_sets_up_at_the_first_next",),
    ),
    Mutant(
        "sampled-padding-scales-the-epochs-end",
        "a sampled prediction counts the epoch's last, partial batch once per sample's worth of documents",
        "arrowstream/analysis/simulate.py",
        "        pad = (self.padding_tokens - self.tail_padding) * scale + self.tail_padding\n",
        "        pad = self.padding_tokens * scale\n",
        ("tests/test_analysis.py::test_a_sampled_prediction_counts_the_epochs_end_once_and_gives_a_range",),
    ),
    Mutant(
        "collating-loader-not-noticed",
        "a DataLoader with a batch size and its own collator (the Trainer's) stacks packed batches unnoticed",
        "arrowstream/pytorch.py",
        "            raise ConfigError(_COLLATING)\n        if get_worker_info() is not None",
        "            pass\n        if get_worker_info() is not None",
        ("tests/test_pytorch.py::test_a_trainer_style_loader_that_would_stack_batches_is_refused",),
    ),
    Mutant(
        "cache-write-failure-ends-the-run",
        "a token cache the storage refuses to write (disk full, file-size limit) ends the run with a raw OSError",
        "arrowstream/tokenize/cache.py",
        "            except OSError as exc:  # a full disk, a file-size limit, no permission: train on, uncached\n",
        "            except ValueError as exc:\n",
        ("tests/test_cache.py::test_a_cache_the_storage_refuses_to_write_warns_and_the_run_goes_on",),
    ),
    Mutant(
        "fresh-share-forgets-its-origin",
        "a fresh concat run whose share begins inside a document says it starts at the document's first token",
        "arrowstream/pipeline/iterator.py",
        "                origin = Position(0, 0, first[1], first[3])\n",
        "                origin = None\n",
        ("tests/test_exact_batches.py::test_shares_that_begin_inside_a_document_resume_exactly",),
    ),
    Mutant(
        "token-rate-sample-prorated-by-rows",
        "the token-rate sample takes its first rows as an average share of their row group's bytes",
        "arrowstream/distributed/balance.py",
        "            share = float(shard_bytes[shard]) * (batch.nbytes / table.nbytes if table.nbytes else rows / total)\n",
        "            share = rows / total * float(shard_bytes[shard])\n",
        ("tests/test_exact_batches.py",),
    ),
    Mutant(
        "index-counts-skipped-documents",
        "the length index gives a skipped (null or empty) document its EOS",
        "arrowstream/tokenize/known.py",
        "        return np.where(lengths > 0, lengths + eos, 0)\n",
        "        return lengths + eos\n",
        ("tests/test_length_index.py",),
    ),
    Mutant(
        "stale-index-entry-used",
        "a length index entry built from another version of its file is used",
        "arrowstream/tokenize/lengths.py",
        "        if identity != expected:\n",
        "        if identity[\"relpath\"] != expected[\"relpath\"]:\n",
        ("tests/test_length_index.py",),
    ),
    Mutant(
        "cache-encodes-empty-texts",
        "the token cache keeps ids (a BOS) for an empty text the stage would drop",
        "arrowstream/tokenize/__init__.py",
        "        present = numbers_to_numpy(pc.binary_length(texts)) > 0\n",
        "        present = valid\n",
        ("tests/test_length_index.py",),
    ),
    Mutant(
        "every-worker-pads-to-the-largest",
        "with DataLoader workers every worker pads to the largest count (a rank pads once per worker)",
        "arrowstream/distributed/tokens.py",
        "    if per_rank <= 1 or len(counts) % per_rank:\n",
        "    if True:\n",
        ("tests/test_exact_batches.py",),
    ),
    Mutant(
        "simulated-chunks-ignore-shuffle-order",
        "the stand-in chunks a packer is run over to count its batches keep the rows' stored order",
        "arrowstream/distributed/tokens.py",
        "            rows = emitted_lengths(window, counts)\n",
        "            rows = np.concatenate([counts.lengths(s)[a:b] for s, a, b in _pieces(window)])\n",
        ("tests/test_exact_batches.py", "tests/test_length_index.py"),
    ),
    Mutant(
        "simulated-chunks-on-the-stream-grid",
        "the stand-in chunks are cut on a grid from the stream's start, not each window's",
        "arrowstream/distributed/tokens.py",
        "                b = min((a // batch_rows + 1) * batch_rows, n)\n                lengths = rows[a:b].copy()\n",
        "                b = min(((window.start + a) // batch_rows + 1) * batch_rows - window.start, n)\n"
        "                lengths = rows[a:b].copy()\n",
        ("tests/test_exact_batches.py", "tests/test_length_index.py"),
    ),
    Mutant(
        "estimated-excess-dropped-every-epoch",
        "what a consumer holds beyond an estimated target is dropped in every epoch, not carried",
        "arrowstream/pack/base.py",
        "        return self.even_batches is True\n",
        "        return False\n",
        ("tests/test_carry.py",),
    ),
    Mutant(
        "carried-data-ends-the-batch",
        "concat stops a batch at carried data of an earlier epoch (pads instead of emitting it)",
        "arrowstream/pack/concat.py",
        "                if head is None or head.epoch > self.epoch:  # an earlier epoch's: carried data\n",
        "                if head is None or head.epoch != self.epoch:\n",
        ("tests/test_carry.py",),
    ),
    Mutant(
        "epoch-counters-stay-in-the-first-epoch",
        "the per-epoch counters add everything to epoch 0",
        "arrowstream/io/chunk.py",
        "        self.epoch = int(epoch)\n",
        "        self.epoch = 0\n",
        ("tests/test_carry.py",),
    ),
    Mutant(
        "estimates-use-one-rate",
        "every row group's tokens are estimated with the overall token rate, whatever its own",
        "arrowstream/distributed/balance.py",
        "    out[shards] = shard_bytes[shards] * rates[nearest]\n",
        "    out[shards] = shard_bytes[shards] * overall\n",
        ("tests/test_exact_batches.py",),
    ),
    Mutant(
        "tokie-routing-off",
        "tokie encodes every text, also those with a tab, vertical tab or form feed before an apostrophe",
        "arrowstream/tokenize/tokie_backend.py",
        "        away = routed(texts)\n",
        "        away: list[int] = []\n",
        ("tests/test_tokie.py",),
    ),
    Mutant(
        "tokie-unproven-used",
        "tokie is kept for a tokenizer on which it failed the built-in checks",
        "arrowstream/tokenize/encoders.py",
        '        if self._tokie is not None and not tokie_ok["ok"]:',
        "        if False:",
        ("tests/test_tokie.py",),
    ),
    Mutant(
        "tokie-sample-unchecked",
        "the first documents are not compared between tokie and `tokenizers`",
        "arrowstream/tokenize/proof.py",
        '    if _first_difference(texts, ref, tokie.encode(texts, routed), "tokie") is None:\n',
        "    if True:\n",
        ("tests/test_tokie.py",),
    ),
    Mutant(
        "tokie-version-not-in-key",
        "a verdict made with one tokie version is trusted under another",
        "arrowstream/tokenize/encoders.py",
        '            parts.append(f"tokie {tokie_version()}")',
        "            pass",
        ("tests/test_tokie.py",),
    ),
    Mutant(
        "block-continuation-starts-a-document",
        "a continued document's first token is taken for a document start after the first batch",
        "arrowstream/pack/concat.py",
        "    if chunk.head_skip and a == 0:\n",
        "    if chunk.head_skip:\n",
        ("tests/test_blocks.py",),
    ),
    Mutant(
        "block-batch-not-counted",
        "a batch handed out of a block leaves the packer's batch count behind (states and even batches drift)",
        "arrowstream/pack/concat.py",
        "        self.emitted += layouts\n        self.ledger.add(\"tokens\", need)\n",
        "        self.ledger.add(\"tokens\", need)\n",
        ("tests/test_blocks.py",),
    ),
    Mutant(
        "tokie-never-deferred",
        "a tokenizer proven by a stored verdict converts tiktoken at every start anyway (slow starts)",
        "arrowstream/tokenize/encoders.py",
        "        if self._proven_tokie(key, forced=forced):\n",
        "        if False:\n",
        ("tests/test_tokie.py",),
    ),
    Mutant(
        "deferred-tokie-ignores-its-refusal",
        "a stored verdict that refused tokie still starts tokie in a later encoder",
        "arrowstream/tokenize/encoders.py",
        '        if verdict is None or not verdict["ok"] or not verdict.get("tokie", {}).get("ok"):\n',
        '        if verdict is None or not verdict["ok"]:\n',
        ("tests/test_tokie.py",),
    ),
    Mutant(
        "tokie-calls-side-by-side",
        "tokie calls from several threads run at once, each spreading over every core (crowded cores)",
        "arrowstream/tokenize/tokie_backend.py",
        "        with _one_call:\n",
        "        if True:\n",
        ("tests/test_tokie.py",),
    ),
    Mutant(
        "slice-rest-makes-its-own-call",
        "a small rest of a chunk makes an encoder call of its own instead of joining the slice before it",
        "arrowstream/tokenize/slicing.py",
        "        if i >= sizes.size or (cum[-1] - cum[i - 1]) * 4 < budget:\n",
        "        if i >= sizes.size:\n",
        ("tests/test_pack.py",),
    ),
    Mutant(
        "mixture-block-sources-not-moved",
        "a batch handed out of a mixture block leaves its sources where they were (states repeat rows)",
        "arrowstream/mixture/iterator.py",
        "            self._sources[self.mixture.names[source]].skip_rows(rows, layouts=layouts)\n",
        "            pass\n",
        ("tests/test_mixture_blocks.py",),
    ),
    Mutant(
        "mixture-settle-counts-one-layout",
        "the batches of a block handed out since a source was last looked at count as one layout of it",
        "arrowstream/mixture/iterator.py",
        "            self._sources[self.mixture.names[source]].skip_rows(rows, layouts=layouts)\n",
        "            self._sources[self.mixture.names[source]].skip_rows(rows)\n",
        ("tests/test_mixture_blocks.py",),
    ),
    Mutant(
        "mixture-state-not-settled",
        "a mixture's state is taken before its sources move past the block batches handed out",
        "arrowstream/mixture/iterator.py",
        "            raise StateError(self._lost(\"a state asked for\"))\n        self._settle()\n",
        "            raise StateError(self._lost(\"a state asked for\"))\n",
        ("tests/test_mixture_blocks.py",),
    ),
    Mutant(
        "mixture-block-not-shrunk",
        "near a source's epoch end a mixture block falls back to one batch at a time instead of shrinking",
        "arrowstream/mixture/iterator.py",
        "            count = self._batches_held(ids)\n",
        "            count = 0\n",
        ("tests/test_mixture_blocks.py",),
    ),
    Mutant(
        "mixture-block-cut-row-lost",
        "a row cut between two chunks of a source's stream keeps only its first part in a mixture block",
        "arrowstream/mixture/blocks.py",
        "                tokens[dest[row], col : col + k] = piece[p : p + k]\n",
        "                tokens[dest[row], col : col + k] = piece[p : p + k] if not col else 0\n",
        ("tests/test_mixture_blocks.py",),
    ),
    Mutant(
        "first-sample-encodes-every-document-with-tiktoken",
        "while tokie is proven on the first documents, tiktoken encodes every one of them too (the old, dearer proof)",
        "arrowstream/tokenize/proof.py",
        '    if _first_difference(texts, ref, tokie.encode(texts, routed), "tokie") is None:\n        return None, None\n',
        "",
        ("tests/test_tokie.py",),
    ),
    Mutant(
        "tiktoken-trusted-on-tokies-sample",
        "when tokie is dropped during the sample, tiktoken is trusted on documents it never encoded",
        "arrowstream/tokenize/sampling.py",
        "                self._sample_left, self._sampled = self.sample_bytes, 0\n",
        "                pass\n",
        ("tests/test_tokie.py",),
    ),
    Mutant(
        "tokie-sample-vouches-for-tiktoken",
        "a verdict whose documents only tokie encoded vouches for tiktoken alone",
        "arrowstream/tokenize/verdicts.py",
        "    if verdict.get(\"documents_by\") == \"tokie\" and not tokie:\n        return 0\n",
        "",
        ("tests/test_tokie.py",),
    ),
    Mutant(
        "look-ahead-states-taken-per-batch",
        "batches made ahead take each batch's whole state (a best_fit window's references) instead of a snapshot",
        "arrowstream/state/snapshot.py",
        "    return take() if take is not None else Taken(iterator.state_dict())\n",
        "    return Taken(iterator.state_dict())\n",
        ("tests/test_torch_prefetch.py", "tests/test_snapshot.py"),
    ),
    Mutant(
        "best-fit-snapshot-shares-rows",
        "a best_fit snapshot keeps the run's own open rows, which later batches change",
        "arrowstream/pack/bestfit.py",
        "        frozen.open = [_Row(list(row.pieces), row.fill, row.age) for row in self.open]\n",
        "        frozen.open = self.open\n",
        ("tests/test_snapshot.py",),
    ),
    Mutant(
        "bucket-snapshot-shares-batches",
        "a bucket snapshot keeps the run's own formed batches, which later batches take from",
        "arrowstream/pack/bucketrun.py",
        "        frozen.out = list(self.out)\n",
        "        frozen.out = self.out\n",
        ("tests/test_snapshot.py",),
    ),
    Mutant(
        "look-ahead-snapshot-shares-counters",
        "a look-ahead snapshot reads the run's live ledger when it is built",
        "arrowstream/pack/frozen.py",
        "    frozen.ledger = _Counts(run.ledger.snapshot(), run.ledger.epoch_snapshot())\n",
        "",
        ("tests/test_snapshot.py",),
    ),
    Mutant(
        "look-ahead-snapshot-shares-store",
        "a look-ahead snapshot reads the run's live store of held documents when it is built",
        "arrowstream/pack/frozen.py",
        "    frozen.store = _Skips({key: doc.skip for key, doc in run.store.items() if doc.skip})\n",
        "    frozen.store = run.store\n",
        ("tests/test_snapshot.py",),
    ),
    Mutant(
        "look-ahead-snapshot-carries-tokens",
        "a look-ahead snapshot copies the store of held documents, tokens and all (a worker pickles it with every batch)",
        "arrowstream/pack/frozen.py",
        "    frozen.store = _Skips({key: doc.skip for key, doc in run.store.items() if doc.skip})\n",
        "    frozen.store = dict(run.store)\n",
        ("tests/test_snapshot.py",),
    ),
    Mutant(
        "worker-snapshot-built-in-the-worker",
        "StatefulLoader's workers build each batch's state instead of sending a snapshot",
        "arrowstream/handover.py",
        '    if not hasattr(snap, "with_plan"):  # it cannot leave its plan behind\n        snap = Taken(snap.to_dict())\n',
        "    snap = Taken(snap.to_dict())\n",
        ("tests/test_pytorch.py::test_the_loader_resumes_look_ahead_strategies_from_the_snapshots_its_workers_send",),
    ),
    Mutant(
        "mixture-snapshot-shares-stats",
        "a mixture snapshot keeps the live counters",
        "arrowstream/mixture/iterator.py",
        '                "stats": dict(self._stats),\n',
        '                "stats": self._stats,\n',
        ("tests/test_snapshot.py",),
    ),
    Mutant(
        "mixture-block-document-end-misplaced",
        "a document that ends at a row's last token is taken to go on (num_cut_docs and whole segments wrong)",
        "arrowstream/mixture/blocks.py",
        "        ends.append(dest[last // seq_len] * seq_len + last % seq_len + 1)\n",
        "        ends.append(dest[last // seq_len] * seq_len + last % seq_len + 1 - (last % seq_len == seq_len - 1))\n",
        ("tests/test_mixture_blocks.py",),
    ),
    Mutant(
        "freed-memory-not-kept",
        "iterators leave glibc's malloc handing freed pages back, so every batch faults its arrays in again",
        "arrowstream/pipeline/iterator.py",
        "        keep_freed_memory()  # batches",
        "        pass  # batches",
        ("tests/test_allocator.py",),
    ),
    Mutant(
        "tokie-lock-held-in-forked-child",
        "a DataLoader worker forked while an encode thread is inside tokie inherits tokie mid-call (it can hang)",
        "arrowstream/tokenize/tokie_backend.py",
        "    before=_hold_before_fork, after_in_parent=_release_after_fork, after_in_child=_fresh_locks_after_fork\n",
        "    after_in_child=_fresh_locks_after_fork\n",
        ("tests/test_tokie.py",),
    ),
    Mutant(
        "worker-shares-by-descriptor",
        "a DataLoader worker keeps torch's file-descriptor sharing: the main process fetches every batch's descriptor from the busy worker",
        "arrowstream/pytorch.py",
        "            use_sharing(self.sharing)\n",
        "            pass\n",
        ("tests/test_pytorch.py",),
    ),
    Mutant(
        "tokenizer-parsed-per-pipeline",
        "every pipeline naming a tokenizer file parses it again (a mixture of n sources parses it n times)",
        "arrowstream/tokenize/__init__.py",
        "load_tokenizer(tokenizer, shared=True)",
        "load_tokenizer(tokenizer, shared=False)",
        ("tests/test_encoders.py",),
    ),
    Mutant(
        "tokie-version-looked-up-per-call",
        "tokie's version comes from the package metadata at every call",
        "arrowstream/tokenize/tokie_backend.py",
        "@functools.lru_cache(maxsize=1)\ndef _installed_version",
        "def _no_cache(f):\n    f.cache_clear = lambda: None\n    return f\n\n\n@_no_cache\ndef _installed_version",
        ("tests/test_tokie.py",),
    ),
    Mutant(
        "default-depth-not-sized",
        "to_torch(prefetch=None) stays at 2 batches ahead instead of what 64 MiB holds (up to 16)",
        "arrowstream/pytorch.py",
        "                    ahead.resize(depth_for(",
        "                    (depth_for(",
        ("tests/test_torch_prefetch.py::test_the_default_depth_is_sized_from_the_first_batch",),
    ),
    Mutant(
        "stream-closed-elsewhere-blocks",
        "a to_torch() stream finalized in another thread (an encoder thread its producer waits on) closes in place and hangs",
        "arrowstream/pytorch.py",
        "closing(ahead.close, it.close, wait=ident() == consumer)",
        "closing(ahead.close, it.close, wait=True)",
        ("tests/test_torch_prefetch.py::test_a_stream_closed_from_a_thread_its_producer_waits_on_does_not_deadlock",),
    ),
    Mutant(
        "loader-plans-per-state",
        "StatefulLoader makes each worker's plan again at every state_dict() (0.3 s each on 85 MB)",
        "arrowstream/pytorch.py",
        "            if snap is not None and index in self._plans:",
        "            if False:",
        ("tests/test_pytorch.py::test_the_loader_makes_each_workers_plan_once_between_loads",),
    ),
    Mutant(
        "reference-in-one-call",
        "tokenizers encodes a whole slice in one call (a 2 MiB call keeps 50 MB of the C heap for good)",
        "arrowstream/tokenize/encoders.py",
        "        for part in reference_calls(texts, REFERENCE_CALL_BYTES):",
        "        for part in [list(texts)]:",
        ("tests/test_encoders.py::test_the_reference_encodes_in_bounded_calls_with_the_same_ids",),
    ),
    Mutant(
        "small-batches-by-name",
        "to_torch's default sends every batch from a worker by shared-memory name: a torch_shm_manager process per worker",
        "arrowstream/handover.py",
        "    return 0 if capacity is None else capacity - PICKLE_SLACK\n",
        "    return 0\n",
        ("tests/test_handover.py",),
    ),
    Mutant(
        "big-batches-through-the-pipe",
        "to_torch's default sends batches larger than the result pipe through it too (turns of writing and reading)",
        "arrowstream/handover.py",
        "    return 0 if capacity is None else capacity - PICKLE_SLACK\n",
        "    return float('inf')\n",
        ("tests/test_handover.py",),
    ),
    Mutant(
        "result-pipe-not-widened",
        "a worker finds the result pipe but leaves it at 64 KiB: a batch crosses in several turns",
        "arrowstream/handover.py",
        "            return int(fcntl.fcntl(writer.fileno(), setter, most))\n",
        "            return most\n",
        ("tests/test_handover.py",),
    ),
    Mutant(
        "worker-snapshot-unpickled-per-batch",
        "StatefulLoader's workers send their snapshots unsealed: the main process unpickles one with every batch",
        "arrowstream/handover.py",
        '    return {"snapshot": Sealed(snap, stream), "consumer": it.consumer.index, "last": last}\n',
        '    return {"snapshot": snap, "consumer": it.consumer.index, "last": last}\n',
        ("tests/test_pytorch.py::test_the_loader_resumes_look_ahead_strategies_from_the_snapshots_its_workers_send",),
    ),
    Mutant(
        "sealed-snapshot-opened-on-arrival",
        "a sealed snapshot is unpickled as soon as it arrives rather than when a state is asked for",
        "arrowstream/state/sealed.py",
        "    return sealed\n\n\ndef opened(",
        "    sealed.open()\n    return sealed\n\n\ndef opened(",
        ("tests/test_pytorch.py::test_the_loader_resumes_look_ahead_strategies_from_the_snapshots_its_workers_send",),
    ),
    Mutant(
        "mixture-snapshot-crosses-with-its-mixture",
        "a mixture snapshot pickles its whole mixture (every source's dataset) with every batch a worker sends",
        "arrowstream/mixture/snapshot.py",
        "        return (MixtureSnapshot, (None, self.own, self.sources, self.dormant))\n",
        "        return (MixtureSnapshot, (self.mixture, self.own, self.sources, self.dormant))\n",
        ("tests/test_mixture.py::test_loader_workers_resume_exactly",),
    ),
    Mutant(
        "sealed-difference-names-the-wrong-row",
        "a snapshot sent as a difference names each shared row by the place before its own in the base",
        "arrowstream/pack/frozen.py",
        "            parts[name] = [row if (i := index.get(id(row))) is None else i for row in getattr(self.run, name)]\n",
        "            parts[name] = [row if (i := index.get(id(row))) is None else max(i - 1, 0) for row in getattr(self.run, name)]\n",
        ("tests/test_sealed.py",),
    ),
    Mutant(
        "frozen-rows-copied-so-never-shared",
        "a best_fit snapshot copies its formed rows, so no later snapshot shares them and every one crosses whole",
        "arrowstream/pack/bestfit.py",
        "        frozen.ready = list(self.ready)\n        frozen.out = list(self.out)\n",
        "        frozen.ready = [list(p) for p in self.ready]\n        frozen.out = [list(p) for p in self.out]\n",
        ("tests/test_sealed.py",),
    ),
    Mutant(
        "sealed-base-kept-for-one-difference",
        "the receiving side forgets a stream's base after the first difference that refers to it",
        "arrowstream/state/sealed.py",
        "        kept = _bases.get(stream)\n",
        "        kept = _bases.pop(stream, None)\n",
        ("tests/test_sealed.py::test_differences_opened_as_they_arrive_leave_the_base_for_the_next",),
    ),
    Mutant(
        "slot-taken-while-held",
        "a worker writes a batch into a slot the main process still views (a kept batch is overwritten)",
        "arrowstream/slots.py",
        "            if not self.flags[slot]:\n",
        "            if True:\n",
        ("tests/test_slots.py",),
    ),
    Mutant(
        "slot-never-freed",
        "a slot stays held after the main process drops its batch: the ring fills and every later batch goes the slow way",
        "arrowstream/slots.py",
        "    flags[slot] = 0\n",
        "    pass\n",
        ("tests/test_slots.py::test_batches_dropped_as_they_come_all_cross_in_slots",),
    ),
    Mutant(
        "slots-off-by-default",
        "to_torch's default sends batches through the pipe or by name, never in slots",
        "arrowstream/handover.py",
        "    out.in_slots = sharing == AUTO and slots.available()\n",
        "    out.in_slots = False\n",
        ("tests/test_handover.py", "tests/test_slots.py"),
    ),
    Mutant(
        "worker-copy-takes-a-slot",
        "a copy of a batch made in a worker pickles it, taking a slot that nothing ever frees",
        "arrowstream/handover.py",
        "    def __deepcopy__(self, memo",
        "    def _no_deepcopy(self, memo",
        ("tests/test_handover.py::test_a_copy_made_in_a_worker_takes_no_slot",),
    ),
    Mutant(
        "ring-of-exited-workers-kept",
        "the main process keeps the ring of every worker that ever ran (non-persistent workers: one more pair per epoch)",
        "arrowstream/slots.py",
        "        if (key[:2] == (pid, nonce) and key[2] < serial) or not _alive(key[0]):\n",
        "        if key[:2] == (pid, nonce) and key[2] < serial:\n",
        ("tests/test_slots.py::test_workers_of_later_epochs_get_new_rings_and_exited_ones_are_forgotten",),
    ),
    Mutant(
        "forked-child-frees-the-slot",
        "a process forked while the main process holds a batch frees its slot when it drops its copy",
        "arrowstream/slots.py",
        "    if os.getpid() == pid:  # not in a process forked",
        "    if True:  # not in a process forked",
        ("tests/test_slots.py::test_a_process_forked_while_a_batch_is_held_does_not_free_its_slot",),
    ),
    Mutant(
        "split-document-loses-its-rest",
        "`.bucket` splitting a long document emits its first piece and never the ones after it",
        "arrowstream/pack/bucketrun.py",
        "                if end < self.store[(ref[0], ref[1])].tokens.size:\n",
        "                if end < 0:\n",
        ("tests/test_bucket.py::test_long_documents_are_split_by_default_every_token_once_in_order",),
    ),
    Mutant(
        "split-document-held-from-its-start",
        "a split document's state says none of it was emitted, so an elastic resume emits its first pieces again",
        "arrowstream/pack/bucketrun.py",
        "            if start < first.get(key, start + 1):\n                first[key] = start\n",
        "            first[key] = 0\n",
        ("tests/test_bucket.py::test_an_elastic_resume_emits_every_piece_of_split_documents_once",),
    ),
    Mutant(
        "split-pieces-left-at-the-epoch-end",
        "the pieces of split documents still to come when an epoch's data is used up are never formed",
        "arrowstream/pack/bucketrun.py",
        "        if self.flushed and self.carry:  # the next pieces",
        "        if False and self.carry:  # the next pieces",
        ("tests/test_bucket.py::test_long_documents_are_split_by_default_every_token_once_in_order",),
    ),
    Mutant(
        "slot-error-before-the-worker-is-seen-dead",
        "a ring whose worker was killed is refused at once, so the DataLoader finds no dead worker and the fault surfaces as a slot error",
        "arrowstream/slots.py",
        "        while not _gone(pid) and time.monotonic() < deadline:\n",
        "        while False and time.monotonic() < deadline:\n",
        ("tests/test_slots.py::test_a_ring_handle_that_fails_while_its_worker_is_dying_waits_until_the_worker_can_be_seen_dead",),
    ),
    Mutant(
        "worker-zombie-leader-taken-for-dead",
        "a killed worker counts as gone while its threads still exit (waitpid cannot see it yet)",
        "arrowstream/slots.py",
        "        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None\n",
        "        return True\n",
        ("tests/test_slots.py::test_a_ring_handle_that_fails_while_its_worker_is_dying_waits_until_the_worker_can_be_seen_dead",),
    ),
    Mutant(
        "bucketing-prediction-truncates",
        "the analysis predicts bucketing with long documents truncated, not split as `.bucket` does by default",
        "arrowstream/analysis/simulate.py",
        'max_len=max_len, long_docs="split", seed=seed)',
        'max_len=max_len, long_docs="truncate", seed=seed)',
        ("tests/test_analysis.py",),
    ),
    Mutant(
        "checks-in-one-call",
        "the built-in checks give each backend all the vocabulary or all the probes in one call (the first process 25 MB larger)",
        "arrowstream/tokenize/proof.py",
        "        for part in reference_calls(texts, CHECK_CALL_CHARS):",
        "        for part in [texts]:",
        ("tests/test_encoders.py",),
    ),
    Mutant(
        "checks-number-texts-within-the-call",
        "a difference found by the built-in checks is numbered within its call, not among all the texts of its kind",
        "arrowstream/tokenize/proof.py",
        "            done += len(part)\n",
        "",
        ("tests/test_encoders.py",),
    ),
    Mutant(
        "transient-ignores-the-chain",
        "only the last error of a chain is asked whether it is transient: s3fs's IndexError over a timeout is not retried",
        "arrowstream/io/failures.py",
        "    for link in _chain(exc):\n        if isinstance(link, (TimeoutError, ConnectionError)):",
        "    for link in [exc]:\n        if isinstance(link, (TimeoutError, ConnectionError)):",
        ("tests/test_storage.py",),
    ),
    Mutant(
        "client-errors-escape-unnamed",
        "a read catches only pyarrow's and OS errors: aiohttp's cut body escapes, neither retried nor named",
        "arrowstream/io/reader.py",
        "            except Exception as exc:  # a Python filesystem's client raises classes of its own (aiohttp's, say)\n"
        "                if isinstance(exc, MemoryError):\n                    raise\n                # a file",
        "            except (pa.ArrowInvalid, pa.ArrowIOError, OSError, IndexError, ShardError) as exc:\n"
        "                if isinstance(exc, MemoryError):\n                    raise\n                # a file",
        ("tests/test_storage.py",),
    ),
    Mutant(
        "counts-skip-unreadable-row-groups",
        "counting a share's tokens skips a row group it cannot read: a dataset behind a refusal gives no batch and no error",
        "arrowstream/tokenize/known.py",
        "            reader = ShardReader(manifest, [column], warn=False)",
        "            reader = ShardReader(manifest, [column], skip_unreadable=True, warn=False)",
        ("tests/test_skip.py", "tests/test_storage.py"),
    ),
    Mutant(
        "refusals-skipped",
        "on_error='skip' skips a row group the storage refused (access denied), losing a whole file to a credentials problem",
        "arrowstream/io/failures.py",
        "    return isinstance(exc, READ_ERRORS) and not transient(exc) and not refused(exc)",
        "    return isinstance(exc, READ_ERRORS) and not transient(exc)",
        ("tests/test_storage.py",),
    ),
    Mutant(
        "error-text-hides-the-cause",
        "a storage error's text is its last error's alone: s3fs's 'tuple index out of range' with no word of the timeout",
        "arrowstream/io/failures.py",
        "    if said is None:\n        return text",
        "    if True:\n        return text",
        ("tests/test_storage.py",),
    ),
    Mutant(
        "count-skips-silently",
        "under on_error='skip', a row group skipped while counting tokens is not said: a dataset none of whose row groups decode gives nothing, silently",
        "arrowstream/core/stage.py",
        "                if shard not in warned:\n                    warned.add(shard)",
        "                if False:\n                    warned.add(shard)",
        ("tests/test_skip.py",),
    ),
    Mutant(
        "footer-reads-never-retried",
        "a transient error reading a footer when the dataset opens ends the open at once",
        "arrowstream/io/footer.py",
        "        etag, meta = retried(read)",
        "        etag, meta = read()",
        ("tests/test_storage.py",),
    ),
    Mutant(
        "botocore-codes-not-transient",
        "only an OSError's text is read for throttling words: s3fs's EBUSY over botocore's SlowDown is not retried",
        "arrowstream/io/failures.py",
        "        if any(word in str(link) for word in _TRANSIENT):",
        "        if isinstance(link, OSError) and any(word in str(link) for word in _TRANSIENT):",
        ("tests/test_storage.py",),
    ),
    Mutant(
        "fsspec-files-pinned-by-size-only",
        "the ETag of a file read through fsspec is not known (its metadata states none): a same-size replacement is read with the old footer",
        "arrowstream/io/footer.py",
        "    if not value and inner is not None and path is not None:",
        "    if False:",
        ("tests/test_storage.py",),
    ),
    Mutant(
        "fsspec-filesystem-kept-after-fork",
        "a forked DataLoader worker reads through the parent's async fsspec filesystem, which refuses it ('not fork-safe')",
        "arrowstream/io/manifest.py",
        "        if inner is not None and getattr(inner, \"_pid\", None) not in (None, os.getpid()):",
        "        if False:",
        ("tests/test_storage.py",),
    ),
    Mutant(
        "listing-never-retried",
        "a transient error listing the dataset's files while it opens ends the open at once",
        "arrowstream/io/discover.py",
        "        infos = retried(lambda: fs.get_file_info(pafs.FileSelector(base, recursive=True)))",
        "        infos = fs.get_file_info(pafs.FileSelector(base, recursive=True))",
        ("tests/test_storage.py",),
    ),
    Mutant(
        "path-lookup-never-retried",
        "a transient error looking up the path a dataset is opened from ends the open at once",
        "arrowstream/io/discover.py",
        "            info = retried(lambda: fs.get_file_info(path))  # type: ignore[union-attr]",
        "            info = fs.get_file_info(path)  # type: ignore[union-attr]",
        ("tests/test_storage.py",),
    ),
    Mutant(
        "empty-batch-share-cut-inside-a-document",
        "a consumer with no token (fewer batches than consumers) gets an empty range inside a document",
        "arrowstream/distributed/tokens.py",
        "    if hi <= lo:  # fewer batches than consumers",
        "    if False:  # fewer batches than consumers",
        ("tests/test_exact_batches.py",),
    ),
    Mutant(
        "concat-drop-last-counts-no-documents",
        "concat's drop_last counts the tokens it drops but not the documents",
        "arrowstream/pack/concat.py",
        "                self.ledger.add(\"dropped_docs\", sum(_untouched(c, a) for c, a, _ in pieces))\n",
        "",
        ("tests/test_pack.py",),
    ),
    Mutant(
        "not-utf8-unnamed",
        "a document that is not UTF-8 escapes as a UnicodeDecodeError naming no file, row group or column",
        "arrowstream/tokenize/text.py",
        "        raise invalid_utf8(column, values, chunk, exc) from exc",
        "        raise",
        ("tests/test_errors.py",),
    ),
    Mutant(
        "float-bounds-prune",
        "a floating-point column's bounds (NaN left out) rule row groups out",
        "arrowstream/io/statistics.py",
        "            if pa.types.is_floating(field.type):  # bounds leave NaN out",
        "            if False:  # bounds leave NaN out",
        ("tests/test_statistics.py",),
    ),
    Mutant(
        "stage-output-unchecked",
        "a stage that slices its batch without with_rows loses rows with no error and no count",
        "arrowstream/core/execute.py",
        "        return _in_step(stage, _located(stage, piece, where, lambda: stage.run(piece)), where)",
        "        return _located(stage, piece, where, lambda: stage.run(piece))",
        ("tests/test_stage.py",),
    ),
    Mutant(
        "token-rate-sample-never-skips",
        "with on_error='skip', the token-rate sample of estimated even batches raises on an unreadable row group",
        "arrowstream/distributed/balance.py",
        "                if skip_unreadable and exc.__cause__ is not None and skippable(exc.__cause__):",
        "                if False:",
        ("tests/test_skip.py",),
    ),
    Mutant(
        "producer-warns-in-its-own-thread",
        "a warning of the prefetch thread names the thread's start, not the user's line",
        "arrowstream/io/prefetch.py",
        "    forward_warnings(outbox.append)  # warned again by the consumer, at the user's line\n",
        "",
        ("tests/test_prefetch.py", "tests/test_skip.py"),
    ),
    Mutant(
        "pool-warns-in-its-own-thread",
        "a warning of an encoder-pool thread names the thread's start, not the user's line",
        "arrowstream/core/execute.py",
        "    forward_warnings(sink)\n    try:\n        return fn(item)",
        "    try:\n        return fn(item)",
        ("tests/test_prefetch.py",),
    ),
    Mutant(
        "integer-widths-drift",
        "token ids written as list<int32> in one file and list<int64> in another are refused as drift",
        "arrowstream/io/schema.py",
        "        common = _common_type(dtype, other)",
        "        common = dtype if dtype == other else None",
        ("tests/test_manifest.py",),
    ),
    Mutant(
        "closed-iterator-starts-again",
        "next() on a closed iterator fails instead of ending the stream",
        "arrowstream/pipeline/iterator.py",
        "        if self._closed:  # as a closed generator: the stream has ended\n            raise StopIteration\n",
        "",
        ("tests/test_state.py",),
    ),
    Mutant(
        "reweighted-report-forgets-the-old-weights",
        "after a re-weighting the report's target counts the new weights over the whole span of its counters",
        "arrowstream/mixture/reweight.py",
        "    prior = dict(own.get(\"prior\") or {})\n    if own.get(\"stages\"):",
        "    prior = dict(own.get(\"prior\") or {})\n    if False:",
        ("tests/test_mixture.py",),
    ),
    Mutant(
        "edited-states-accepted",
        "a state whose checksum does not match its contents is resumed from",
        "arrowstream/state/checksum.py",
        "    if saved != actual:",
        "    if False:",
        ("tests/test_state.py", "tests/test_errors.py"),
    ),
    Mutant(
        "mixture-state-unchecked",
        "a mixture's state changed after it was saved is resumed from",
        "arrowstream/mixture/iterator.py",
        "        verify_checksum(state)\n",
        "",
        ("tests/test_state.py",),
    ),
    Mutant(
        "state-contents-unchecked",
        "a state resumes on files rewritten with other data of the same sizes and row counts",
        "arrowstream/state/envelope.py",
        "    if saved.get(\"contents\") is not None and dataset.get(\"contents\") not in (None, saved[\"contents\"]):",
        "    if False:",
        ("tests/test_errors.py",),
    ),
    Mutant(
        "loaded-state-starts-every-pass",
        "a StatefulLoader's loaded state starts every later pass again",
        "arrowstream/pytorch.py",
        "        self._start, self._loaded, self._next, self._first = self._loaded, None, self._first, 0",
        "        self._start, self._next = self._loaded, self._first",
        ("tests/test_pytorch.py",),
    ),
    Mutant(
        "merged-state-restarts-the-rotation",
        "a merged state on the same topology starts the workers' turns at worker 0",
        "arrowstream/state/ranks.py",
        "    return sum(batches) % n",
        "    return 0",
        ("tests/test_pytorch.py",),
    ),
    Mutant(
        "batchless-worker-state-yielded-as-a-batch",
        "the state a worker with no batch sends alone reaches the trainer as an empty batch",
        "arrowstream/pytorch.py",
        "            if not batch:  # a worker that made no batch: its state alone, not a turn\n                continue\n",
        "",
        ("tests/test_pytorch.py",),
    ),
    Mutant(
        "tokenless-epoch-read-by-nobody",
        "when no row holds a token (every row group unreadable, say), no consumer reads a row, and nothing is counted",
        "arrowstream/distributed/tokens.py",
        "    if int(cut.ends[-1]) == 0 and consumer == 0:",
        "    if False:",
        ("tests/test_skip.py",),
    ),
    Mutant(
        "report-ignores-consumer-shares",
        "the budget report judges a capped source by the whole source, as if one consumer read it: a rank runs out unwarned",
        "arrowstream/mixture/report.py",
        "_most_epochs(plan, demand[:, i], walk) if count > 1",
        "_most_epochs(plan, demand[:, i], walk) if False",
        ("tests/test_mixture.py",),
    ),
    Mutant(
        "report-fair-consumer-demand",
        "the budget report takes every consumer's rows of a source at its weight, not the schedule's own draws",
        "arrowstream/mixture/report.py",
        "    counted = min(steps, max(1, _COUNTED_ROWS // per_step))",
        "    counted = 0",
        ("tests/test_mixture.py",),
    ),
    Mutant(
        "capped-source-shares-by-rows",
        "a capped mixture source's consumers get shares of equal rows, so one comes round (and runs out) well before another",
        "arrowstream/mixture/mix.py",
        "balanced=name in caps)",
        "balanced=False)",
        ("tests/test_mixture.py",),
    ),
    Mutant(
        "sample-estimate-counts-eos-twice",
        "the sampled token total takes its tokens per character from lengths that hold the EOS, then adds an EOS a document",
        "arrowstream/analysis/lengths.py",
        "    ratio = float((lengths.sum() - (n if add_eos else 0)) / chars.sum())",
        "    ratio = float(lengths.sum() / chars.sum())",
        ("tests/test_analysis.py",),
    ),
    Mutant(
        "analysis-json-drops-sample-info",
        "the JSON's tokens row overwrites how the tokens were counted (a sample's size, intervals and estimate)",
        "arrowstream/analysis/__init__.py",
        "            out[measure] = {**row, **about} if isinstance(about, dict) else row",
        "            out[measure] = row",
        ("tests/test_analysis.py",),
    ),
    Mutant(
        "by-group-null-dropped",
        "documents whose `by` value is null fall out of the per-group table (a null group of 0 documents)",
        "arrowstream/analysis/lengths.py",
        '        part = counts.filter(pl.col("group").is_null() if group is None else pl.col("group") == group)',
        '        part = counts.filter(pl.col("group") == group)',
        ("tests/test_analysis.py",),
    ),
    Mutant(
        "sample-bucketing-over-the-sample-alone",
        "a sample is bucketed as it is, not drawn out to the corpus: a long document's later rows wait for the epoch's end",
        "arrowstream/analysis/simulate.py",
        "    drawn = n if num_docs is None else min(num_docs, max(n, _SAMPLE_WINDOWS * window))",
        "    drawn = n",
        ("tests/test_analysis.py",),
    ),
    Mutant(
        "sample-bucketing-no-slack",
        "the sampled bucketing interval leaves out the model's own lean under the run",
        "arrowstream/analysis/simulate.py",
        "SAMPLE_BUCKET_SLACK = 0.25",
        "SAMPLE_BUCKET_SLACK = 0.0",
        ("tests/test_analysis.py",),
    ),
    Mutant(
        "merged-state-ignores-workers-a-rank",
        "a merged state loaded on the same number of consumers split into other ranks keeps each consumer's old count",
        "arrowstream/distributed/topology.py",
        '        same = count == consumer.count and state.get("num_workers") in (None, consumer.per_rank)',
        "        same = count == consumer.count",
        ("tests/test_topology.py",),
    ),
    Mutant(
        "own-state-ignores-workers-a-rank",
        "a worker's own state loads as a rank of another split of the same consumers, keeping a count evened per rank",
        "arrowstream/pipeline/iterator.py",
        "        if state.num_workers not in (None, self.consumer.per_rank) and counted_targets(self.plan):",
        "        if False:",
        ("tests/test_topology.py",),
    ),
    Mutant(
        "checkpoint-merge-refuses-drifted-workers",
        "load_data_state merges one checkpoint's states without drift: DataLoader workers epochs apart are refused",
        "arrowstream/checkpoint.py",
        "    loader.load_state_dict(merge_states(states, drift=True))",
        "    loader.load_state_dict(merge_states(states))",
        ("tests/test_huggingface.py",),
    ),
    Mutant(
        "lookahead-counts-a-window-before-it-is-whole",
        "a look-ahead window counts each chunk as read as it comes: a read that fails later in the window loses them",
        "arrowstream/pack/lookahead.py",
        "            taken.append(chunk)\n            for i, key in enumerate(_keys(chunk)):",
        "            self._commit([chunk])\n            for i, key in enumerate(_keys(chunk)):",
        ("tests/test_faults.py",),
    ),
    Mutant(
        "failed-next-forgets-the-position",
        "after a next() that raised, the iterator goes on from whatever its producer and packer held",
        "arrowstream/pipeline/iterator.py",
        "            self._failed = self.snapshot().to_dict()",
        "            pass",
        ("tests/test_faults.py",),
    ),
    Mutant(
        "iterator-started-before-its-start-succeeds",
        "an iterator counts as started before its start's reads succeed: a failure there leaves it half-started",
        "arrowstream/pipeline/iterator.py",
        "        try:\n            self._begin()",
        "        self._started = True\n        try:\n            self._begin()",
        ("tests/test_faults.py",),
    ),
    Mutant(
        "failed-mixture-batch-gives-a-state",
        "after a mixture batch failed, its state is given (and resumes past the rows the failed batch took)",
        "arrowstream/mixture/iterator.py",
        "            self._broken = exc\n            raise",
        "            raise",
        ("tests/test_faults.py",),
    ),
    Mutant(
        "no-such-key-not-a-refusal",
        "pyarrow's NO_SUCH_KEY is not known as a refusal: a deleted object is skipped as bad bytes",
        "arrowstream/io/failures.py",
        '    "NO_SUCH_KEY", "NO_SUCH_BUCKET", "RESOURCE_NOT_FOUND", "HTTP status 404",  # pyarrow\'s spellings of them\n',
        "",
        ("tests/test_storage.py::test_pyarrows_words_for_a_missing_object_are_a_refusal_never_a_skip",),
    ),
    Mutant(
        "failed-read-not-checked-for-a-change",
        "a read that fails because the object was replaced is taken for bad bytes (skipped under on_error='skip')",
        "arrowstream/io/reader.py",
        "                changed = self._changed(info.path, exc)\n",
        "                changed = None\n",
        ("tests/test_storage.py",),
    ),
    Mutant(
        "open-files-never-rechecked",
        "files stay open across epochs unchecked: an object replaced with the same size is read with its old footer",
        "arrowstream/pipeline/reading.py",
        '        innermost(reader, "recheck").recheck()',
        "        pass",
        ("tests/test_storage.py",),
    ),
    Mutant(
        "manifest-file-read-locally",
        "a manifest file's path is read from the local disk (a URI by its own scheme) whatever filesystem the data has",
        "arrowstream/io/manifest_file.py",
        "    fs, target = _where(path, filesystem, writing=False)",
        "    fs, target = resolve_filesystem(path, None)",
        ("tests/test_storage.py",),
    ),
    Mutant(
        "sample-bucketing-read-in-default-chunks",
        "a sample's drawn-out corpus is bucketed in chunks of 1,024 documents, not the run's: its windows run long",
        "arrowstream/analysis/simulate.py",
        "    sizes = None if read_chunks is None or not read_chunks.size else _cut(read_chunks, corpus.size)",
        "    sizes = None",
        ("tests/test_analysis.py",),
    ),
    Mutant(
        "deleted-open-file-unchecked",
        "a file that can no longer be opened passes the check of the files open: read on through its old handle",
        "arrowstream/io/reader.py",
        "            if not refused(exc):\n                return None\n",
        "            return None\n",
        ("tests/test_faults.py",),
    ),
    Mutant(
        "list-view-cast-direct",
        "token ids written as list views are cast straight to lists, which pyarrow botches",
        "arrowstream/io/reader.py",
        "table = unview(table).cast(schema)",
        "table = table.cast(schema)",
        ("tests/test_manifest.py",),
    ),
    Mutant(
        "redeal-by-rows-for-held-documents",
        "an elastic resume of best_fit or bucket re-deals equal rows: held documents, mostly emitted, weigh as whole rows",
        "arrowstream/pipeline/plan.py",
        "        if counts is not None:\n            return weighted_recut(pooled, counted_lengths(layout, counts), parts)\n",
        "        if counts is not None:\n            return None\n",
        ("tests/test_topology.py",),
    ),
    Mutant(
        "estimated-target-ignores-skip",
        "the estimated target of a re-dealt share counts tokens a held document already gave",
        "arrowstream/distributed/balance.py",
        "    return max(tokens - skip, 0.0)\n",
        "    return max(tokens, 0.0)\n",
        ("arrowstream/distributed/balance.py",),
    ),
    Mutant(
        "huge-document-through-the-reference",
        "during the document sample a huge document goes whole through the reference encoder (gigabytes)",
        "arrowstream/tokenize/encoders.py",
        "        return self._sample(texts) if not huge else self._sample_around(texts, huge)\n",
        "        return self._sample(texts)\n",
        ("tests/test_encoders.py",),
    ),
    Mutant(
        "epoch-stats-kept-forever",
        "an endless run's state keeps the counters of every epoch begun and grows without end",
        "arrowstream/io/chunk.py",
        "        for old in [e for e in self.by_epoch if e <= self.epoch - KEPT_EPOCHS]:\n            del self.by_epoch[old]\n",
        "",
        ("tests/test_state_sizes.py",),
    ),
    Mutant(
        "checksum-may-be-taken-off",
        "a version 8 state stripped of its checksum loads unchecked: an edit made with it resumes, data lost",
        "arrowstream/state/checksum.py",
        "        if not missing_ok and isinstance(version, int)",
        "        if False and isinstance(version, int)",
        ("tests/test_state.py",),
    ),
    Mutant(
        "oversized-row-group-unchecked",
        "a row group with more than 2 GiB of text is read as it comes: part of its rows, or a misleading cast error",
        "arrowstream/io/reader.py",
        "        check_batch_size(table, info.path, info.row_group)\n",
        "",
        ("tests/test_manifest.py",),
    ),
    Mutant(
        "misspelt-option-unnamed",
        "a misspelt `.pack` option reaches the packer as a TypeError naming an internal class, or a wrong hint",
        "arrowstream/pack/strategies.py",
        '    check_options(".pack", options, BestFitPacker, also=("strategy",))',
        "    pass",
        ("tests/test_errors.py",),
    ),
    Mutant(
        "cache-page-checksums-unverified",
        "a token-cache entry's damaged bytes are read as ids and blamed on the data file",
        "arrowstream/tokenize/cache.py",
        "            with pq.ParquetFile(path, page_checksum_verification=True) as entry:",
        "            with pq.ParquetFile(path) as entry:",
        ("tests/test_cache.py",),
    ),
    Mutant(
        "rank-files-of-other-steps-merged",
        "load_data_state merges rank files saved at different training steps without a word",
        "arrowstream/checkpoint.py",
        "    _check_one_step(folder, states)\n",
        "",
        ("tests/test_huggingface.py",),
    ),
    Mutant(
        "list-column-measured-in-bytes",
        "a token-id row group is refused by its bytes, though a list's 32-bit offsets count elements",
        "arrowstream/io/schema.py",
        "            len(chunk.values) if lists else",
        "            len(chunk.values) * 8 if lists else",
        ("tests/test_manifest.py",),
    ),
    Mutant(
        "eos-check-by-entry-count",
        "a tokenizer whose ids have gaps has its real end-of-text id refused (entry count taken for the largest id)",
        "arrowstream/tokenize/tokenizer.py",
        "    top = max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1)\n",
        "    top = tokenizer.get_vocab_size(with_added_tokens=True) - 1\n",
        ("tests/test_errors.py",),
    ),
]


def _copy_checkout(dest: Path) -> None:
    """Copy the package, tests and project files (not .git, caches or build output)."""
    for name in ("arrowstream", "tests", "pyproject.toml"):
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, dest / name)


def _apply(copy: Path, mutant: Mutant) -> str:
    """Apply ``mutant`` in ``copy``; return the unified diff."""
    path = copy / mutant.path
    text = path.read_text(encoding="utf-8")
    found = text.count(mutant.old)
    if found != 1:
        raise LookupError(f"{mutant.name}: the text to replace occurs {found} times in {mutant.path}, not once")
    changed = text.replace(mutant.old, mutant.new)
    path.write_text(changed, encoding="utf-8")
    return "".join(
        difflib.unified_diff(
            text.splitlines(keepends=True), changed.splitlines(keepends=True), mutant.path, mutant.path
        )
    )


def _run_tests(copy: Path, tests: tuple[str, ...]) -> tuple[bool, str]:
    """Run ``tests`` in ``copy`` (its package first on the path); return (passed, summary line)."""
    env = {**os.environ, "PYTHONPATH": str(copy)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    proc = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    return proc.returncode == 0, lines[-1] if lines else proc.stderr.strip()[-200:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--show", action="store_true", help="print each mutant's diff")
    args = parser.parse_args(argv)
    known = {m.name: m for m in MUTANTS}
    if args.list:
        for m in MUTANTS:
            print(f"{m.name:42} {m.hole}\n{'':42} tests: {' '.join(m.tests)}")
        return 0
    unknown = [n for n in args.names if n not in known]
    if unknown:
        parser.error(f"unknown mutants {unknown}; --list shows them")
    chosen = [known[n] for n in args.names] or MUTANTS
    survived = 0
    with tempfile.TemporaryDirectory(prefix="arrowstream-mutations-") as tmp:
        clean = Path(tmp) / "clean"
        _copy_checkout(clean)
        for tests in dict.fromkeys(m.tests for m in chosen):
            ok, summary = _run_tests(clean, tests)
            if not ok:
                print(f"the unchanged code fails {' '.join(tests)} ({summary}): fix that first")
                return 1
        for m in chosen:
            copy = Path(tmp) / m.name
            _copy_checkout(copy)
            try:
                diff = _apply(copy, m)
            except LookupError as exc:
                print(exc)
                return 2
            if args.show:
                print(diff)
            ok, summary = _run_tests(copy, m.tests)
            survived += ok
            print(f"{'SURVIVED' if ok else 'killed':8}  {m.name:42} {summary}")
            shutil.rmtree(copy)
    print(f"{len(chosen) - survived} of {len(chosen)} mutants killed")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
