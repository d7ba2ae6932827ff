"""A byte-level BPE with a real vocabulary of 50k-150k tokens, for start-up figures at the size users run.

The benchmark corpus is made of a few thousand distinct words, so a
tokenizer trained on it stops at about 6,000 merges whatever ``--vocab``
asks; loading and converting such a tokenizer takes a few milliseconds, and
hides what a GPT-2 (50k), Llama 3 (128k) or Qwen (151k) vocabulary costs a
fresh process. :func:`wide_tokenizer_file` trains one on texts of random
words (a Zipf law over 400,000 of them), so the trainer reaches the
vocabulary asked for; it is trained once (about 25 s for 128k here) and kept
in the benchmarks' work directory.

Usage::

    python benchmarks/wide_vocab.py 128000    # prints the path, training it if missing
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

#: Distinct random words the texts are made of, and the seed that makes them.
WORDS, SEED = 400_000, 1234


def _texts(rng: np.random.Generator, count: int = 80_000, words: int = 200) -> Iterator[str]:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyzéüßøæ"))
    lengths = rng.integers(3, 12, size=WORDS)
    codes = rng.integers(0, letters.size, size=int(lengths.sum()))
    ends = np.cumsum(lengths)
    chars = letters[codes]
    vocab = ["".join(chars[e - n : e]) for e, n in zip(ends.tolist(), lengths.tolist())]
    for _ in range(count):
        yield " ".join(vocab[i] for i in (rng.zipf(1.1, words) % WORDS).tolist())


def wide_tokenizer_file(workdir: Path, vocab_size: int) -> Path:
    """Return the path of a byte-level BPE of ``vocab_size`` tokens trained on random words, training it if missing."""
    from arrowstream.testing.tokenizer import train_tokenizer

    path = workdir / "tokenizers" / f"bpe-wide{vocab_size}-words{WORDS}-seed{SEED}.json"
    if path.is_file():
        return path
    print(f"  training a {vocab_size:,}-token tokenizer on random words ...", file=sys.stderr)
    t0 = time.perf_counter()
    tok = train_tokenizer(_texts(np.random.default_rng(SEED)), vocab_size=vocab_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    tok.save(str(tmp))
    tmp.rename(path)
    print(f"  trained in {time.perf_counter() - t0:.1f} s: {tok.get_vocab_size():,} tokens", file=sys.stderr)
    return path


if __name__ == "__main__":
    print(wide_tokenizer_file(Path("/tmp/arrowstream-bench"), int(sys.argv[1]) if len(sys.argv) > 1 else 128_000))
