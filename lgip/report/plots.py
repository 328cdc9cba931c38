"""lgip.report.plots: the report's figures, drawn with matplotlib (Agg) into PNG files: the
frontier (invariance error against positive rate, 95% CI whiskers, the Pareto frontier, each
model labelled beside its point), the positive rate per flip type and model, and LGIP beside
retrieval (positive rate against image-to-text recall@1 and against the flip top-1 rate, with
Spearman's rho across models), and the positive rate against the text prior (its prior positive
rate, the diagonal drawn), and the image side beside the text side (image invariance error and
positive rate against the text's). A new figure is one more function here, returning its path or None
when no row has its figures.

    >>> plot_frontier(rows, "x__LGIP_frontier.png", subtitle("x", rows, "headline_source", FRONTIER_FIGURES))
    ['tiny_siglip']
"""
import textwrap

from ..method import FLIP_TYPES
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
    plt.rcParams.update({"font.size": 11, "axes.titlesize": 13, "axes.labelsize": 12,
                         "legend.fontsize": 10, "xtick.labelsize": 10, "ytick.labelsize": 10,
                         "axes.spines.top": False, "axes.spines.right": False})
    return plt


FAMILY_MARKERS = {"OpenCLIP": "o", "SigLIP": "s", "generative VLM": "^", "ITM cross-encoder": "v"}


def _family(row):
    """'OpenCLIP', 'SigLIP', 'generative VLM', 'ITM cross-encoder' (LGIP_SPEC.md 13) or 'other': the run's
    model type (a transformers model by its model type: SigLIP/SigLIP2 checkpoints are SigLIP whichever
    type loaded them), else the tag."""
    kind = row.get("_type") or ("siglip" if "siglip" in row["model"].lower() else
                                "openclip" if "clip" in row["model"].lower() else None)
    if str(row.get("_family") or "").startswith("siglip"):
        kind = "siglip"
    return {"openclip": "OpenCLIP", "siglip": "SigLIP", "generative": "generative VLM",
            "itm": "ITM cross-encoder"}.get(kind, "other")


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


def _place_labels(fig, ax, items, obstacles=(), leader=False):
    """Annotate each (x, y, text) beside its point, avoiding other labels, points and the
    `obstacles` (data points, e.g. along the whiskers); `leader`: a thin line from each label to its
    point (where points crowd, the label may sit nearer another point than its own)."""
    renderer = fig.canvas.get_renderer()
    axbox = ax.get_window_extent(renderer)
    pts = [ax.transData.transform((x, y)) for x, y, _ in items]
    others = [ax.transData.transform(p) for p in obstacles]
    placed = []
    offsets = [(9, 7, "left", "bottom"), (9, -7, "left", "top"), (-9, 7, "right", "bottom"),
               (-9, -7, "right", "top"), (0, 12, "center", "bottom"), (0, -12, "center", "top"),
               (16, 0, "left", "center"), (-16, 0, "right", "center"), (9, 22, "left", "bottom"),
               (9, -22, "left", "top"), (-9, 22, "right", "bottom"), (-9, -22, "right", "top")]
    for n, (x, y, text) in enumerate(items):
        best = None
        for dx, dy, ha, va in offsets:
            ann = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", ha=ha, va=va,
                              fontsize=10, color="0.1", zorder=5,
                              bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.75),
                              **({"arrowprops": dict(arrowstyle="-", color="0.45", linewidth=0.7, shrinkA=0, shrinkB=4)}
                                 if leader else {}))
            box = ann.get_window_extent(renderer).expanded(1.04, 1.1)
            cost = sum(box.overlaps(b) for b in placed) * 10
            cost += sum(1 for j, p in enumerate(pts) if j != n and box.x0 - 6 <= p[0] <= box.x1 + 6
                        and box.y0 - 6 <= p[1] <= box.y1 + 6) * 3
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
        handles.append(Line2D([], [], color="0.25", linestyle="--", marker="o", markerfacecolor="white",
                              markeredgecolor="0.1", markeredgewidth=1.6, label="Pareto frontier"))
    families = {}
    for i, r in enumerate(pts):
        c = colors[r["model"]]
        family = _family(r)
        marker = FAMILY_MARKERS.get(family, "D")
        families.setdefault(family, marker)
        on_front = i in front
        ax.errorbar(r[x_key], r["pos_rate"],
                    xerr=_err(r[x_key], r.get(x_key + "_ci_lo"), r.get(x_key + "_ci_hi")),
                    yerr=_err(r["pos_rate"], r["pos_rate_ci_lo"], r["pos_rate_ci_hi"]),
                    fmt=marker, color=c, ecolor=c, elinewidth=1.3, capsize=3.5, markersize=9 if on_front else 7.5,
                    markeredgecolor="0.1" if on_front else "white", markeredgewidth=1.6 if on_front else 0.8,
                    alpha=1.0, zorder=4 if on_front else 3, clip_on=False)
    for name, marker in families.items():
        handles.append(Line2D([], [], color="0.45", marker=marker, linestyle="none", markersize=7, label=name))
    ax.set_xlabel("Invariance error: mean |Δ sim| under paraphrase (lower is better)" if x_key == "invariance_error" else
                  "Relative invariance error: paraphrase |Δ s| / another caption's |Δ s| (lower is better)")
    ax.set_ylabel("Positive rate: flips scored below original (higher is better)")
    ax.set_title("LGIP: invariance vs. sensitivity" + (f"\n{title_note}" if title_note else ""), fontsize=13)
    handles.append(Line2D([], [], color="0.3", marker=r"$\nwarrow$", linestyle="none", markersize=13,
                          label="better: up and left"))
    ax.legend(handles=handles, loc="best", frameon=True, framealpha=0.9)
    fig.tight_layout()
    whiskers = []
    for r in pts:
        x, y = r[x_key], r["pos_rate"]
        for lo, hi, horizontal in ((r.get(x_key + "_ci_lo"), r.get(x_key + "_ci_hi"), True),
                                   (r["pos_rate_ci_lo"], r["pos_rate_ci_hi"], False)):
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


