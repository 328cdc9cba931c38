"""lgip.report.classification_plot: the figures of the section "Classification" (LGIP_SPEC.md 16), drawn as
lgip.report.plots draws its own (matplotlib, Agg, a PNG file, each model its colour of the report's other figures):
the id set's reliability diagram (accuracy against confidence per ECE bin, a panel per model, at T = 1 from each
per-image file's `conf` and at T* from its `ood_score` where that is the msp at T*), the effective-robustness
scatter of each shift set (probit axes, the fit), and with fine-tuned arms the trade-off plot (the id set's
accuracy against the held-out positive rate, one point per model with both intervals, each arm joined to its start
through its WiSE-FT points in alpha order). Each returns its path, or None when it has nothing to draw.

    >>> plot_reliability(found, "x__LGIP_classification_reliability.png", tags, "x")
"""

import math

from .classification_text import id_set, reliability_bins
from .plots import _err, _model_colors, _place_labels, _point, _pyplot, _save, rate_limits


def plot_reliability(found, path, tags, title_note="", dpi=150, files=None, labels=None):
    """Each model's reliability diagram on its id set, a panel per model: the accuracy of each non-empty bin
    against its mean confidence at T = 1 (solid) and at T* (dashed, where the file holds it), the diagonal of a
    calibrated model; each bin's marker sized by its images."""
    if found is None:
        return None
    labels = labels or {}
    rows = [r for r in found["rows"] if len(found["reliability"].get(r["model"], {}).get("conf", ())) and id_set(r)]
    if not rows:
        return None
    plt = _pyplot()
    colors = _model_colors(list(tags))
    ncol = min(len(rows), 3)
    nrow = -(-len(rows) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.4 * ncol, 4.4 * nrow + 0.9), squeeze=False)
    for ax, r in zip(axes.flat, rows):
        got, color = found["reliability"][r["model"]], colors.get(r["model"], "0.3")
        n = len(got["conf"])
        ax.plot([0, 1], [0, 1], color="0.6", linestyle=":", linewidth=1)
        curves = [("T = 1", got["conf"], "-", "o")]
        if got["conf_t"] is not None:
            t = r["temperature"]
            curves.append((f"T* = {t:.2f}" if t is not None else "T*", got["conf_t"], "--", "s"))
        for label, conf, style, marker in curves:
            counts, mean_conf, acc, ece = reliability_bins(conf, got["correct"])
            full = counts > 0
            ax.plot(
                mean_conf[full], acc[full], linestyle=style, color=color, linewidth=1.6, label=f"{label}: ECE {ece:.3f}"
            )
            sizes = 12 + 120 * counts[full] / max(n, 1)
            ax.scatter(mean_conf[full], acc[full], s=sizes, marker=marker, color=color, edgecolor="white", zorder=3)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_aspect("equal")
        ax.grid(True, alpha=0.3, linewidth=0.8)
        ax.set_title(f"{labels.get(r['model'], r['model'])}\n{id_set(r)}, {n} images", fontsize=10.5)
        ax.set_xlabel("confidence (mean of the bin)")
        ax.legend(loc="upper left", fontsize=8.5, frameon=True, framealpha=0.9)
    for ax in list(axes.flat)[len(rows) :]:
        ax.axis("off")
    for row in axes:
        row[0].set_ylabel("accuracy")
    fig.suptitle(
        "Reliability on the id set: accuracy against confidence, 15 bins (on the diagonal: calibrated)"
        + (f"\n{title_note}" if title_note else ""),
        fontsize=12,
    )
    fig.tight_layout(h_pad=2.2)
    _save(fig, path, dpi, files)
    plt.close(fig)
    return path


PROBIT_TICKS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99)


def plot_er(found, er, path, tags, title_note="", dpi=150, files=None, labels=None):
    """Each shift set with a fit (at least 3 models): its accuracy against the id set's on probit axes (ticks
    labelled in accuracy), the fit, the diagonal; a model above the fit is effectively robust."""
    from scipy.stats import norm

    fits = [(name, fit) for name, fit in (er or {}).items() if fit]
    if not fits:
        return None
    labels = labels or {}
    plt = _pyplot()
    colors = _model_colors(list(tags))
    by = {r["model"]: r for r in found["rows"]}
    fig, axes = plt.subplots(1, len(fits), figsize=(max(6.4 * len(fits), 7.2), 6.0), squeeze=False)
    panels = []
    for ax, (name, fit) in zip(axes[0], fits):
        pts = []
        panels.append(pts)
        for tag in fit["models"]:
            r = by[tag]
            i, d = r["datasets"][id_set(r)], r["datasets"][name]
            x = norm.ppf(min(max(i["acc1"], 0.5 / i["n"]), 1 - 0.5 / i["n"]))
            y = norm.ppf(min(max(d["acc1"], 0.5 / d["n"]), 1 - 0.5 / d["n"]))
            pts.append((x, y, labels.get(tag, tag)))
            _point(ax, x, y, None, None, "o", colors.get(tag, "0.3"))
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        span = max(max(xs + ys) - min(xs + ys), 0.5)
        lo, hi = min(xs + ys) - 0.15 * span, max(xs + ys) + 0.15 * span
        ax.plot([lo, hi], [lo, hi], color="0.6", linestyle=":", linewidth=1, label="y = x")
        ax.plot(
            [lo, hi],
            [fit["slope"] * lo + fit["intercept"], fit["slope"] * hi + fit["intercept"]],
            color="0.25",
            linewidth=1.4,
            label=f"fit: slope {fit['slope']:.2f}, intercept {fit['intercept']:+.2f}",
        )
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ticks = [t for t in PROBIT_TICKS if lo <= norm.ppf(t) <= hi]
        ax.set_xticks([norm.ppf(t) for t in ticks], [f"{t:g}" for t in ticks])
        ax.set_yticks([norm.ppf(t) for t in ticks], [f"{t:g}" for t in ticks])
        ax.grid(True, alpha=0.3, linewidth=0.8)
        ax.set_xlabel("accuracy on the id set (probit scale)")
        ax.set_ylabel(f"accuracy on {name} (probit scale)")
        ax.set_title(f"Effective robustness on {name}", fontsize=11.5)
        ax.legend(loc="best", fontsize=9)
    fig.suptitle(
        "Effective robustness: accuracy under shift against in-distribution\n(a model above the fit is "
        "effectively robust)" + (f"\n{title_note}" if title_note else ""),
        fontsize=12,
    )
    fig.tight_layout()
    for ax, pts in zip(axes[0], panels):
        _place_labels(fig, ax, pts)
    _save(fig, path, dpi, files)
    plt.close(fig)
    return path


