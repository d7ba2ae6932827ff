"""Synthetic, seeded sample data: English-like documents, Parquet files, a tokenizer.

The rest of arrowstream reads Parquet, tokenizes and packs; its tests and
benchmarks need data that looks like a real pretraining corpus without
downloading one. This module makes it offline:

- :func:`make_texts` draws documents from a built-in vocabulary of common
  English words with Zipf-like frequencies, log-normal (heavy-tailed) lengths,
  capitalised sentences, ``.``/``,``/``?`` punctuation, occasional numbers and
  paragraphs separated by ``"\\n\\n"``. Generation is vectorised with numpy.
- :func:`write_dataset` writes such documents as ``part-NNNNN.parquet`` files
  (columns ``id``, ``text``, ``source``) with either pyarrow or polars, and can
  stream a corpus of a given size in bytes with bounded memory.
- :func:`train_tokenizer` and :func:`sample_tokenizer` give a small GPT-2-style
  byte-level BPE tokenizer trained on that text.

Determinism invariant: every output is a pure function of the arguments. The
same arguments (``seed`` included) give the same texts and byte-identical
Parquet files, with the same library versions (numpy's generators are stable
in practice but do not promise stream compatibility across releases), and
different seeds give different data. Nothing reads the clock, the environment
or a global random state.
"""

from __future__ import annotations

import functools
import math
import os
import pathlib
from collections.abc import Iterable, Iterator

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from arrowstream.errors import ConfigError

__all__ = [
    "SCHEMA",
    "SOURCES",
    "make_texts",
    "sample_tokenizer",
    "train_tokenizer",
    "write_dataset",
]