def plot_fliptypes(rows, path, title_note="", dpi=150, files=None, benchmark=None):
    """Grouped bars: per model, the positive rate of each flip type with CI whiskers (the types of
    the rows' per-type columns, in their order: LGIP's three, or an imported benchmark's own);
    `benchmark`: lgip.report.benchmark_source's dict (the title names it, and says the
    positive rate is its accuracy where it is); None if no data."""
    types = row_types(rows)
    pts = [r for r in rows if any(r.get(f"{t}_pos_rate") is not None for t in types)]
    if not pts:
        return None
    plt = _pyplot()
    import numpy as np
    palette = type_colors(types)
    n, nt = len(pts), len(types)
    fig_width = max(7.0, (0.35 * nt + 0.2) * n + 2.5)
    fig, ax = plt.subplots(figsize=(fig_width, 5.2))
    width = 0.8 / nt
    x = np.arange(n)
    for j, t in enumerate(types):
        vals = [r.get(f"{t}_pos_rate") for r in pts]
        lo = [r.get(f"{t}_pos_rate_ci_lo") for r in pts]
        hi = [r.get(f"{t}_pos_rate_ci_hi") for r in pts]
        err = None
        if all(v is None or (a is not None and b is not None) for v, a, b in zip(vals, lo, hi)):
            err = np.array([[0.0 if v is None else max(v - a, 0.0) for v, a in zip(vals, lo)],
                            [0.0 if v is None else max(b - v, 0.0) for v, b in zip(vals, hi)]])
        counts = {r.get(f"{t}_count") for r in pts}  # (the flips of the type each model scored: one number when all agree)
        count = counts.pop() if len(counts) == 1 and None not in counts else None
        label = t + ("" if count is None else f" ({count} flips)" if benchmark is None else
                     f" ({count} item{'s' if count != 1 else ''})")
        ax.bar(x + (j - (nt - 1) / 2) * width, [np.nan if v is None else v for v in vals], width * 0.92,
               yerr=err, capsize=3, color=palette.get(t), edgecolor="white", linewidth=0.6,
               error_kw=dict(ecolor="0.2", elinewidth=1.0, clip_on=False), label=label, zorder=3)
    ax.axhline(0.5, color="0.3", linestyle="--", linewidth=1.2, zorder=4, label="chance (0.5)")
    ax.set_xticks(x)
    ax.set_xticklabels([r["label"] for r in pts], rotation=25 if n > 3 else 0, ha="right" if n > 3 else "center")
    ax.set_ylim(0, 1)  # (a rate's whole range, no more; the legend sits clear above a bar at 1)
    ax.set_ylabel("Positive rate (higher is better)")
    ax.grid(True, axis="y", alpha=0.3, zorder=0)
    # (a benchmark's types, longer names: the legend in rows as wide as the figure, the title above them)
    ncol = nt + 1 if benchmark is None else max(1, min(nt + 1, int(fig_width / 2.4)))
    legend_rows = -(-(nt + 1) // ncol)
    title = ("LGIP sensitivity by flip type: share of flips scored below the original" if benchmark is None else
             f"{benchmark['name']} by type: accuracy = positive rate" if benchmark["accuracy"] else
             f"{benchmark['name']} by type: positive rate")
    ax.set_title(title + (f"\n{title_note}" if title_note else ""), fontsize=13, pad=36 + 17 * (legend_rows - 1))
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.025), ncol=ncol, frameon=False)
    fig.tight_layout()
    _save(fig, path, dpi, files)
    plt.close(fig)
    return path


