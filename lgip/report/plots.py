"""lgip.report.plots: the report's figures, drawn with matplotlib (Agg) into PNG files: the
frontier (invariance error against positive rate, 95% CI whiskers, the Pareto frontier, each
model labelled beside its point), the positive rate per flip type and model, and LGIP beside
retrieval (positive rate against image-to-text recall@1 and against the flip top-1 rate, with
Spearman's rho across models); the helpers every figure draws with. The image side, the text prior and
the factors are drawn in lgip.report.diagnostic_plots. A new figure is one more function, returning its
path or None when no row has its figures.

    >>> plot_frontier(rows, "x__LGIP_frontier.png", subtitle("x", rows, "headline_source", FRONTIER_FIGURES))
    ['tiny_siglip']
"""

import re
import textwrap
import warnings

from ..method import FLIP_TYPES
from ..models.families import known_family
from ..outputs import atomic_open
from .evaluations import EVALUATIONS
from .rows import RETRIEVAL_AXES, rank_correlations
from .tables import row_types

FRONTIER_FIGURES = ["invariance_error", "pos_rate"]
FLIPTYPE_FIGURES = [f"{t}_pos_rate" for t in FLIP_TYPES]
RETRIEVAL_FIGURES = ["pos_rate", *RETRIEVAL_AXES]
PRIOR_FIGURES = ["prior_pos_rate", "pos_rate"]
FACTOR_FIGURES = ["pos_rate", "grounded_pos_rate"]


def pareto_front(points):
    """Indices of the non-dominated (x, y) points, lower x and higher y being better, by x.

    >>> pareto_front([(0.1, 0.6), (0.2, 0.9), (0.3, 0.8), (0.1, 0.5)])
    [0, 1]
    """
    front = []
    for i, (x, y) in enumerate(points):
        dominated = any((xo <= x and yo >= y) and (xo < x or yo > y) for j, (xo, yo) in enumerate(points) if j != i)
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: (points[i][0], points[i][1]))


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "font.size": 11,
            "axes.titlesize": 13,
            "axes.labelsize": 12,
            "legend.fontsize": 10,
            "xtick.labelsize": 10,
            "ytick.labelsize": 10,
            "axes.spines.top": False,
            "axes.spines.right": False,
        }
    )
    return plt


FAMILY_MARKERS = {"OpenCLIP": "o", "SigLIP": "s", "generative VLM": "^", "ITM cross-encoder": "v"}


def _family(row):
    """How the legend names a row's kind of model: its family record's label (lgip.models.families: 'OpenCLIP',
    'SigLIP' for a SigLIP/SigLIP2 checkpoint whichever type loaded it, 'generative VLM', 'ITM cross-encoder', ...,
    LGIP_SPEC.md 13) of the run's model type and model family; 'other' for a type lgip does not know."""
    kind = known_family({"type": row.get("_type")})
    return kind.label(row.get("_family")) if kind is not None else "other"


def _model_colors(tags):
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if len(tags) <= 10 else "tab20"]
    return {t: cmap(i % cmap.N) for i, t in enumerate(tags)}


def model_colors_hex(tags):
    """The figures' colour of each model, as '#rrggbb' (for the page)."""
    from matplotlib.colors import to_hex

    return {t: to_hex(c) for t, c in _model_colors(tags).items()}


def _save(fig, path, dpi, files=None):
    with (files.open if files else atomic_open)(path, "wb") as f:
        fig.savefig(f, format="png", dpi=dpi)


def rate_limits(values, pad):
    """(low, high) axis limits of a rate's values padded by `pad` on each side, kept within
    [0, 1]: a side that would pass 0 or 1 stops there and the span moves inward, so no axis of a
    rate shows a value it cannot take (markers at 0 or 1 are drawn whole: clip_on=False)."""
    lo, hi = min(values) - pad, max(values) + pad
    if hi > 1.0:
        lo, hi = lo - (hi - 1.0), 1.0
    return max(0.0, lo), hi


def _err(v, lo, hi):
    return None if lo is None or hi is None else [[max(v - lo, 0.0)], [max(hi - v, 0.0)]]