# Common English words, most frequent first (roughly), all ASCII. "I" and its
# contractions keep their capital; every other word is lower case.
_WORDS: tuple[str, ...] = (
    "the", "of", "and", "to", "a", "in", "is", "that", "it", "for", "was", "on", "are",
    "as", "with", "he", "be", "at", "by", "this", "have", "from", "or", "one", "had",
    "not", "but", "what", "all", "were", "when", "we", "there", "can", "an", "your",
    "which", "their", "said", "if", "do", "will", "each", "about", "how", "up", "out",
    "them", "then", "she", "many", "some", "so", "these", "would", "other", "into",
    "has", "more", "her", "two", "like", "him", "see", "time", "could", "no", "make",
    "than", "first", "been", "its", "who", "now", "people", "my", "made", "over",
    "did", "down", "only", "way", "find", "use", "may", "water", "long", "little",
    "very", "after", "words", "called", "just", "where", "most", "know", "get",
    "through", "back", "much", "before", "go", "good", "new", "write", "our", "used",
    "me", "man", "too", "any", "day", "same", "right", "look", "think", "also",
    "around", "another", "came", "come", "work", "three", "word", "must", "because",
    "does", "part", "even", "place", "well", "such", "here", "take", "why", "help",
    "put", "different", "away", "again", "off", "went", "old", "number", "great",
    "tell", "men", "say", "small", "every", "found", "still", "between", "name",
    "should", "home", "big", "give", "air", "line", "set", "own", "under", "read",
    "last", "never", "us", "left", "end", "along", "while", "might", "next", "sound",
    "below", "saw", "something", "thought", "both", "few", "those", "always", "looked",
    "show", "large", "often", "together", "asked", "house", "don't", "world", "going",
    "want", "school", "important", "until", "form", "food", "keep", "children", "feet",
    "land", "side", "without", "boy", "once", "animals", "life", "enough", "took",
    "sometimes", "four", "head", "above", "kind", "began", "almost", "live", "page",
    "got", "earth", "need", "far", "hand", "high", "year", "mother", "light", "parts",
    "country", "father", "let", "night", "following", "picture", "being", "study",
    "second", "eyes", "soon", "times", "story", "boys", "since", "white", "days",
    "ever", "paper", "hard", "near", "sentence", "better", "best", "across", "during",
    "today", "others", "however", "sure", "means", "knew", "it's", "try", "told",
    "young", "miles", "sun", "ways", "thing", "whole", "hear", "example", "heard",
    "several", "change", "answer", "room", "sea", "against", "top", "turned", "learn",
    "point", "city", "play", "toward", "five", "using", "himself", "usually", "money",
    "seen", "didn't", "car", "morning", "I'm", "body", "upon", "family", "later",
    "turn", "move", "face", "door", "cut", "done", "group", "true", "leave", "red",
    "friends", "I", "list", "short", "open", "nothing", "table", "fire", "cold",
    "building", "fish", "questions", "river", "stop", "ground", "less", "game", "rest",
    "idea", "shall", "black", "plan", "early", "green", "eat", "watch", "half", "seem",
    "sleep", "hold", "bring", "piece", "class", "reason", "summer", "winter", "spring",
    "autumn", "free", "walk", "easy", "sit", "stand", "street", "market", "voice",
    "music", "color", "north", "south", "east", "west", "wind", "rain", "snow",
    "storm", "forest", "tree", "trees", "flower", "garden", "field", "farm", "horse",
    "dog", "cat", "bird", "birds", "village", "town", "island", "mountain", "hill",
    "valley", "lake", "ocean", "coast", "bridge", "road", "train", "ship", "boat",
    "plane", "station", "office", "hospital", "church", "library", "museum", "kitchen",
    "window", "wall", "floor", "roof", "bed", "chair", "letter", "book", "books",
    "note", "science", "history", "language", "art", "government", "company",
    "business", "system", "service", "program", "problem", "question", "interest",
    "power", "war", "peace", "law", "court", "member", "level", "policy", "report",
    "rate", "price", "cost", "value", "trade", "energy", "health", "care", "data",
    "network", "computer", "phone", "internet", "website", "software", "model",
    "research", "result", "results", "process", "method", "design", "test", "order",
    "support", "issue", "effect", "force", "period", "view", "record", "figure",
    "type", "area", "case", "fact", "month", "week", "hour", "minute", "moment",
    "century", "future", "past", "present", "age", "information", "knowledge",
    "experience", "education", "teacher", "student", "students", "course", "lesson",
    "college", "university", "degree", "doctor", "nurse", "patient", "police",
    "officer", "soldier", "army", "leader", "president", "minister", "king", "queen",
    "prince", "captain", "chief", "manager", "worker", "workers", "staff", "team",
    "player", "players", "coach", "fan", "crowd", "audience", "party", "society",
    "community", "public", "private", "local", "national", "international", "foreign",
    "global", "general", "special", "social", "political", "economic", "financial",
    "military", "medical", "natural", "human", "simple", "possible", "available",
    "likely", "able", "full", "real", "certain", "clear", "strong", "wrong", "major",
    "recent", "common", "current", "final", "main", "basic", "late", "low", "hot",
    "warm", "dry", "wet", "dark", "bright", "quiet", "loud", "fast", "slow", "quick",
    "heavy", "deep", "wide", "narrow", "thin", "thick", "soft", "rich", "poor",
    "happy", "sad", "angry", "afraid", "tired", "busy", "ready", "glad", "proud",
    "safe", "dangerous", "beautiful", "pretty", "ugly", "clean", "dirty", "fresh",
    "strange", "famous", "popular", "serious", "difficult", "useful", "careful",
    "similar", "single", "double", "entire", "various", "specific", "particular",
    "personal", "individual", "physical", "environmental", "cultural", "traditional",
    "modern", "ancient", "original", "official", "formal", "normal", "regular",
    "usual", "perfect", "excellent", "terrible", "wonderful", "nice", "fine", "fair",
    "gentle", "calm", "brave", "become", "begin", "build", "buy", "carry", "catch",
    "choose", "close", "continue", "create", "decide", "describe", "develop", "die",
    "draw", "drink", "drive", "drop", "enjoy", "enter", "expect", "explain", "fall",
    "feel", "fight", "fill", "finish", "fly", "follow", "forget", "grow", "happen",
    "hate", "hope", "include", "increase", "join", "kill", "laugh", "lay", "lead",
    "lie", "listen", "lose", "love", "meet", "miss", "offer", "pass", "pay", "pick",
    "pull", "push", "raise", "reach", "receive", "remember", "return", "run", "save",
    "sell", "send", "serve", "share", "sing", "speak", "spend", "start", "stay",
    "suggest", "talk", "teach", "throw", "touch", "travel", "understand", "visit",
    "wait", "wake", "wear", "win", "wish", "wonder", "worry", "agree", "allow",
    "appear", "apply", "argue", "arrive", "avoid", "believe", "belong", "break",
    "cause", "check", "claim", "compare", "consider", "contain", "cover", "deal",
    "depend", "deliver", "discover", "discuss", "earn", "establish", "exist", "fail",
    "fix", "gain", "handle", "identify", "imagine", "improve", "indicate", "involve",
    "manage", "mention", "notice", "obtain", "occur", "perform", "prefer", "prepare",
    "prevent", "produce", "protect", "prove", "provide", "publish", "reduce", "refer",
    "reflect", "refuse", "relate", "release", "remain", "remove", "repeat", "replace",
    "represent", "require", "respond", "reveal", "rise", "seek", "select", "settle",
    "shake", "shoot", "sign", "solve", "sort", "suffer", "supply", "suppose",
    "survive", "tend", "thank", "treat", "vote", "wander", "ability", "account",
    "action", "activity", "address", "advantage", "advice", "agency", "agent",
    "amount", "analysis", "animal", "approach", "argument", "arm", "article", "attack",
    "attention", "authority", "baby", "bag", "ball", "bank", "base", "bill", "blood",
    "board", "bone", "box", "brother", "budget", "button", "camera", "campaign",
    "cancer", "capital", "card", "career", "center", "chance", "character", "charge",
    "child", "choice", "circle", "citizen", "client", "clock", "cloud", "club",
    "coffee", "collection", "concept", "condition", "conference", "contract",
    "control", "conversation", "corner", "culture", "cup", "customer", "damage",
    "danger", "daughter", "death", "debate", "decision", "defense", "demand",
    "department", "desk", "detail", "device", "difference", "dinner", "direction",
    "director", "discussion", "disease", "distance", "dream", "dress", "driver",
    "economy", "edge", "effort", "egg", "election", "element", "employee", "engine",
    "environment", "evening", "event", "evidence", "exercise", "expert", "eye",
    "failure", "faith", "fear", "feature", "feeling", "film", "finger", "focus",
    "foot", "freedom", "friend", "fruit", "fuel", "function", "gas", "gift", "girl",
    "glass", "goal", "gold", "grass", "growth", "guest", "guide", "gun", "hair",
    "hall", "heart", "heat", "hole", "hotel", "husband", "image", "impact", "income",
    "industry", "instance", "institution", "item", "job", "journey", "judge", "key",
    "knife", "lack", "leg", "limit", "lip", "loss", "machine", "magazine", "material",
    "matter", "meal", "meaning", "measure", "media", "memory", "message", "metal",
    "middle", "mind", "mission", "mistake", "mouth", "movement", "movie", "nation",
    "nature", "neck", "neighbor", "news", "newspaper", "nose", "object", "opinion",
    "option", "owner", "pain", "painting", "pair", "parent", "partner", "path",
    "pattern", "payment", "pen", "pension", "performance", "person", "photo",
    "physics", "plant", "plate", "poem", "poet", "pocket", "position", "pressure",
    "product", "property", "purpose", "quality", "radio", "range", "reader", "reality",
    "region", "relationship", "religion", "resource", "response", "risk", "rock",
    "role", "rule", "salt", "sample", "scene", "season", "seat", "secret", "section",
    "security", "sense", "series", "shape", "shirt", "shoe", "shop", "shoulder",
    "sister", "site", "situation", "size", "skill", "skin", "sky", "smile", "soil",
    "son", "song", "source", "space", "speech", "speed", "sport", "square", "stage",
    "star", "state", "step", "stone", "store", "strategy", "stress", "structure",
    "style", "subject", "success", "sugar", "suit", "surface", "task", "tax", "tea",
    "technology", "television", "term", "text", "theory", "thread", "ticket", "title",
    "tool", "tooth", "topic", "tour", "toy", "track", "tradition", "traffic", "truth",
    "union", "unit", "user", "variety", "vehicle", "version", "victim", "video",
    "vision", "volume", "wave", "weapon", "weather", "weekend", "weight", "wife",
    "wine", "wing", "wood", "yard", "youth", "zone", "clearly", "finally", "simply",
    "quickly", "slowly", "really", "probably", "certainly", "nearly", "already",
    "perhaps", "rather", "quite", "actually", "recently", "especially", "exactly",
    "suddenly", "directly", "generally", "easily", "instead", "inside", "outside",
    "behind", "beyond", "within", "among", "although", "though", "unless", "whether",
    "whose", "whom", "yet", "either", "neither", "nor", "per", "via", "onto",
)

