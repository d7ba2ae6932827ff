"""The texts on which the tiktoken backend must give the tokenizer's very ids.

:class:`~arrowstream.tokenize.encoders.Encoder` runs both backends over these before it
trusts tiktoken: the text of every vocabulary token (:func:`token_texts`), a
fixed probe set (:func:`probe_texts`: every byte UTF-8 can hold, in contexts;
every Unicode category; whitespace and digit runs; contractions; many
scripts) and every added token alone, in text and cut short
(:func:`added_token_probes`). Change them only with ``_CHECKS_VERSION`` in
:mod:`arrowstream.tokenize.verdicts`, so cached verdicts are not reused.

Examples
--------
>>> added_token_probes({"<|x|>": 0})[:3]
['<|x|>', 'a<|x|>b', ' <|x|> ']
"""

from __future__ import annotations

import functools
import sys
import unicodedata
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from arrowstream.tokenize.bytelevel import ByteLevelBPE

__all__ = ["added_token_probes", "probe_texts", "token_texts"]


def token_texts(spec: ByteLevelBPE) -> list[str]:
    """Return the text of every token tiktoken can produce whose bytes are valid UTF-8."""
    out = []
    for raw in spec.ranks:
        try:
            out.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            continue
    return out


_WHITESPACE = " \t\n\r\x0b\x0c\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\u200b\ufeff"
_SENTENCES = (
    "The quick brown fox jumps over the lazy dog. It's 3:45pm; we'd've left, they'll stay!",
    "HELLO World -- I'M here, YOU'RE there, WE'VE got it, she'S fine, he'LL go, I'D say.",
    "L'été dernier, à Noël, façade, naïve, coöperate, Ærø, Øresund, Ångström.",
    "Grüße aus Köln: Straße, Maß, ÄÖÜ äöü ß ẞ.",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Ελληνικά!",
    "نص عربي للتجربة، مع أرقام ١٢٣٤٥ و 12345.",
    "עברית: שלום עולם! מספרים 678.",
    "हिन्दी में पाठ। संख्या १२३ और ४५६।",
    "中文文本测试，包括标点符号。数字：一二三，123。",
    "日本語のテキスト、カタカナとひらがな。ｶﾀｶﾅ　全角スペース。",
    "한국어 텍스트 테스트입니다. 숫자 123개!",
    "ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "emoji 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ ✌️ 🏳️‍🌈",
    "combining: e\u0301 a\u0308 n\u0303 Z\u0351\u0358\u0362a\u0336l\u0337g\u0338o",
    "math: ∀x∈ℝ, x²≥0; ∑ᵢ aᵢ = ½ ⅓ ¼; 10⁻³ ≈ 0.001; Ⅻ ⅻ; ①②③",
    "code: def f(x):\n\treturn x**2  # comment\n\nif __name__ == '__main__':\n    f(3)\r\n",
    "url https://example.com/a?b=c&d=e#f and mail a.b+c@d.org, path C:\\Users\\x\\y.txt",
    "numbers 0 1 12 123 1234 12345 123456 1,234,567.89 3.14e-10 -42 +7 0x1F 1_000 ０１２３",
    "punct !!! ??? ... --- ___ *** ### ``` ''' \"\"\" (([[{{}}]])) <<>> ;;; ::: ,,,",
    "tabs\tand\t\ttabs\t\t\tand\nnewlines\n\nand\r\ncrlf\r\n\r\nend",
    "  leading and trailing spaces  ",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D ’s ’t",
    "x's y't z're a've b'm c'll d'd 1's 2'll ''s '''d",
)


