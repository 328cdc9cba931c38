"""lgip.report.diagnostic_plots: the report's figures of the diagnostics beyond the text side, drawn as
lgip.report.plots draws its own (matplotlib, Agg, PNG files, each model labelled beside its point): the image
side beside the text side (LGIP_SPEC.md 11), the positive rate against the text prior (9, the diagonal drawn),
and what predicts robustness (12: the models' figures against their cards' factors). Each returns its path, or
None when no row has its figures.

    >>> plot_prior(rows, "x__LGIP_prior.png", subtitle("x", rows, "headline_source", PRIOR_FIGURES))
"""

from .plots import (
    FAMILY_MARKERS,
    PRIOR_FIGURES,
    _err,
    _family,
    _model_colors,
    _place_labels,
    _point,
    _pyplot,
    _save,
    rate_limits,
)


IMAGE_SIDE_PANELS = (
    (
        "invariance_error",
        "image_invariance_error",
        "Invariance (image: jpeg, downscale, crop, hflip)",
        "Text invariance error: paraphrases (lower is better)",
        "Image invariance error (lower is better)",
    ),
    (
        "pos_rate",
        "image_pos_rate",
        "Sensitivity (image: mix, patch)",
        "Text positive rate: flips (higher is better)",
        "Image positive rate (higher is better)",
    ),
)
IMAGE_SIDE_FIGURES = [f for panel in IMAGE_SIDE_PANELS for f in panel[:2]]


def plot_image_side(rows, path, title_note="", dpi=150, files=None):
    """The image side beside the text side (LGIP_SPEC.md 11): each model's image invariance error
    against its text invariance error (left) and its image positive rate against its text positive
    rate (right), 95% CI whiskers both ways; on the right the diagonal (as sensitive to the image as
    to the caption) and chance (0.5) on both axes. A panel with no model having both figures is left
    out; None when both are. Models of several score kinds (LGIP_SPEC.md 13): the text side's relative
    invariance error on the left's x, the one comparable across kinds (as the frontier)."""
    from .rows import mixed_kinds

    chosen = IMAGE_SIDE_PANELS
    if mixed_kinds(rows):
        rel = "Text relative invariance error (Inv. rel.: paraphrases over another image's caption; lower is better)"
        chosen = tuple(
            ("invariance_error_rel", p[1], p[2], rel, p[4]) if p[0] == "invariance_error" else p for p in chosen
        )
    panels = [(p, [r for r in rows if r.get(p[0]) is not None and r.get(p[1]) is not None]) for p in chosen]
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
            ax.legend(
                handles=[
                    Line2D([], [], color="0.6", linestyle="--", label="as sensitive to the image as to the caption"),
                    Line2D([], [], color="0.55", linestyle=":", label="chance (0.5)"),
                ],
                loc="best",
                fontsize=9,
                frameon=True,
                framealpha=0.9,
            )
        else:  # (errors of another scale on each side: each axis its own, from 0)
            ax.set_xlim(0, max(xs) + xpad), ax.set_ylim(0, max(ys) + ypad)
        ax.grid(True, alpha=0.3, linewidth=0.8)
        for r in pts:
            family = _family(r)
            marker = families.setdefault(family, FAMILY_MARKERS.get(family, "D"))
            _point(
                ax,
                r[x],
                r[y],
                _err(r[x], r.get(x + "_ci_lo"), r.get(x + "_ci_hi")),
                _err(r[y], r.get(y + "_ci_lo"), r.get(y + "_ci_hi")),
                marker,
                colors[r["model"]],
            )
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title}\n{len(pts)} model{'s' if len(pts) != 1 else ''}", fontsize=11.5)
    fig.suptitle("The image side beside the text side" + (f"\n{title_note}" if title_note else ""), fontsize=13)
    handles = [
        Line2D([], [], color="0.45", marker=m, linestyle="none", markersize=7, label=f) for f, m in families.items()
    ]
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
    values = [
        v for r in pts for f in PRIOR_FIGURES for v in (r[f], r.get(f + "_ci_lo"), r.get(f + "_ci_hi")) if v is not None
    ]
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
        _point(
            ax,
            r["prior_pos_rate"],
            r["pos_rate"],
            _err(r["prior_pos_rate"], r.get("prior_pos_rate_ci_lo"), r.get("prior_pos_rate_ci_hi")),
            _err(r["pos_rate"], r.get("pos_rate_ci_lo"), r.get("pos_rate_ci_hi")),
            marker,
            colors[r["model"]],
        )
    ax.set_xlabel("Prior positive rate: caption beats flip on the average other image")
    ax.set_ylabel("Positive rate: caption beats flip on its own image")
    ax.set_title(
        "Is it the image? Positive rate against the text prior" + (f"\n{title_note}" if title_note else ""),
        fontsize=13,
        pad=12,
    )
    handles = [
        Line2D([], [], color="0.35", linestyle="--", label="y = x: all of it text prior"),
        Line2D(
            [],
            [],
            color="0.3",
            marker=r"$\nwarrow$",
            linestyle="none",
            markersize=12,
            label="above: its own images add",
        ),
        Line2D(
            [],
            [],
            color="0.3",
            marker=r"$\searrow$",
            linestyle="none",
            markersize=12,
            label="below: its own images take away",
        ),
    ]
    if lo <= 0.5 <= hi:
        handles.append(Line2D([], [], color="0.6", linestyle=":", label="chance (0.5)"))
    if len(families) > 1:
        handles += [
            Line2D([], [], color="0.45", marker=m, linestyle="none", markersize=7, label=f) for f, m in families.items()
        ]
    ax.legend(
        handles=handles, loc="upper left", bbox_to_anchor=(1.03, 1.0), frameon=False, fontsize=9.5
    )  # (beside: no point under it)
    fig.tight_layout()
    whiskers = []
    for r in pts:
        x, y = r["prior_pos_rate"], r["pos_rate"]
        for a, b, horizontal in (
            (r.get("prior_pos_rate_ci_lo"), r.get("prior_pos_rate_ci_hi"), True),
            (r.get("pos_rate_ci_lo"), r.get("pos_rate_ci_hi"), False),
        ):
            if a is not None and b is not None:
                whiskers += [
                    ((a + f * (b - a), y) if horizontal else (x, a + f * (b - a))) for f in (0.0, 0.25, 0.5, 0.75, 1.0)
                ]
    _place_labels(fig, ax, [(r["prior_pos_rate"], r["pos_rate"], r["label"]) for r in pts], whiskers)
    _save(fig, path, dpi, files)
    plt.close(fig)
    return path