#: Values of the ``source`` column, their probabilities, and the shift each
#: applies to the mean of the log length in words (books run longer, news and
#: code shorter).
SOURCES: tuple[str, ...] = ("web", "books", "news", "code")
_SOURCE_PROBS: tuple[float, ...] = (0.55, 0.10, 0.25, 0.10)
_SOURCE_LOG_SHIFT: tuple[float, ...] = (0.0, 0.7, -0.3, -0.5)

#: Parquet schema written by :func:`write_dataset`.
SCHEMA: pa.Schema = pa.schema(
    [("id", pa.int64()), ("text", pa.string()), ("source", pa.string())]
)

# Share of drawn tokens that are numbers rather than words.
_NUMBER_SHARE = 0.02
# Zipf-Mandelbrot word weights: 1 / (rank + _ZIPF_SHIFT) ** _ZIPF_EXPONENT.
_ZIPF_SHIFT = 2.7
_ZIPF_EXPONENT = 1.0
# Words and numbers are drawn by indexing a table in which each appears in
# proportion to its probability (one integer draw and one gather per token).
_TABLE_BITS = 20
_P_COMMA = 0.06  # a word not ending its sentence is followed by ","
_P_QUESTION = 0.07  # a sentence ends with "?" rather than "."
_P_PARAGRAPH = 0.25  # a sentence ends its paragraph
# Document lengths are clipped to [1, _MAX_WORDS] words.
_MAX_WORDS = 1 << 20
# Documents are generated in groups of about this many words at a time.
_CHUNK_WORDS = 1 << 20
# What follows a token: index into _SUFFIXES, plus 8 for a capitalised token.
_SUFFIXES: tuple[str, ...] = (" ", ", ", ". ", "? ", ".\n\n", "?\n\n", ".", "?")
_PLAIN, _COMMA, _PERIOD, _DOC_END = 0, 1, 2, 6
_CAPITAL = len(_SUFFIXES)
_VARIANTS = 2 * len(_SUFFIXES)