def _point(ax, x, y, xerr, yerr, marker, color):
    """One model's point with its 95% whiskers (_err; None: none), as every scatter of the report draws it."""
    ax.errorbar(
        x,
        y,
        xerr=xerr,
        yerr=yerr,
        fmt=marker,
        color=color,
        ecolor=color,
        elinewidth=1.2,
        capsize=3,
        markersize=8,
        markeredgecolor="white",
        markeredgewidth=0.8,
        zorder=3,
        clip_on=False,
    )


def _place_labels(fig, ax, items, obstacles=(), leader=False):
    """Annotate each (x, y, text) beside its point, avoiding other labels, points and the
    `obstacles` (data points, e.g. along the whiskers); `leader`: a thin line from each label to its
    point (where points crowd, the label may sit nearer another point than its own)."""
    renderer = fig.canvas.get_renderer()
    axbox = ax.get_window_extent(renderer)
    pts = [ax.transData.transform((x, y)) for x, y, _ in items]
    others = [ax.transData.transform(p) for p in obstacles]
    placed = []
    offsets = [
        (9, 7, "left", "bottom"),
        (9, -7, "left", "top"),
        (-9, 7, "right", "bottom"),
        (-9, -7, "right", "top"),
        (0, 12, "center", "bottom"),
        (0, -12, "center", "top"),
        (16, 0, "left", "center"),
        (-16, 0, "right", "center"),
        (9, 22, "left", "bottom"),
        (9, -22, "left", "top"),
        (-9, 22, "right", "bottom"),
        (-9, -22, "right", "top"),
    ]
    for n, (x, y, text) in enumerate(items):
        best = None
        for dx, dy, ha, va in offsets:
            ann = ax.annotate(
                text,
                (x, y),
                xytext=(dx, dy),
                textcoords="offset points",
                ha=ha,
                va=va,
                fontsize=10,
                color="0.1",
                zorder=5,
                bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.75),
                **(
                    {"arrowprops": dict(arrowstyle="-", color="0.45", linewidth=0.7, shrinkA=0, shrinkB=4)}
                    if leader
                    else {}
                ),
            )
            box = ann.get_window_extent(renderer).expanded(1.04, 1.1)
            cost = sum(box.overlaps(b) for b in placed) * 10
            cost += (
                sum(
                    1
                    for j, p in enumerate(pts)
                    if j != n and box.x0 - 6 <= p[0] <= box.x1 + 6 and box.y0 - 6 <= p[1] <= box.y1 + 6
                )
                * 3
            )
            cost += sum(1 for p in others if box.x0 <= p[0] <= box.x1 and box.y0 <= p[1] <= box.y1)
            cost += 20 * (box.x0 < axbox.x0 or box.x1 > axbox.x1 or box.y0 < axbox.y0 or box.y1 > axbox.y1)
            if best is None or cost < best[0]:
                if best is not None:
                    best[1].remove()
                best = (cost, ann, box)
            else:
                ann.remove()
            if cost == 0:
                break
        placed.append(best[2])


