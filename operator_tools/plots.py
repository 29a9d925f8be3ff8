"""Figures of the operator tools' ``--plot FILE`` (matplotlib, Agg: no display needed).

Each ``*_figure`` function builds and returns a :class:`matplotlib.figure.Figure` (tests inspect
its axes, labels and series); :func:`save` writes it in the format of the file's extension
(``.png``, ``.svg``, ``.pdf``). No ``pyplot``: no global state, no GUI backend, safe in threads.
matplotlib is imported only when a figure is drawn, so the tools start as fast without ``--plot``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence, TextIO

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

    from operator_tools.bench_ttft import BenchReport
    from operator_tools.overlap import OverlapReport
    from capacity.planner import Plan

#: Colours of the two cases in every figure (matplotlib's default cycle's first two).
COLD, WARM = "tab:blue", "tab:orange"
FORMATS = (".png", ".svg", ".pdf")


def _figure(width: float = 8.0, height: float = 4.8) -> "Figure":
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def check_plot_path(path: str | Path) -> Path:
    """The path as a :class:`Path` if its extension is one matplotlib writes here and its
    folder exists.

    Raises:
        ValueError: another extension (the message lists the allowed ones) or a missing folder.
    """
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise ValueError(f"plot file {path}: extension {path.suffix or '(none)'!r} not supported; "
                         f"allowed: {', '.join(FORMATS)}")
    if not path.parent.is_dir():
        raise ValueError(f"plot file {path}: folder {path.parent} does not exist")
    if path.is_dir():
        raise ValueError(f"plot file {path}: is a folder; allowed: a file name ending in {', '.join(FORMATS)}")
    return path


def save(fig: "Figure", path: str | Path, *, log: TextIO | None = None) -> Path:
    """Write ``fig`` to ``path`` (format from the extension, 120 dpi for PNG); returns the path.

    Raises:
        ValueError: :func:`check_plot_path`'s, or the file cannot be written (the message names it
            and the system's reason).

    With ``log`` (the tools pass stderr, so ``--json`` keeps stdout one JSON document), also
    print ``plot: wrote <path>`` there, so the user learns where the figure went.
    """
    path = check_plot_path(path)
    try:
        fig.savefig(path, dpi=120)
    except OSError as exc:  # a folder of that name, a read-only or pseudo file system, a full disk
        raise ValueError(f"plot file {path}: cannot write it: {exc.strerror or exc}") from None
    if log is not None:
        print(f"plot: wrote {path}", file=log)
    return path


def plan_figure(p: "Plan", lengths: Sequence[int] | None = None) -> "Figure":
    """Cold vs warm TTFT (ms) across prompt lengths (tokens) for a plan, with the break-even
    length and the planned prompt length marked.

    Series (line labels): ``cold TTFT (prefill)``, ``warm TTFT (L2 hit)``; vertical lines
    ``break-even ...`` and ``planned prompt ...``. ``lengths`` defaults to 64 points from 1
    token to about twice the larger of the prompt and the break-even.
    """
    from capacity.planner import ttft_curve

    t = p.timing
    if lengths is None:
        top = max(2 * p.inputs.tokens, 2 * int(t.break_even_tokens or 0), 1024)
        lengths = sorted({max(1, round(top * k / 63)) for k in range(64)})
    curve = ttft_curve(p, lengths)
    fig = _figure()
    ax = fig.add_subplot()
    ax.plot(lengths, [c.cold_ttft_ms for c in curve], color=COLD, label="cold TTFT (prefill)")
    ax.plot(lengths, [c.warm_ttft_ms for c in curve], color=WARM,
            label=f"warm TTFT (L2 hit, {p.inputs.hit_ratio:.0%} of the prompt)")
    if t.break_even_tokens:
        ax.axvline(t.break_even_tokens, color="black", linestyle="--",
                   label=f"break-even {t.break_even_tokens:,.0f} tokens")
    ax.axvline(p.inputs.tokens, color="grey", linestyle=":", label=f"planned prompt {p.inputs.tokens:,} tokens")
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel("TTFT (ms)")
    ax.set_xlim(0, lengths[-1])
    ax.set_ylim(bottom=0)
    ax.set_title(f"{p.inputs.model.name} on {p.instance.name}, TP {p.fit.tp}: L2 pays right of the break-even",
                 fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    return fig


def overlap_figure(report: "OverlapReport") -> "Figure":
    """The distribution of shared-prefix length against the adoption threshold.

    Left: requests by the share of their prompt a perfect prefix cache served (%), with the
    adoption threshold and the log's overall (token-weighted) share as vertical lines. Right:
    requests by shared-prefix length (tokens, whole chunks). Both from the bounded histograms
    :func:`operator_tools.overlap.analyse` keeps.
    """
    fig = _figure(11.0, 4.6)
    left, right = fig.subplots(1, 2)
    shares = sorted(report.shared_percent.items())
    left.hist([k for k, _ in shares], bins=range(0, 105, 5), weights=[v for _, v in shares],
              color=COLD, edgecolor="white", label="requests")
    left.axvline(report.threshold * 100, color="red", linestyle="--",
                 label=f"adoption threshold {report.threshold:.0%}")
    left.axvline(report.share * 100, color="black", label=f"overall share {report.share:.1%}")
    left.set_xlabel("shared prefix (% of the request's prompt tokens)")
    left.set_ylabel("requests")
    left.set_xlim(0, 100)
    left.set_ylim(0, max([1, *(v for _, v in shares)]) * 1.35)  # headroom for the legend
    left.legend(loc="upper right")
    left.set_title("share of each prompt a cross-pod prefix cache serves", fontsize=10)

    # Shared lengths are whole chunks: one bar per length, centred on it.
    lengths = sorted(report.shared_lengths.items())
    chunk = report.chunk_tokens
    right.bar([k for k, _ in lengths], [v for _, v in lengths], width=0.8 * chunk, color=WARM,
              label=f"requests (whole {chunk}-token chunks)")
    if 0 < len(lengths) <= 12:
        right.set_xticks([k for k, _ in lengths])
    right.set_xlabel("shared prefix length (tokens)")
    right.set_ylabel("requests")
    right.set_ylim(0, max([1, *(v for _, v in lengths)]) * 1.25)
    right.legend(loc="upper right")
    right.set_title(f"{report.requests:,} requests; tokenizer: {'exact' if report.exact else '~4 chars/token'}",
                    fontsize=10)
    return fig


def bench_figure(report: "BenchReport") -> "Figure":
    """Histograms of cold and warm TTFT (ms) on shared bins, each with its p50 as a line."""
    from operator_tools.bench_ttft import percentile

    cold, warm = report.ttft("cold"), report.ttft("warm")
    fig = _figure()
    ax = fig.add_subplot()
    values = cold + warm
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    span = max(hi - lo, 1.0)
    bins = [lo - 0.02 * span + k * (1.04 * span) / 30 for k in range(31)]
    tallest = 0.0
    for label, data, color in (("cold", cold, COLD), ("warm", warm, WARM)):
        counts, _, _ = ax.hist(data, bins=bins, color=color, alpha=0.6, label=f"{label} TTFT ({len(data)} requests)")
        tallest = max([tallest, *counts])
        median = percentile(data, 50)
        if median is not None:
            ax.axvline(median, color=color, linestyle="--", label=f"{label} p50 {median:,.0f} ms")
    ratio = report.cold_warm_ratio
    ax.set_xlabel("TTFT (ms)")
    ax.set_ylabel("requests")
    cfg = report.config
    ax.set_title(f"{cfg.model}: prefix {cfg.prefix_tokens} tokens, cold/warm p50 "
                 f"{'-' if ratio is None else f'{ratio:.2f}x'}", fontsize=10)
    ax.set_ylim(0, max(tallest, 1.0) * 1.4)  # headroom so the legend does not cover the bars
    ax.legend(loc="best")
    ax.grid(alpha=0.3)
    return fig