RETRIEVAL_LABELS = {"retrieval_i2t_recall@1": ("image-to-text R@1", "Image-to-text recall@1: standard retrieval (higher is better)"),
                    "retrieval_i2t_flip_top1_rate": ("flip top-1 rate", "Flip top-1 rate: the best text is a flip (lower is better)")}


def rho_text(c):
    """'Spearman ρ = 0.43 (9 models)', '... (3 models: descriptive)', or 'ρ undefined' (under 3 models
    or a constant figure)."""
    models = f"{c['n']} model{'s' if c['n'] != 1 else ''}" + (": descriptive" if c["descriptive"] else "")
    return (f"Spearman ρ = {c['rho']:.2f}" if c["rho"] is not None else "Spearman ρ undefined") + f" ({models})"


def plot_retrieval(rows, path, title_note="", dpi=150, files=None):
    """Each model's LGIP positive rate against its image-to-text recall@1 (left) and its flip top-1
    rate (right), 95% CI whiskers, Spearman's rho across models in each panel's title; None when
    no model has both figures."""
    panels = [(c, [r for r in rows if r.get(c["x"]) is not None and r.get("pos_rate") is not None])
              for c in rank_correlations(rows)]
    if not panels:
        return None
    plt = _pyplot()
    from matplotlib.lines import Line2D
    colors = _model_colors([r["model"] for r in rows])
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 5.6), sharey=True, squeeze=False)
    families = {}
    ys = [v for _, pts in panels for r in pts for v in (r["pos_rate"], r["pos_rate_ci_lo"], r["pos_rate_ci_hi"])
          if v is not None]
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
            ax.errorbar(r[x], r["pos_rate"], xerr=_err(r[x], r[x + "_ci_lo"], r[x + "_ci_hi"]),
                        yerr=_err(r["pos_rate"], r["pos_rate_ci_lo"], r["pos_rate_ci_hi"]), fmt=marker,
                        color=colors[r["model"]], ecolor=colors[r["model"]], elinewidth=1.2, capsize=3,
                        markersize=8, markeredgecolor="white", markeredgewidth=0.8, zorder=3, clip_on=False)
        ax.set_xlabel(RETRIEVAL_LABELS[x][1])
        ax.set_title(f"vs. {RETRIEVAL_LABELS[x][0]}: {rho_text(c)}", fontsize=11.5)
    axes[0][0].set_ylabel("LGIP positive rate (higher is better)")
    fig.suptitle("LGIP beside retrieval" + (f"\n{title_note}" if title_note else ""), fontsize=13)
    handles = [Line2D([], [], color="0.45", marker=m, linestyle="none", markersize=7, label=f) for f, m in families.items()]
    if len(handles) > 1:
        axes[0][-1].legend(handles=handles, loc="best", frameon=True, framealpha=0.9)
    fig.tight_layout()
    for ax, (c, pts) in zip(axes[0], panels):
        _place_labels(fig, ax, [(r[c["x"]], r["pos_rate"], r["label"]) for r in pts])
    _save(fig, path, dpi, files)
    plt.close(fig)
    return path


