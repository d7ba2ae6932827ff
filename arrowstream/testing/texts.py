"""Synthetic, seeded English-like documents: the text generator behind the sample data.

:func:`make_texts` draws documents from a built-in vocabulary of common
English words with Zipf-like frequencies, log-normal (heavy-tailed) lengths,
capitalised sentences, ``.``/``,``/``?`` punctuation, occasional numbers and
paragraphs separated by ``"\\n\\n"``. Generation is vectorised with numpy.
:mod:`arrowstream.testing.data` writes the same documents as Parquet files and
:mod:`arrowstream.testing.tokenizer` trains a tokenizer on them.

Determinism invariant: every output is a pure function of the arguments. The
same arguments (``seed`` included) give the same texts, with the same library
versions (numpy's generators are stable in practice but do not promise stream
compatibility across releases), and different seeds give different data.
Nothing reads the clock, the environment or a global random state.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from arrowstream.errors import ConfigError

__all__ = ["make_texts"]

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

# Stream tag mixed into the seed so that make_texts never shares draws with
# the dataset writer (whose tag is `_DATASET_STREAM` in arrowstream.testing.data).
_TEXTS_STREAM = 0x7E475


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