# Stream tags mixed into seeds so that different functions never share draws.
_TEXTS_STREAM = 0x7E475
_DATASET_STREAM = 0xDA7A5E7
_WRITERS: tuple[str, ...] = ("pyarrow", "polars")
_SAMPLE_TOKENIZER_DOCS = 3000
_SAMPLE_TOKENIZER_SEED = 1234
_SAMPLE_TOKENIZERS: dict[int, tokenizers.Tokenizer] = {}


def make_texts(
    num_docs: int,
    *,
    seed: int = 0,
    mean_log_words: float = 5.0,
    sigma_log_words: float = 1.0,
) -> list[str]:
    """Generate English-like documents with heavy-tailed lengths.

    Words come from a built-in list of about 1,100 common English words with
    Zipf-like frequencies, plus occasional numbers. Sentences start with a
    capital and end with ``.`` or ``?``, some words are followed by ``,``,
    and paragraphs are separated by ``"\\n\\n"``. All text is ASCII, so a
    document's length in characters equals its length in UTF-8 bytes.

    Parameters
    ----------
    num_docs : int
        Number of documents, 0 or more.
    seed : int, optional
        Seed (0 or more). The same arguments always give the same texts.
    mean_log_words, sigma_log_words : float, optional
        Mean and standard deviation of the natural log of a document's length
        in words (log-normal lengths). The defaults give a median of about
        150 words (about 740 bytes; a word averages 5 bytes with its space
        and punctuation) and a mean of about 1,200 bytes. Lengths are
        rounded and clipped to between 1 and 2**20 words.

    Returns
    -------
    list of str
        ``num_docs`` non-empty documents, each ending with ``.`` or ``?``.

    Raises
    ------
    ValueError
        If an argument is out of range.

    Examples
    --------
    >>> texts = make_texts(3, seed=7)
    >>> len(texts), all(text.endswith((".", "?")) for text in texts)
    (3, True)
    >>> texts == make_texts(3, seed=7), texts == make_texts(3, seed=8)
    (True, False)
    """
    _check_int("num_docs", num_docs, minimum=0, hint="pass 0 or more documents")
    _check_int("seed", seed, minimum=0, hint="pass a non-negative integer seed")
    _check_lengths(mean_log_words, sigma_log_words)
    rng = np.random.default_rng([seed, _TEXTS_STREAM])
    mu = np.full(num_docs, float(mean_log_words))
    return _generate(rng, mu, float(sigma_log_words))