IMAGE_SIDE_PANELS = (("invariance_error", "image_invariance_error", "Invariance (image: jpeg, downscale, crop, hflip)",
                      "Text invariance error: paraphrases (lower is better)", "Image invariance error (lower is better)"),
                     ("pos_rate", "image_pos_rate", "Sensitivity (image: mix, patch)",
                      "Text positive rate: flips (higher is better)", "Image positive rate (higher is better)"))
IMAGE_SIDE_FIGURES = [f for panel in IMAGE_SIDE_PANELS for f in panel[:2]]


def plot_image_side(rows, path, title_note="", dpi=150, files=None):
    """The image side beside the text side (LGIP_SPEC.md 11): each model's image invariance error
    against its text invariance error (left) and its image positive rate against its text positive
    rate (right), 95% CI whiskers both ways; on the right the diagonal (as sensitive to the image as
    to the caption) and chance (0.5) on both axes. A panel with no model having both figures is left
    out; None when both are."""
    panels = [(p, [r for r in rows if r.get(p[0]) is not None and r.get(p[1]) is not None]) for p in IMAGE_SIDE_PANELS]
    panels = [(p, pts) for p, pts in panels if pts]
    if not panels:
        return None
    plt = _pyplot()
    from matplotlib.lines import Line2D
    colors = _model_colors([r["model"] for r in rows])
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 5.8), squeeze=False)
    families = {}
    for ax, ((x, y, title, xlabel, ylabel), pts) in zip(axes[0], panels):
        def span(key):
            vs = [v for r in pts for v in (r[key], r.get(key + "_ci_lo"), r.get(key + "_ci_hi")) if v is not None]
            return vs, max((max(vs) - min(vs)) * 0.18, 0.02 if key.endswith("rate") else max(vs) * 0.1 or 0.01)
        (xs, xpad), (ys, ypad) = span(x), span(y)
        if x == "pos_rate":  # (rates: one span on both axes, so the diagonal is at 45 degrees)
            lo, hi = rate_limits(xs + ys + [0.5], max(xpad, ypad))
            ax.set_xlim(lo, hi), ax.set_ylim(lo, hi)
            ax.set_aspect("equal", adjustable="box")
            ax.plot([lo, hi], [lo, hi], color="0.6", linestyle="--", linewidth=1.0, zorder=1)
            ax.axhline(0.5, color="0.55", linestyle=":", linewidth=1.1, zorder=1)
            ax.axvline(0.5, color="0.55", linestyle=":", linewidth=1.1, zorder=1)
            ax.legend(handles=[Line2D([], [], color="0.6", linestyle="--", label="as sensitive to the image as to the caption"),
                               Line2D([], [], color="0.55", linestyle=":", label="chance (0.5)")],
                      loc="best", fontsize=9, frameon=True, framealpha=0.9)
        else:  # (errors of another scale on each side: each axis its own, from 0)
            ax.set_xlim(0, max(xs) + xpad), ax.set_ylim(0, max(ys) + ypad)
        ax.grid(True, alpha=0.3, linewidth=0.8)
        for r in pts:
            family = _family(r)
            marker = families.setdefault(family, FAMILY_MARKERS.get(family, "D"))
            ax.errorbar(r[x], r[y], xerr=_err(r[x], r.get(x + "_ci_lo"), r.get(x + "_ci_hi")),
                        yerr=_err(r[y], r.get(y + "_ci_lo"), r.get(y + "_ci_hi")), fmt=marker,
                        color=colors[r["model"]], ecolor=colors[r["model"]], elinewidth=1.2, capsize=3,
                        markersize=8, markeredgecolor="white", markeredgewidth=0.8, zorder=3, clip_on=False)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title}\n{len(pts)} model{'s' if len(pts) != 1 else ''}", fontsize=11.5)
    fig.suptitle("The image side beside the text side" + (f"\n{title_note}" if title_note else ""), fontsize=13)
    handles = [Line2D([], [], color="0.45", marker=m, linestyle="none", markersize=7, label=f) for f, m in families.items()]
    if len(handles) > 1 and panels[0][0][0] == "invariance_error":
        axes[0][0].legend(handles=handles, loc="best", frameon=True, framealpha=0.9)
    fig.tight_layout()
    for ax, ((x, y, *_), pts) in zip(axes[0], panels):
        _place_labels(fig, ax, [(r[x], r[y], r["label"]) for r in pts])
    _save(fig, path, dpi, files)
    plt.close(fig)
    return path


