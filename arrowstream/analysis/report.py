"""Presenting an analysis: a terminal report with a text histogram, and a PNG figure.

Pure formatting of an :class:`~arrowstream.analysis.Analysis`; matplotlib is
imported only to draw the figure (``pip install 'arrowstream[plot]'``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import polars as pl

from arrowstream.errors import ConfigError

#: An :class:`~arrowstream.analysis.Analysis`, read by attribute only: this module
#: formats it and so does not import it (the analysis imports this module).
Analysis = Any

__all__ = ["plot_analysis", "render_analysis", "text_histogram"]

_BAR = 40


def _num(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:,.0f}" if value >= 100 or value == int(value) else f"{value:.2f}"
    return f"{value:,}"


def _whole(value: Any) -> str:
    """A length quantile to the nearest whole length (``numpy.quantile`` interpolates between two)."""
    if isinstance(value, float) and not math.isnan(value):
        return f"{round(value):,}"
    return _num(value)


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths)))]
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    return "\n".join(lines)


def text_histogram(lower: list[int], counts: list[int], *, mark: int | None = None) -> str:
    """Return a histogram of power-of-two bins as text, with the bin holding ``mark`` flagged.

    Examples
    --------
    >>> print(text_histogram([1, 2, 4], [1, 4, 2], mark=5))
          1 -      1  ##########                                   1
          2 -      3  ########################################     4
          4 -      7  ####################                         2  <- 5
    """
    top = max(counts) if counts else 0
    lines = []
    for lo, n in zip(lower, counts):
        bar = "#" * (round(_BAR * n / top) if top else 0)
        flag = f"  <- {mark}" if mark is not None and lo <= mark < 2 * lo else ""
        lines.append(f"{lo:>7,} - {2 * lo - 1:>6,}  {bar:<{_BAR}} {n:>7,}{flag}")
    return "\n".join(lines)


def render_analysis(a: Analysis, *, max_groups: int | None = 20) -> str:
    """Return the terminal report of an analysis (the ``max_groups`` largest groups; ``None``: all)."""
    info = a.info
    out = [
        f"{info['source']}: column `{info['column']}`, {info['num_files']:,} file(s), "
        f"{info['num_rows']:,} rows, {info['num_docs']:,} documents "
        f"({info['null_or_empty']:,} null or empty)",
        "",
    ]
    if info.get("unreadable_row_groups"):  # on_error="skip": left out of every figure below
        skipped = info["unreadable_row_groups"]
        listed = ", ".join(f"{r['file']} row group {r['row_group']}" for r in skipped[:5])
        more = f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""
        out[-1:-1] = [f"left out, unreadable: {len(skipped)} row group(s), {info['unreadable_rows']:,} rows ({listed}{more})"]
    quant = ["p0", "p10", "p50", "p90", "p99", "p100"]
    rows = []
    for r in a.summary.iter_rows(named=True):
        above = "-" if r["above_seq_len"] is None else f"{r['above_seq_len']:.2%}"
        lengths = (_whole(r[q]) for q in quant)  # interpolated between two lengths: shown to the nearest length
        rows.append([r["measure"], _num(r["num_docs"]), _num(r["mean"]), *lengths, above])
    out.append(_table(["length", "docs", "mean", *quant, f"> {info['seq_len']}"], rows))
    tokens = info.get("tokens")
    if tokens and tokens.get("counted") == "sample":
        lo, hi = tokens["mean_ci95"]
        out += [
            "",
            f"tokens from a sample of {tokens['sample_docs']:,} documents (seed {tokens['seed']}): "
            f"mean {lo:.1f} .. {hi:.1f} (95 % CI), "
            + ", ".join(f"{k} {v[0]:,} .. {v[1]:,}" for k, v in tokens["quantile_ci95"].items())
            + f"; about {tokens['estimated_total_tokens']:,} tokens in all",
        ]
    measure = "tokens" if "tokens" in a.summary["measure"].to_list() else "chars"
    hist = a.histogram.filter(a.histogram["measure"] == measure)
    out += ["", f"documents by {measure}:"]
    mark = info["seq_len"] if measure == "tokens" else None
    out.append(text_histogram(hist["lower"].to_list(), hist["count"].to_list(), mark=mark))
    sampled = bool(tokens and tokens.get("counted") == "sample")
    if a.strategies.height:
        out += ["", f"strategies for seq_len={info['seq_len']}, batch_size={info['batch_size']}:"]
        rows = [
            [r["name"], _padding(r, sampled), _num(r["num_batches"]), _num(r["cut_docs"]),
             "nothing" if not r["dropped_tokens"] else f"{r['lost_fraction']:.2%} ({_num(r['dropped_tokens'])})"]
            for r in a.strategies.iter_rows(named=True)
        ]
        out.append(_table(["strategy", "padding", "batches", "docs not whole", "tokens lost"], rows))
        out.append(
            "(docs not whole: split across rows, which loses nothing, or truncated; tokens lost: "
            "truncated or dropped)"
        )
        if sampled:
            out.append(
                "(from a sample: counts scaled to every document; padding with the epoch's last batch "
                "counted once, and its 95 % interval from the spread of the sample's four quarters)"
            )
    else:
        out += ["", "strategies: pass a tokenizer (or a column of token ids) to predict them"]
    if a.by is not None:
        groups = a.by["group"].unique(maintain_order=True).to_list()
        shown = groups if max_groups is None else _largest(a.by, max_groups)
        title = "by group:" if len(shown) == len(groups) else (
            f"by group: the {len(shown)} largest of {len(groups):,} (all with --by-groups all, or in the JSON):"
        )
        out += ["", title]
        keep = set(shown)
        rows = [
            ["(null)" if r["group"] is None else str(r["group"]), r["measure"], _num(r["num_docs"]), _num(r["mean"]), _num(r["p50"]),
             _num(r["p90"]), _num(r["p100"]),
             "-" if r["above_seq_len"] is None else f"{r['above_seq_len']:.2%}"]
            for r in a.by.iter_rows(named=True)
            if r["group"] in keep
        ]
        out.append(_table(["group", "length", "docs", "mean", "p50", "p90", "max", f"> {info['seq_len']}"], rows))
    return "\n".join(out)


def _padding(row: dict[str, Any], sampled: bool) -> str:
    """The predicted padding, with its range when it comes from a sample."""
    value = f"{row['padding_fraction']:.2%}"
    if not sampled:
        return value
    return f"{value} ({100 * row['padding_low']:.2f}-{100 * row['padding_high']:.2f})"


def _largest(by: Any, n: int) -> list[Any]:
    """The ``n`` groups with the most documents (ties in their first order)."""
    sizes = by.group_by("group", maintain_order=True).agg(pl.col("num_docs").max().alias("docs"))
    return sizes.sort("docs", descending=True, maintain_order=True)["group"].head(n).to_list()


def plot_analysis(a: Analysis, path: Path) -> Path:
    """Draw the length histogram (``seq_len`` marked) and the strategies side by side as a PNG.

    The figure is a :class:`matplotlib.figure.Figure` of its own, outside
    ``pyplot``: the process's backend (a notebook's inline one, say) and
    ``pyplot``'s figures are left as they were.
    """
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError("the figure needs matplotlib: pip install 'arrowstream[plot]'") from exc
    measure = "tokens" if "tokens" in a.summary["measure"].to_list() else "chars"
    hist = a.histogram.filter(a.histogram["measure"] == measure)
    fig = Figure(figsize=(12, 4.5))
    axes = fig.subplots(1, 2)
    ax = axes[0]
    ax.bar(hist["lower"].to_list(), hist["count"].to_list(), width=hist["lower"].to_list(), align="edge")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"document length ({measure})")
    ax.set_ylabel("documents")
    if measure == "tokens":
        ax.axvline(a.info["seq_len"], color="red", linestyle="--", label=f"seq_len = {a.info['seq_len']}")
        ax.legend()
    ax.set_title("length distribution")
    ax = axes[1]
    if a.strategies.height:
        names = a.strategies["name"].to_list()
        pads = [100 * v for v in a.strategies["padding_fraction"].to_list()]
        ax.barh(names, pads)
        ax.set_xlim(0, max(max(pads) * 1.45, 10))  # room for the labels
        ax.set_xlabel("padding (% of positions)")
        ax.invert_yaxis()
        rows = zip(a.strategies["padding_fraction"], a.strategies["cut_docs"], a.strategies["lost_fraction"])
        for y, (pad, cut, lost) in enumerate(rows):
            # a split document loses nothing; a truncated one loses tokens: the label says which
            what = f"{lost:.1%} of tokens lost" if lost else f"{cut:,} docs split, nothing lost"
            ax.text(100 * pad, y, f" {pad:.1%}; {what}", va="center")
        ax.set_title(f"strategies (seq_len={a.info['seq_len']}, batch_size={a.info['batch_size']})")
    else:
        ax.text(0.5, 0.5, "pass a tokenizer to compare strategies", ha="center", va="center")
        ax.set_axis_off()
    fig.tight_layout()
    path = Path(path)
    try:
        fig.savefig(path, dpi=100)
    except OSError as exc:
        raise ConfigError(
            f"cannot write the figure to {str(path)!r}: {exc.strerror or exc}; pass a path in a "
            "writable directory"
        ) from exc
    return path