def write_dataset(
    directory: str | os.PathLike[str],
    *,
    num_files: int = 4,
    docs_per_file: int = 2000,
    rows_per_group: int = 500,
    seed: int = 0,
    writer: str = "pyarrow",
    target_bytes: int | None = None,
    mean_log_words: float = 5.0,
    sigma_log_words: float = 1.0,
) -> list[pathlib.Path]:
    """Write a synthetic corpus as Parquet files ``part-00000.parquet``, ...

    Each file has the columns of :data:`SCHEMA`: ``id`` (``int64``, 0, 1, 2,
    ... increasing across the files in order), ``text`` (a document from the
    same generator as :func:`make_texts`) and ``source`` (one of
    :data:`SOURCES`, drawn with fixed probabilities; the mean log length
    shifts a little per source). Files use snappy compression and row groups
    of ``rows_per_group`` rows; only a file's last row group may be shorter.

    Parameters
    ----------
    directory : str or os.PathLike
        Where to write; created (with parents) if missing. Existing files of
        the same names are overwritten; other files are left alone.
    num_files : int, optional
        Number of files, 1 or more.
    docs_per_file : int, optional
        Documents per file, 1 or more. Ignored when ``target_bytes`` is given.
    rows_per_group : int, optional
        Rows per Parquet row group, 1 or more.
    seed : int, optional
        Seed (0 or more). The same arguments give byte-identical files.
    writer : {"pyarrow", "polars"}, optional
        ``"pyarrow"`` streams each row group through
        :class:`pyarrow.parquet.ParquetWriter`. ``"polars"`` writes the same
        rows with :meth:`polars.DataFrame.write_parquet`; it holds one whole
        file in memory at a time.
    target_bytes : int or None, optional
        If given, overrides ``docs_per_file``: each file receives documents
        until its text reaches its share of ``target_bytes`` (split evenly),
        so the corpus holds ``target_bytes`` of text plus less than one
        document per file. With ``writer="pyarrow"`` memory stays bounded by
        one row group, whatever the target.
    mean_log_words, sigma_log_words : float, optional
        Length distribution, as in :func:`make_texts`.

    Returns
    -------
    list of pathlib.Path
        The written files, in order.

    Raises
    ------
    ValueError
        If an argument is out of range or ``writer`` is unknown.

    Examples
    --------
    >>> import tempfile
    >>> import pyarrow.parquet as pq
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     paths = write_dataset(tmp, num_files=2, docs_per_file=10, rows_per_group=4)
    ...     table = pq.read_table(paths[1])
    ...     groups = pq.read_metadata(paths[1]).num_row_groups
    >>> [path.name for path in paths]
    ['part-00000.parquet', 'part-00001.parquet']
    >>> table.column("id").to_pylist(), groups
    ([10, 11, 12, 13, 14, 15, 16, 17, 18, 19], 3)
    >>> table.schema.names
    ['id', 'text', 'source']
    """
    _check_int("num_files", num_files, minimum=1, hint="pass 1 or more files")
    _check_int("docs_per_file", docs_per_file, minimum=1, hint="pass 1 or more")
    _check_int("rows_per_group", rows_per_group, minimum=1, hint="pass 1 or more")
    _check_int("seed", seed, minimum=0, hint="pass a non-negative integer seed")
    if target_bytes is not None:
        _check_int(
            "target_bytes",
            target_bytes,
            minimum=1,
            hint="pass a positive byte count, or None to use `docs_per_file`",
        )
    if writer not in _WRITERS:
        raise ConfigError(
            f"`writer` must be one of {', '.join(map(repr, _WRITERS))}, "
            f"got {writer!r}; pick one of those"
        )
    _check_lengths(mean_log_words, sigma_log_words)

    out = pathlib.Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[pathlib.Path] = []
    next_id = 0
    for file_index in range(num_files):
        if target_bytes is None:
            budget = None
        else:  # split evenly; the first files take the remainder
            budget = target_bytes // num_files + (file_index < target_bytes % num_files)
        groups = _file_groups(
            seed=seed,
            file_index=file_index,
            first_id=next_id,
            docs=docs_per_file,
            budget=budget,
            rows_per_group=rows_per_group,
            mean_log_words=float(mean_log_words),
            sigma_log_words=float(sigma_log_words),
        )
        path = out / f"part-{file_index:05d}.parquet"
        if writer == "pyarrow":
            with pq.ParquetWriter(path, SCHEMA, compression="snappy") as parquet:
                for group in groups:
                    parquet.write_table(group, row_group_size=rows_per_group)
                    next_id += group.num_rows
        else:
            table = pa.concat_tables(list(groups))
            next_id += table.num_rows
            pl.from_arrow(table).write_parquet(
                path, compression="snappy", row_group_size=rows_per_group
            )
        paths.append(path)
    return paths


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
    """Return a byte-level BPE tokenizer trained on this module's sample text.

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


# --------------------------------------------------------------------------
# Internals


def _check_int(name: str, value: object, *, minimum: int, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ConfigError(
            f"`{name}` must be an integer >= {minimum}, "
            f"got {type(value).__name__} {value!r}; {hint}"
        )
    if value < minimum:
        raise ConfigError(f"`{name}` must be >= {minimum}, got {value}; {hint}")


def _check_lengths(mean_log_words: object, sigma_log_words: object) -> None:
    for name, value in (("mean_log_words", mean_log_words), ("sigma_log_words", sigma_log_words)):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
            raise ConfigError(
                f"`{name}` must be a real number, got {type(value).__name__} "
                f"{value!r}; pass a float such as 5.0"
            )
        if not math.isfinite(value):
            raise ConfigError(f"`{name}` must be finite, got {value}; pass a float such as 5.0")
    if sigma_log_words < 0:
        raise ConfigError(
            f"`sigma_log_words` must be >= 0, got {sigma_log_words}; "
            "pass 0 for equal lengths or a positive spread such as 1.0"
        )


@functools.cache
def _tables() -> tuple[np.ndarray, np.ndarray]:
    """Token strings and the weighted lookup table of stems.

    A stem is a word or a number; token ``stem * _VARIANTS + variant`` is the
    stem, capitalised if ``variant >= _CAPITAL``, followed by
    ``_SUFFIXES[variant % _CAPITAL]``.
    """
    numbers = [str(n) for n in range(1001)] + [str(y) for y in range(1900, 2031)]
    stems = list(_WORDS) + numbers
    ranks = np.arange(1, len(_WORDS) + 1, dtype=np.float64)
    word_p = (ranks + _ZIPF_SHIFT) ** -_ZIPF_EXPONENT
    word_p *= (1.0 - _NUMBER_SHARE) / word_p.sum()
    # Numbers: days of the month, any number up to 1000, recent years.
    number_p = np.zeros(len(numbers))
    number_p[1:32] += 0.4 / 31
    number_p[:1001] += 0.3 / 1001
    number_p[1001:] += 0.3 / 131
    number_p *= _NUMBER_SHARE / number_p.sum()
    p = np.concatenate([word_p, number_p])

    size = 1 << _TABLE_BITS
    counts = np.maximum(np.floor(p * size).astype(np.int64), 1)
    short = size - int(counts.sum())  # hand the rest out by largest remainder
    if short > 0:
        counts[np.argsort(-(p * size - counts), kind="stable")[:short]] += 1
    else:
        counts[np.argsort(-counts, kind="stable")[:-short]] -= 1
    table = np.repeat(np.arange(len(stems), dtype=np.int32), counts)

    tokens = np.empty(len(stems) * _VARIANTS, dtype=object)
    for i, stem in enumerate(stems):
        capital = stem[:1].upper() + stem[1:]
        for j, suffix in enumerate(_SUFFIXES):
            tokens[i * _VARIANTS + j] = stem + suffix
            tokens[i * _VARIANTS + _CAPITAL + j] = capital + suffix
    return tokens, table


def _generate(rng: np.random.Generator, mu: np.ndarray, sigma: float) -> list[str]:
    """Draw one document per entry of ``mu`` (mean log length in words)."""
    if len(mu) == 0:
        return []
    log_words = mu + sigma * rng.standard_normal(len(mu))
    words = np.rint(np.exp(np.clip(log_words, 0.0, math.log(_MAX_WORDS)))).astype(np.int64)
    ends = np.cumsum(words)
    docs: list[str] = []
    start = 0
    while start < len(words):
        done = int(ends[start - 1]) if start else 0
        stop = int(np.searchsorted(ends, done + _CHUNK_WORDS, side="right"))
        stop = max(stop, start + 1)
        docs.extend(_generate_chunk(rng, words[start:stop]))
        start = stop
    return docs


def _generate_chunk(rng: np.random.Generator, words: np.ndarray) -> list[str]:
    """Draw documents of the given lengths in words, all at once."""
    tokens, table = _tables()
    total = int(words.sum())
    doc_last = np.cumsum(words) - 1

    # One 64-bit draw per word: the low bits pick the stem, two further
    # 12-bit fields decide comma or question mark, and paragraph end.
    raw = rng.bit_generator.random_raw(total).view(np.int64)
    stems = table[raw & ((1 << _TABLE_BITS) - 1)]
    punct = (raw >> _TABLE_BITS) & 0xFFF
    comma = punct < int(_P_COMMA * 4096)
    question = (punct < int(_P_QUESTION * 4096)).view(np.uint8)
    paragraph = (((raw >> 32) & 0xFFF) < int(_P_PARAGRAPH * 4096)).view(np.uint8)

    # Sentence ends: cumulative sentence lengths (3 + two uniform draws in
    # [0, 12), mean 14), then every document's last word.
    count = total // 8 + 8
    sentence_last = np.cumsum(_sentence_lengths(rng, count)) - 1
    while sentence_last[-1] < total - 1:  # practically never; keeps the draw exact
        more = np.cumsum(_sentence_lengths(rng, count)) + sentence_last[-1]
        sentence_last = np.concatenate([sentence_last, more])
    is_end = np.zeros(total, dtype=np.uint8)
    is_end[sentence_last[sentence_last < total]] = 1
    is_end[doc_last] = 1

    # Suffix variant: "," inside sentences, ". " "? " ".\n\n" "?\n\n" at
    # sentence ends, "." or "?" at document ends; capital after any end.
    variant = np.where(
        is_end.view(bool), _PERIOD + question + 2 * paragraph, comma.view(np.uint8)
    ).astype(np.int32)
    variant[doc_last] = _DOC_END + question[doc_last]
    variant[0] += _CAPITAL
    variant[1:] += _CAPITAL * is_end[:-1]

    parts = tokens[stems * _VARIANTS + variant].tolist()
    bounds = np.concatenate([[0], doc_last + 1]).tolist()
    join = "".join
    return [join(parts[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


def _sentence_lengths(rng: np.random.Generator, count: int) -> np.ndarray:
    raw = rng.bit_generator.random_raw(count).view(np.int64)
    return 3 + ((raw & 0xFFFF) * 12 >> 16) + (((raw >> 16) & 0xFFFF) * 12 >> 16)


def _file_groups(
    *,
    seed: int,
    file_index: int,
    first_id: int,
    docs: int,
    budget: int | None,
    rows_per_group: int,
    mean_log_words: float,
    sigma_log_words: float,
) -> Iterator[pa.Table]:
    """Yield one file's row groups as tables of :data:`SCHEMA`.

    With ``budget`` (bytes of text), stop at the first document that reaches
    it; otherwise write ``docs`` documents. Each row group has its own random
    stream, keyed by seed, file and group, so memory never exceeds one group.
    """
    probs = np.asarray(_SOURCE_PROBS)
    shifts = np.asarray(_SOURCE_LOG_SHIFT)
    sources = pa.array(SOURCES, type=pa.string())
    written_docs = 0
    written_bytes = 0
    group_index = 0
    while True:
        if budget is None:
            n = min(rows_per_group, docs - written_docs)
            if n <= 0:
                return
        else:
            n = rows_per_group
        rng = np.random.default_rng([seed, file_index, group_index, _DATASET_STREAM])
        source = rng.choice(len(SOURCES), size=n, p=probs)
        texts = _generate(rng, mean_log_words + shifts[source], sigma_log_words)
        if budget is not None:
            sizes = np.cumsum([len(t) for t in texts]) + written_bytes
            keep = int(np.searchsorted(sizes, budget, side="left")) + 1
            if keep <= n:  # this group reaches the budget: cut it there
                texts, source, n = texts[:keep], source[:keep], keep
            written_bytes = int(sizes[n - 1])
        ids = np.arange(first_id + written_docs, first_id + written_docs + n, dtype=np.int64)
        yield pa.table(
            [
                pa.array(ids, type=pa.int64()),
                pa.array(texts, type=pa.string()),
                sources.take(pa.array(source)),
            ],
            schema=SCHEMA,
        )
        written_docs += n
        group_index += 1
        if budget is not None and written_bytes >= budget:
            return