def tradeoff_points(found, rows, fine):
    """[{model, label, x, x_lo, x_hi, y, y_lo, y_hi}] of the models with the id set's acc1 (run_lgip_classification)
    and run_lgip_by_fliptype's positive rate on the same held-out file (the report's rows), and the lines
    [[tags]] joining each arm's start, its WiSE-FT points in alpha order and the arm."""
    if found is None or fine is None:
        return [], []
    by = {r["model"]: r for r in rows}
    pts = []
    for r in found["rows"]:
        ident, row = id_set(r), by.get(r["model"])
        if ident is None or row is None or row.get("fliptypes_pos_rate") is None:
            continue
        d = r["datasets"][ident]
        if d["acc1"] is None:
            continue
        pts.append(
            {
                "model": r["model"],
                "label": row.get("label", r["model"]),
                "x": d["acc1"],
                "x_lo": d["acc1_ci_lo"],
                "x_hi": d["acc1_ci_hi"],
                "y": row["fliptypes_pos_rate"],
                "y_lo": row.get("fliptypes_pos_rate_ci_lo"),
                "y_hi": row.get("fliptypes_pos_rate_ci_hi"),
            }
        )
    have = {p["model"] for p in pts}
    lines = []
    for a in fine["arms"]:
        mixed = sorted((p for p in fine.get("points", []) if p["arm"] == a["model"]), key=lambda p: p["alpha"])
        line = [t for t in [a["start"]] + [p["model"] for p in mixed] + [a["model"]] if t in have]
        if len(line) > 1:
            lines.append(line)
    return pts, lines


def plot_tradeoff(found, rows, fine, path, tags, title_note="", dpi=150, files=None):
    """The trade-off of fine-tuning (section 16): x the id set's acc1, y the held-out positive rate, each with its
    95% interval, a point per model; each arm's line from its start through its WiSE-FT points to the arm. None
    without fine-tuned arms or without a model that has both figures."""
    pts, lines = tradeoff_points(found, rows, fine)
    if not pts:
        return None
    plt = _pyplot()
    colors = _model_colors(list(tags))
    at = {p["model"]: p for p in pts}
    starts = set(fine["starts"])
    fig, ax = plt.subplots(figsize=(7.6, 6.0))
    for line in lines:
        arm = line[-1]
        ax.plot(
            [at[t]["x"] for t in line],
            [at[t]["y"] for t in line],
            color=colors.get(arm, "0.4"),
            linewidth=1.3,
            alpha=0.7,
            zorder=2,
        )
    for p in pts:
        marker = "*" if p["model"] in starts else "D" if any(p["model"] == a["model"] for a in fine["arms"]) else "o"
        _point(
            ax,
            p["x"],
            p["y"],
            _err(p["x"], p["x_lo"], p["x_hi"]),
            _err(p["y"], p["y_lo"], p["y_hi"]),
            marker,
            colors.get(p["model"], "0.3"),
        )
        if marker == "*":  # (a star of the errorbar's size reads as a dot: the start drawn larger)
            ax.plot(
                p["x"],
                p["y"],
                "*",
                markersize=17,
                color=colors.get(p["model"], "0.3"),
                markeredgecolor="white",
                zorder=4,
                clip_on=False,
            )
    xs = [v for p in pts for v in (p["x"], p["x_lo"], p["x_hi"]) if v is not None]
    ys = [v for p in pts for v in (p["y"], p["y_lo"], p["y_hi"]) if v is not None]
    ax.set_xlim(*rate_limits(xs, max((max(xs) - min(xs)) * 0.18, 0.02)))
    ax.set_ylim(*rate_limits(ys, max((max(ys) - min(ys)) * 0.18, 0.02)))
    ax.grid(True, alpha=0.3, linewidth=0.8)
    ident = next((id_set(r) for r in found["rows"] if id_set(r)), "the id set")
    ax.set_xlabel(f"zero-shot accuracy on {ident} (acc@1; right: kept recognition)")
    ax.set_ylabel("LGIP positive rate on the held-out images (up: repaired)")
    ax.set_title(
        "What fine-tuning gained (up) against what it cost (left)\nthe start ★, each arm ◆ and its WiSE-FT points ●, "
        "joined from the start to the arm" + (f"\n{title_note}" if title_note else ""),
        fontsize=10.5,
    )
    fig.tight_layout()
    obstacles = [(p["x"], y) for p in pts for y in (p["y_lo"], p["y_hi"]) if y is not None and math.isfinite(y)]
    _place_labels(fig, ax, [(p["x"], p["y"], p["label"]) for p in pts], obstacles)
    _save(fig, path, dpi, files)
    plt.close(fig)
    return path