def plot_frontier(rows, path, title_note="", dpi=150, files=None):
    """Invariance error (x) against positive rate (y), CI whiskers, Pareto frontier; None if no data. Models
    of several score kinds (LGIP_SPEC.md 13): the relative invariance error on x, the one comparable across
    kinds. files: the lgip.outputs.OutputSet the PNG belongs to (None: written at once), as for every figure."""
    from .rows import mixed_kinds

    x_key = "invariance_error_rel" if mixed_kinds(rows) else "invariance_error"
    pts = [r for r in rows if r.get(x_key) is not None and r["pos_rate"] is not None]
    if not pts:
        return None
    plt = _pyplot()
    from matplotlib.lines import Line2D

    colors = _model_colors([r["model"] for r in rows])
    fig, ax = plt.subplots(figsize=(8, 6))
    xy = [(r[x_key], r["pos_rate"]) for r in pts]
    front = pareto_front(xy)
    xs = [v for r in pts for v in (r[x_key], r.get(x_key + "_ci_lo"), r.get(x_key + "_ci_hi")) if v is not None]
    ys = [v for r in pts for v in (r["pos_rate"], r["pos_rate_ci_lo"], r["pos_rate_ci_hi"]) if v is not None]
    xpad = max((max(xs) - min(xs)) * 0.18, 0.01)
    ypad = max((max(ys) - min(ys)) * 0.18, 0.02)
    ax.set_xlim(max(0.0, min(xs) - xpad), max(xs) + xpad)
    ax.set_ylim(*rate_limits(ys, ypad))
    ax.grid(True, alpha=0.3, linewidth=0.8)
    lo_y, hi_y = ax.get_ylim()
    handles = []
    if lo_y <= 0.5 <= hi_y:
        ax.axhline(0.5, color="0.55", linestyle=":", linewidth=1.2, zorder=1)
        handles.append(Line2D([], [], color="0.55", linestyle=":", label="chance (0.5)"))
    if len(front) > 1:
        ax.plot([xy[i][0] for i in front], [xy[i][1] for i in front], "--", color="0.25", linewidth=1.6, zorder=2)
    if len(pts) > 1:  # (a frontier of one model says nothing)
        handles.append(
            Line2D(
                [],
                [],
                color="0.25",
                linestyle="--",
                marker="o",
                markerfacecolor="white",
                markeredgecolor="0.1",
                markeredgewidth=1.6,
                label="Pareto frontier",
            )
        )
    families = {}
    for i, r in enumerate(pts):
        c = colors[r["model"]]
        family = _family(r)
        marker = FAMILY_MARKERS.get(family, "D")
        families.setdefault(family, marker)
        on_front = i in front
        ax.errorbar(
            r[x_key],
            r["pos_rate"],
            xerr=_err(r[x_key], r.get(x_key + "_ci_lo"), r.get(x_key + "_ci_hi")),
            yerr=_err(r["pos_rate"], r["pos_rate_ci_lo"], r["pos_rate_ci_hi"]),
            fmt=marker,
            color=c,
            ecolor=c,
            elinewidth=1.3,
            capsize=3.5,
            markersize=9 if on_front else 7.5,
            markeredgecolor="0.1" if on_front else "white",
            markeredgewidth=1.6 if on_front else 0.8,
            alpha=1.0,
            zorder=4 if on_front else 3,
            clip_on=False,
        )
    for name, marker in families.items():
        handles.append(Line2D([], [], color="0.45", marker=marker, linestyle="none", markersize=7, label=name))
    ax.set_xlabel(
        "Invariance error: mean |Δ sim| under paraphrase (lower is better)"
        if x_key == "invariance_error"
        else "Relative invariance error: paraphrase |Δ s| / another caption's |Δ s| (lower is better)"
    )
    ax.set_ylabel("Positive rate: flips scored below original (higher is better)")
    ax.set_title("LGIP: invariance vs. sensitivity" + (f"\n{title_note}" if title_note else ""), fontsize=13)
    handles.append(
        Line2D([], [], color="0.3", marker=r"$\nwarrow$", linestyle="none", markersize=13, label="better: up and left")
    )
    ax.legend(handles=handles, loc="best", frameon=True, framealpha=0.9)
    fig.tight_layout()
    whiskers = []
    for r in pts:
        x, y = r[x_key], r["pos_rate"]
        for lo, hi, horizontal in (
            (r.get(x_key + "_ci_lo"), r.get(x_key + "_ci_hi"), True),
            (r["pos_rate_ci_lo"], r["pos_rate_ci_hi"], False),
        ):
            if lo is not None and hi is not None:
                for f in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0):
                    v = lo + f * (hi - lo)
                    whiskers.append((v, y) if horizontal else (x, v))
    _place_labels(fig, ax, [(r[x_key], r["pos_rate"], r["label"]) for r in pts], whiskers)
    _save(fig, path, dpi, files)
    plt.close(fig)
    return [pts[i]["model"] for i in front]


TYPE_PALETTE = {"color": "#e07b39", "number": "#5b7fc4", "object": "#3a9e6f"}  # LGIP's flip types (the page's tags too)


def type_colors(types):
    """A colour per flip type: LGIP's own for color, number, object; tab10's, in order, for a
    benchmark's types (tab20 past ten)."""
    import matplotlib
    from matplotlib.colors import to_hex

    if set(types) <= set(TYPE_PALETTE):
        return {t: TYPE_PALETTE[t] for t in types}
    cmap = matplotlib.colormaps["tab10" if len(types) <= 10 else "tab20"]
    return {t: to_hex(cmap(i % cmap.N)) for i, t in enumerate(types)}


def fliptype_figures(rows):
    """The per-type figures of the flip-type figure (for its subtitle): a positive rate per type of the rows."""
    return [f"{t}_pos_rate" for t in row_types(rows)]