@functools.lru_cache(maxsize=1)
def probe_texts() -> tuple[str, ...]:
    """Return the built-in probe set both backends must agree on, one text per item.

    Every code point of the Basic Multilingual Plane (surrogates aside), every
    third of the Supplementary Multilingual Plane and every 61st of the other
    planes, so every byte UTF-8 can hold; most of them also after a letter,
    before a digit, after a space, next to themselves and before punctuation
    (the large uniform blocks, CJK, Hangul and private use, one in 16); a few
    of every Unicode general category; runs of every whitespace character and
    of digits, alone and between words; contractions in both cases;
    punctuation runs; sentences in many scripts; the empty string.

    Examples
    --------
    >>> texts = probe_texts()
    >>> "" in texts, len(texts) > 1000
    (True, True)
    >>> all(chr(c) in "".join(texts) for c in range(0x80))
    True
    """
    out: list[str] = ["", " ", "\n", "a", "1", "!"]
    # Built with whole-array steps where a loop per code point was slow (0.3 s per process).
    codes = np.arange(0x10000)
    plain = np.concatenate([
        codes[(codes < 0xD800) | (codes >= 0xE000)],
        np.arange(0x10000, 0x20000, 3), np.arange(0x20000, sys.maxunicode + 1, 61),
    ])
    uniform = np.zeros(plain.size, dtype=bool)
    for a, b in ((0x3400, 0x4DC0), (0x4E00, 0xA000), (0xAC00, 0xD7A4), (0xE000, 0xF900), (0x10000, 0x20000)):
        uniform |= (plain >= a) & (plain < b)
    in_context = plain[~uniform | (plain % 16 == 0)]
    # Texts are cut from one string decoded from the code points, not joined from a str per code
    # point: the same texts, with a fraction of the memory (every first process builds them).
    out += _runs(plain, 64)
    framed = np.empty((in_context.size, 7), dtype=np.int64)  # a{ch}1 {ch}{ch}.
    framed[:] = [ord("a"), 0, ord("1"), ord(" "), 0, 0, ord(".")]
    framed[:, [1, 4, 5]] = in_context[:, None]
    out += _runs(framed.ravel(), 64 * 7)
    every = np.concatenate([np.arange(0xD800), np.arange(0xE000, 0x30000)])
    categories = np.fromiter(
        (unicodedata.category(ch) for ch in _decoded(every)), dtype="<U2", count=every.size
    )
    _, first, which = np.unique(categories, return_index=True, return_inverse=True)
    for k in np.argsort(first).tolist():  # in the order each category first comes
        members = every[which == k]
        picked = list(map(chr, members[:: max(1, members.size // 16)][:16].tolist()))
        out += ["".join(picked), " ".join(picked), "x" + "x".join(picked) + "x", "7" + "7".join(picked)]
    for ws in _WHITESPACE:
        for n in (1, 2, 3, 16, 33):
            run = ws * n
            out += [run, f"a{run}b", f"{run}a", f"a{run}", f"1{run}2", f".{run}.", f"a {run} b", f"a{run} b"]
    out += [" " * 3000, "\n" * 1000, " \n" * 500, "\t \n\r" * 250, "a" + " " * 2000 + "b"]
    for n in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 15, 16, 17, 31, 32, 33, 100, 1000):
        digits = "".join(str((k * 7 + n) % 10) for k in range(n))
        out += [digits, f"a{digits}b", f" {digits} ", f"x {digits}.{digits}", f"{digits}a{digits}"]
    out += ["9" * 3000, "1 " * 1000]
    out += list(_SENTENCES) + ["\n".join(_SENTENCES), " ".join(_SENTENCES).upper()]
    return tuple(out)


def _decoded(codes: np.ndarray) -> str:
    """The string of the code points ``codes`` (no surrogates)."""
    return codes.astype("<u4").tobytes().decode("utf-32-le")


def _runs(codes: np.ndarray, size: int) -> list[str]:
    """The string of ``codes`` cut into texts of ``size`` code points (the last one shorter)."""
    text = _decoded(codes)
    return [text[i : i + size] for i in range(0, len(text), size)]


def added_token_probes(specials: dict[str, int]) -> list[str]:
    """Return texts with each added token alone, in text, repeated and cut short."""
    out = []
    for content in list(specials)[:1000]:
        out += [
            content,
            f"a{content}b",
            f" {content} ",
            content * 3,
            f"{content}\n\nHello world{content}",
            content[:-1],
            content[1:],
            f"x{content[:-1]}y",
        ]
    return out