def plot_prior(rows, path, title_note="", dpi=150, files=None):
    """Each model's positive rate (y) against its prior positive rate (x: the same flips scored
    against the average other image, LGIP_SPEC.md 9), 95% CI whiskers, the diagonal y = x drawn
    and labelled (on it, all of the positive rate is text prior), both axes the same rate span
    within [0, 1]; None when no model has both figures."""
    pts = [r for r in rows if r.get("prior_pos_rate") is not None and r.get("pos_rate") is not None]
    if not pts:
        return None
    plt = _pyplot()
    from matplotlib.lines import Line2D
    colors = _model_colors([r["model"] for r in rows])
    fig, ax = plt.subplots(figsize=(9.6, 6.4))
    values = [v for r in pts for f in PRIOR_FIGURES for v in (r[f], r.get(f + "_ci_lo"), r.get(f + "_ci_hi"))
              if v is not None]
    lo, hi = rate_limits(values, max((max(values) - min(values)) * 0.15, 0.03))
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)  # (one span for both: the diagonal at 45 degrees)
    ax.set_aspect("equal", adjustable="box")
    ax.grid(True, alpha=0.3, linewidth=0.8)
    ax.plot([lo, hi], [lo, hi], "--", color="0.35", linewidth=1.4, zorder=1, label="y = x")
    if lo <= 0.5 <= hi:
        ax.axhline(0.5, color="0.6", linestyle=":", linewidth=1.1, zorder=1)
    families = {}
    for r in pts:
        family = _family(r)
        marker = families.setdefault(family, FAMILY_MARKERS.get(family, "D"))
        ax.errorbar(r["prior_pos_rate"], r["pos_rate"],
                    xerr=_err(r["prior_pos_rate"], r.get("prior_pos_rate_ci_lo"), r.get("prior_pos_rate_ci_hi")),
                    yerr=_err(r["pos_rate"], r.get("pos_rate_ci_lo"), r.get("pos_rate_ci_hi")), fmt=marker,
                    color=colors[r["model"]], ecolor=colors[r["model"]], elinewidth=1.2, capsize=3, markersize=8,
                    markeredgecolor="white", markeredgewidth=0.8, zorder=3, clip_on=False)
    ax.set_xlabel("Prior positive rate: caption beats flip on the average other image")
    ax.set_ylabel("Positive rate: caption beats flip on its own image")
    ax.set_title("Is it the image? Positive rate against the text prior" + (f"\n{title_note}" if title_note else ""),
                 fontsize=13, pad=12)
    handles = [Line2D([], [], color="0.35", linestyle="--", label="y = x: all of it text prior"),
               Line2D([], [], color="0.3", marker=r"$\nwarrow$", linestyle="none", markersize=12,
                      label="above: its own images add"),
               Line2D([], [], color="0.3", marker=r"$\searrow$", linestyle="none", markersize=12,
                      label="below: its own images take away")]
    if lo <= 0.5 <= hi:
        handles.append(Line2D([], [], color="0.6", linestyle=":", label="chance (0.5)"))
    if len(families) > 1:
        handles += [Line2D([], [], color="0.45", marker=m, linestyle="none", markersize=7, label=f) for f, m in families.items()]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.03, 1.0), frameon=False, fontsize=9.5)  # (beside: no point under it)
    fig.tight_layout()
    whiskers = []
    for r in pts:
        x, y = r["prior_pos_rate"], r["pos_rate"]
        for a, b, horizontal in ((r.get("prior_pos_rate_ci_lo"), r.get("prior_pos_rate_ci_hi"), True),
                                 (r.get("pos_rate_ci_lo"), r.get("pos_rate_ci_hi"), False)):
            if a is not None and b is not None:
                whiskers += [((a + f * (b - a), y) if horizontal else (x, a + f * (b - a))) for f in (0.0, 0.25, 0.5, 0.75, 1.0)]
    _place_labels(fig, ax, [(r["prior_pos_rate"], r["pos_rate"], r["label"]) for r in pts], whiskers)
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


FACTOR_PANELS = (("pos_rate", "Positive rate (higher is better)", "sensitivity_pos_rate"),
                 ("grounded_pos_rate", "Grounded positive rate (0.5: the image decides nothing)", "grounded_pos_rate"))