LABEL_INCHES_PER_CHAR = 0.085  # a tick label's width per character at 10 pt (DejaVu Sans; measured again once drawn)
MAX_FIGURE_INCHES = 16.0  # the widest a figure grows for its labels (the page shows 100 px an inch, ~1550 px at most)


def wrap_label(text, width):
    """A model's label on lines of at most `width` characters: as it is when it fits, else its parts before
    and from a " (" on lines of their own, each broken after a space, '_' or '-' (a part longer than `width`
    stays whole).

    >>> wrap_label("ViT-B-16 (laion2b_s34b_b88k__ft_plain)", 16)
    'ViT-B-16\n(laion2b_s34b_\nb88k__ft_plain)'
    """
    if len(text) <= width:
        return text
    lines = []
    for segment in re.split(r" (?=\()", text):
        lines.append("")
        for part in re.split(r"(?<=[ _-])", segment):
            if lines[-1] and len(lines[-1].rstrip() + part.rstrip()) > width:
                lines.append("")
            lines[-1] += part
    return "\n".join(line.strip() for line in lines if line.strip())


def _fit_tick_labels(fig, ax, labels, width):
    """The x tick labels set so that none overprints another: wrapped to `width` characters and level where the
    widest fits its model's slot, else wrapped to twice that and turned 30, 45, 60 or 90 degrees (the least
    that keeps neighbouring labels apart); returns the angle."""
    import math

    renderer = fig.canvas.get_renderer()
    x0, x1 = ax.get_xticks()[:2] if len(ax.get_xticks()) > 1 else (0, 1)
    slot = abs(ax.transData.transform((x1, 0))[0] - ax.transData.transform((x0, 0))[0])
    ax.set_xticklabels([wrap_label(t, width) for t in labels], rotation=0, ha="center")
    if len(labels) == 1 or max(t.get_window_extent(renderer).width for t in ax.get_xticklabels()) <= 0.92 * slot:
        return 0
    turned = [wrap_label(t, 2 * width) for t in labels]  # (two lines at most of a long name: less to turn)
    ax.set_xticklabels(turned, rotation=0, ha="center")
    height = max(t.get_window_extent(renderer).height for t in ax.get_xticklabels())
    angle = next((a for a in (30, 45, 60) if slot * math.sin(math.radians(a)) >= 1.5 * height), 90)
    ax.set_xticklabels(turned, rotation=angle, ha="right" if angle < 90 else "center", rotation_mode="anchor")
    return angle


def _inside(fig, artist, margin=3):
    """The artist's box within the figure's, `margin` pixels from each edge."""
    box = artist.get_window_extent(fig.canvas.get_renderer())
    w, h = fig.bbox.width, fig.bbox.height
    return box.x0 >= margin and box.y0 >= margin and box.x1 <= w - margin and box.y1 <= h - margin


MIN_AXES_INCHES = 3.0  # the bars' height kept whatever the labels under them take