FACTOR_PANELS = (
    ("pos_rate", "Positive rate (higher is better)", "sensitivity_pos_rate"),
    ("grounded_pos_rate", "Grounded positive rate (0.5: the image decides nothing)", "grounded_pos_rate"),
)


def plot_factors(rows, path, factors=None, title_note="", dpi=150, files=None):
    """What predicts robustness (LGIP_SPEC.md 12): each model's positive rate (left) and grounded positive
    rate (right, when the evaluations wrote it) against its parameter count (log scale), 95% whiskers on
    the rates, one colour per training data (its card's; "unknown" grey), each point labelled, Spearman's
    rho of the panel's figure with log10 parameters in its title (from `factors`); None when fewer than
    two models have both a parameter count and a positive rate."""
    panels = []
    again = {m["model"] for m in (factors or {}).get("models", []) if m.get("same_weights_as")}
    rows = [r for r in rows if r["model"] not in again]  # (one set of weights is one model: its first row)
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
            _point(
                ax,
                r["_card"]["params_total"],
                r[key],
                None,
                _err(r[key], r.get(key + "_ci_lo"), r.get(key + "_ci_hi")),
                "o",
                c,
            )
        ax.set_xlabel("Parameters (image + text towers; log scale)")
        ax.set_ylabel(label)
        stat = ((factors or {}).get("numeric") or {}).get("log10_params_total", {}).get(outcome)
        n = stat["n"] if stat else len(pts)
        if stat is None or stat["rho"] is None:
            why = "fewer than 4" if n < 4 else "a constant side"
            where = f"Spearman ρ undefined ({n} model{'s' if n != 1 else ''}: {why})"
        else:
            ci = stat["rho_ci95"]
            where = (
                f"Spearman ρ = {stat['rho']:.2f}"
                + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")
                + f" ({stat['n']} models)"
            )
        ax.set_title(
            f"{'Positive rate' if key == 'pos_rate' else 'Grounded positive rate'} vs. size\n{where}", fontsize=11.5
        )
    fig.suptitle(
        "What predicts robustness: size and training data" + (f"\n{title_note}" if title_note else ""), fontsize=13
    )
    handles = [
        Line2D(
            [],
            [],
            color=colors[d],
            marker="o",
            linestyle="none",
            markersize=8,
            label="unknown training data" if d is None else d,
        )
        for d in data
    ]
    axes[0][-1].legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        frameon=False,
        fontsize=9.5,
        title="training data",
        title_fontsize=9.5,
    )
    fig.tight_layout()
    for ax, (key, _, _, pts) in zip(axes[0], panels):
        _place_labels(fig, ax, [(r["_card"]["params_total"], r[key], r["label"]) for r in pts], leader=True)
    _save(fig, path, dpi, files)
    plt.close(fig)
    return path