def plot_factors(rows, path, factors=None, title_note="", dpi=150, files=None):
    """What predicts robustness (LGIP_SPEC.md 12): each model's positive rate (left) and grounded positive
    rate (right, when the evaluations wrote it) against its parameter count (log scale), 95% whiskers on
    the rates, one colour per training data (its card's; "unknown" grey), each point labelled, Spearman's
    rho of the panel's figure with log10 parameters in its title (from `factors`); None when fewer than
    two models have both a parameter count and a positive rate."""
    panels = []
    for key, label, outcome in FACTOR_PANELS:
        pts = [r for r in rows if (r.get("_card") or {}).get("params_total") and r.get(key) is not None]
        if len(pts) >= 2:  # (one model: nothing to compare)
            panels.append((key, label, outcome, pts))
    if not panels or not panels[0][0] == "pos_rate":
        return None
    plt = _pyplot()
    import matplotlib
    from matplotlib.lines import Line2D
    data = list(dict.fromkeys((r.get("_card") or {}).get("training_data") for _, _, _, pts in panels for r in pts))
    known = [d for d in data if d is not None]
    cmap = matplotlib.colormaps["tab10" if len(known) <= 10 else "tab20"]
    colors = {d: cmap(i % cmap.N) for i, d in enumerate(known)}
    colors[None] = "0.55"
    fig, axes = plt.subplots(1, len(panels), figsize=(6.4 * len(panels), 5.6), squeeze=False)
    xs = [r["_card"]["params_total"] for _, _, _, pts in panels for r in pts]
    lo_x, hi_x = min(xs), max(xs)
    for ax, (key, label, outcome, pts) in zip(axes[0], panels):
        ax.set_xscale("log")
        ax.set_xlim(lo_x / 1.6, hi_x * 1.6)  # (room for the labels at both ends)
        ys = [v for r in pts for v in (r[key], r.get(key + "_ci_lo"), r.get(key + "_ci_hi")) if v is not None]
        ax.set_ylim(*rate_limits(ys, max((max(ys) - min(ys)) * 0.18, 0.03)))
        ax.grid(True, alpha=0.3, linewidth=0.8)
        low, high = ax.get_ylim()
        if low <= 0.5 <= high:
            ax.axhline(0.5, color="0.55", linestyle=":", linewidth=1.2, zorder=1)
        for r in pts:
            c = colors[(r["_card"]).get("training_data")]
            ax.errorbar(r["_card"]["params_total"], r[key], yerr=_err(r[key], r.get(key + "_ci_lo"), r.get(key + "_ci_hi")),
                        fmt="o", color=c, ecolor=c, elinewidth=1.2, capsize=3, markersize=8, markeredgecolor="white",
                        markeredgewidth=0.8, zorder=3, clip_on=False)
        ax.set_xlabel("Parameters (image + text towers; log scale)")
        ax.set_ylabel(label)
        stat = ((factors or {}).get("numeric") or {}).get("log10_params_total", {}).get(outcome)
        n = stat["n"] if stat else len(pts)
        if stat is None or stat["rho"] is None:
            where = f"Spearman ρ undefined ({n} model{'s' if n != 1 else ''}: {'fewer than 4' if n < 4 else 'a constant side'})"
        else:
            ci = stat["rho_ci95"]
            where = f"Spearman ρ = {stat['rho']:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "") + f" ({stat['n']} models)"
        ax.set_title(f"{'Positive rate' if key == 'pos_rate' else 'Grounded positive rate'} vs. size\n{where}", fontsize=11.5)
    fig.suptitle("What predicts robustness: size and training data" + (f"\n{title_note}" if title_note else ""), fontsize=13)
    handles = [Line2D([], [], color=colors[d], marker="o", linestyle="none", markersize=8,
                      label="unknown training data" if d is None else d) for d in data]
    axes[0][-1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, fontsize=9.5,
                       title="training data", title_fontsize=9.5)
    fig.tight_layout()
    for ax, (key, _, _, pts) in zip(axes[0], panels):
        _place_labels(fig, ax, [(r["_card"]["params_total"], r[key], r["label"]) for r in pts], leader=True)
    _save(fig, path, dpi, files)
    plt.close(fig)
    return path