def plot_fliptypes(rows, path, title_note="", dpi=150, files=None, benchmark=None):
    """Grouped bars: per model, the positive rate of each flip type with CI whiskers (the types of
    the rows' per-type columns, in their order: LGIP's three, or an imported benchmark's own);
    `benchmark`: lgip.report.benchmark_source's dict (the title names it, and says the
    positive rate is its accuracy where it is); None if no data. The figure widens for long model names
    (wrapped on the axis; past MAX_FIGURE_INCHES turned), and the legend takes the rows it needs, so no
    label overprints another and nothing is cut at an edge, with any number of models and names."""
    types = row_types(rows)
    pts = [r for r in rows if any(r.get(f"{t}_pos_rate") is not None for t in types)]
    if not pts:
        return None
    plt = _pyplot()
    import numpy as np

    palette = type_colors(types)
    n, nt = len(pts), len(types)
    labels = [r["label"] for r in pts]
    bars = 0.35 * nt + 0.2  # (inches: one model's bars)
    chars = max(16, int((max(7.0, bars * n + 2.5) - 2.5) / n / LABEL_INCHES_PER_CHAR))
    longest = max(len(line) for t in labels for line in wrap_label(t, chars).split("\n"))
    slot = max(bars, LABEL_INCHES_PER_CHAR * longest + 0.25)
    fig_width = min(max(7.0, slot * n + 2.5), max(MAX_FIGURE_INCHES, 0.22 * n + 2.5))
    fig, ax = plt.subplots(figsize=(fig_width, 5.2))
    width = 0.8 / nt
    x = np.arange(n)
    for j, t in enumerate(types):
        vals = [r.get(f"{t}_pos_rate") for r in pts]
        lo = [r.get(f"{t}_pos_rate_ci_lo") for r in pts]
        hi = [r.get(f"{t}_pos_rate_ci_hi") for r in pts]
        err = None
        if all(v is None or (a is not None and b is not None) for v, a, b in zip(vals, lo, hi)):
            err = np.array(
                [
                    [0.0 if v is None else max(v - a, 0.0) for v, a in zip(vals, lo)],
                    [0.0 if v is None else max(b - v, 0.0) for v, b in zip(vals, hi)],
                ]
            )
        counts = {
            r.get(f"{t}_count") for r in pts
        }  # (the flips of the type each model scored: one number when all agree)
        count = counts.pop() if len(counts) == 1 and None not in counts else None
        label = t + (
            ""
            if count is None
            else f" ({count} flips)"
            if benchmark is None
            else f" ({count} item{'s' if count != 1 else ''})"
        )
        ax.bar(
            x + (j - (nt - 1) / 2) * width,
            [np.nan if v is None else v for v in vals],
            width * 0.92,
            yerr=err,
            capsize=3,
            color=palette.get(t),
            edgecolor="white",
            linewidth=0.6,
            error_kw=dict(ecolor="0.2", elinewidth=1.0, clip_on=False),
            label=label,
            zorder=3,
        )
    ax.axhline(0.5, color="0.3", linestyle="--", linewidth=1.2, zorder=4, label="chance (0.5)")
    ax.set_xticks(x)
    ax.set_xlim(-0.5, n - 0.5)
    ax.set_ylim(0, 1)  # (a rate's whole range, no more; the legend sits clear above a bar at 1)
    ax.set_ylabel("Positive rate (higher is better)")
    ax.grid(True, axis="y", alpha=0.3, zorder=0)
    title = (
        "LGIP sensitivity by flip type: share of flips scored below the original"
        if benchmark is None
        else f"{benchmark['name']} by type: accuracy = positive rate"
        if benchmark["accuracy"]
        else f"{benchmark['name']} by type: positive rate"
    )
    # (the legend in a band above the bars, on one row where the figure may widen for it and its title, else
    # in as many columns as the figure takes whole; the title above it)
    renderer = fig.canvas.get_renderer()
    legend = ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=nt + 1, frameon=False)
    heading = ax.set_title(title + (f"\n{title_note}" if title_note else ""), fontsize=13)
    widths = [a.get_window_extent(renderer).width / fig.dpi + 1.4 for a in (legend, heading)]
    wanted = max((w for w in widths if w <= max(MAX_FIGURE_INCHES, fig_width)), default=0.0)
    if wanted > fig_width:
        fig.set_size_inches(wanted, fig.get_figheight())
    legend.remove()
    ax.set_xticklabels([wrap_label(t, chars) for t in labels])
    entries = nt + 1
    for ncol in dict.fromkeys(-(-entries // r) for r in range(1, entries + 1)):  # (rows filled evenly)
        legend = ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=ncol, frameon=False)
        points = legend.get_window_extent(renderer).height * 72.0 / fig.dpi
        ax.set_title(title + (f"\n{title_note}" if title_note else ""), fontsize=13, pad=points + 12)
        with warnings.catch_warnings():  # (a legend too wide for the figure: fewer columns, next time round)
            warnings.simplefilter("ignore", UserWarning)
            fig.tight_layout()
            _fit_tick_labels(fig, ax, labels, chars)
            fig.tight_layout()
        if ncol == 1 or (_inside(fig, legend) and _inside(fig, ax.title)):
            break
        legend.remove()
    short = MIN_AXES_INCHES - ax.get_position().height * fig.get_figheight()
    if short > 0:  # (labels turned under the bars take height: the figure grows rather than the bars shrink)
        fig.set_size_inches(fig.get_figwidth(), fig.get_figheight() + short)
        fig.tight_layout()
    _save(fig, path, dpi, files)
    plt.close(fig)
    return path


RETRIEVAL_LABELS = {
    "retrieval_i2t_recall@1": ("image-to-text R@1", "Image-to-text recall@1: standard retrieval (higher is better)"),
    "retrieval_i2t_flip_top1_rate": ("flip top-1 rate", "Flip top-1 rate: the best text is a flip (lower is better)"),
}


def rho_text(c):
    """'Spearman ρ = 0.43 (9 models)', '... (3 models: descriptive)', or 'ρ undefined' (under 3 models
    or a constant figure)."""
    models = f"{c['n']} model{'s' if c['n'] != 1 else ''}" + (": descriptive" if c["descriptive"] else "")
    return (f"Spearman ρ = {c['rho']:.2f}" if c["rho"] is not None else "Spearman ρ undefined") + f" ({models})"


def plot_retrieval(rows, path, title_note="", dpi=150, files=None):
    """Each model's LGIP positive rate against its image-to-text recall@1 (left) and its flip top-1
    rate (right), 95% CI whiskers, Spearman's rho across models in each panel's title; None when
    no model has both figures."""
    panels = [
        (c, [r for r in rows if r.get(c["x"]) is not None and r.get("pos_rate") is not None])
        for c in rank_correlations(rows)
    ]
    if not panels:
        return None
    plt = _pyplot()
    from matplotlib.lines import Line2D

    colors = _model_colors([r["model"] for r in rows])
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 5.6), sharey=True, squeeze=False)
    families = {}
    ys = [
        v
        for _, pts in panels
        for r in pts
        for v in (r["pos_rate"], r["pos_rate_ci_lo"], r["pos_rate_ci_hi"])
        if v is not None
    ]
    ypad = max((max(ys) - min(ys)) * 0.18, 0.02)
    for ax, (c, pts) in zip(axes[0], panels):
        x = c["x"]
        xs = [v for r in pts for v in (r[x], r[x + "_ci_lo"], r[x + "_ci_hi"]) if v is not None]
        xpad = max((max(xs) - min(xs)) * 0.18, 0.02)
        ax.set_xlim(*rate_limits(xs, xpad))  # (a rate of 0 or 1: on the axis's end, its marker whole)
        ax.set_ylim(*rate_limits(ys, ypad))
        ax.grid(True, alpha=0.3, linewidth=0.8)
        for r in pts:
            family = _family(r)
            marker = families.setdefault(family, FAMILY_MARKERS.get(family, "D"))
            _point(
                ax,
                r[x],
                r["pos_rate"],
                _err(r[x], r[x + "_ci_lo"], r[x + "_ci_hi"]),
                _err(r["pos_rate"], r["pos_rate_ci_lo"], r["pos_rate_ci_hi"]),
                marker,
                colors[r["model"]],
            )
        ax.set_xlabel(RETRIEVAL_LABELS[x][1])
        ax.set_title(f"vs. {RETRIEVAL_LABELS[x][0]}: {rho_text(c)}", fontsize=11.5)
    axes[0][0].set_ylabel("LGIP positive rate (higher is better)")
    fig.suptitle("LGIP beside retrieval" + (f"\n{title_note}" if title_note else ""), fontsize=13)
    handles = [
        Line2D([], [], color="0.45", marker=m, linestyle="none", markersize=7, label=f) for f, m in families.items()
    ]
    if len(handles) > 1:
        axes[0][-1].legend(handles=handles, loc="best", frameon=True, framealpha=0.9)
    fig.tight_layout()
    for ax, (c, pts) in zip(axes[0], panels):
        _place_labels(fig, ax, [(r[c["x"]], r["pos_rate"], r["label"]) for r in pts])
    _save(fig, path, dpi, files)
    plt.close(fig)
    return path


def subtitle(stem, rows, source_column, figures, also=()):
    """'<stem> · <sources> · whiskers: 95% CI' for a figure's title, wrapped; `also`: evaluations
    (keys) whose figures it shows beside the rows' sources."""
    sources = [e.short for e in EVALUATIONS if any(r[source_column] == e.key for r in rows) or e.key in also]
    whiskers = any(r.get(f + "_ci_lo") is not None for r in rows for f in figures)
    text = " · ".join([stem, " + ".join(sources), "whiskers: 95% CI" if whiskers else "no intervals"])
    return "\n".join(textwrap.wrap(text, 70))
