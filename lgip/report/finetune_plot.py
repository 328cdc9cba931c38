"""lgip.report.finetune_plot: the figure of the section "Fine-tuning" (LGIP_SPEC.md 14), drawn as
lgip.report.plots draws its own (matplotlib, Agg, a PNG file): each fine-tuned arm's loss curves from its
train_log.jsonl (lgip.report.finetune_text.load_finetune), a small panel per term (the total loss L, then
L_clip, L_sc, L_inv, L_vc: those some arm logged), one colour per arm (its colour in the report's other
figures). Returns its path, or None when no arm logged a step.

    >>> plot_finetune(fine, "x__LGIP_finetune.png", [r["model"] for r in rows], "x")
    'x__LGIP_finetune.png'
"""

import math

from .finetune_text import TERMS
from .plots import _model_colors, _pyplot, _save

PANELS = {
    "loss": "Total loss L",
    "loss_clip": "L_clip (contrastive)",
    "loss_sc": "L_sc (flips as hard negatives)",
    "loss_inv": "L_inv (paraphrase invariance)",
    "loss_vc": "L_vc (mixed images as hard negatives)",
}


SMOOTH_FROM = 50  # steps: a longer log is drawn as its moving average over about 1/25 of its steps, raw faint


def moving_average(steps, values, window):
    """(steps, means) of `values` over `window` consecutive steps, each mean at its window's last step.

    >>> moving_average([0, 1, 2, 3], [1.0, 3.0, 5.0, 7.0], 2)
    ([1, 2, 3], [2.0, 4.0, 6.0])
    """
    means = [sum(values[i - window + 1 : i + 1]) / window for i in range(window - 1, len(values))]
    return list(steps[window - 1 :]), means


def plot_finetune(fine, path, tags, title_note="", dpi=150, files=None):
    """Each arm's loss terms against the step, a panel per term that some arm logged (a term of weight 0 is
    logged null: no line); `tags`: the report's models, in the order that gives each its colour. A diverged
    (non-finite) value leaves a gap."""
    if fine is None:
        return None
    arms = [a for a in fine["arms"] if a["log"]]
    terms = [t for t in TERMS if any(x[t] is not None for a in arms for x in a["log"])]
    if not arms or not terms:
        return None
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    colors = _model_colors(list(tags))
    ncol = 2 if len(terms) == 4 else min(len(terms), 3)
    nrow = -(-len(terms) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.6 * ncol, 3.4 * nrow + 1.0), squeeze=False)
    for ax, term in zip(axes.flat, terms):
        for a in arms:
            pts = [
                (x["step"], x[term] if math.isfinite(x[term]) else math.nan) for x in a["log"] if x[term] is not None
            ]
            if not pts:
                continue
            steps, values = (list(v) for v in zip(*pts))
            w, color = a["meta"]["weights"], colors.get(a["model"], "0.3")
            label = f"{a['model']} (W_SC {w['W_SC']:g}, W_INV {w['W_INV']:g}, W_VC {w['W_VC']:g})"
            if len(steps) > SMOOTH_FROM:  # (a long run: the raw values faint, their moving average drawn)
                ax.plot(steps, values, color=color, linewidth=0.7, alpha=0.3)
                steps, values = moving_average(steps, values, max(2, len(steps) // 25))
            marker = "o" if len(steps) < 20 else None
            ax.plot(steps, values, color=color, linewidth=1.6, label=label, marker=marker, markersize=3.5)
        ax.set_title(PANELS[term], fontsize=11)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3, linewidth=0.8)
    for ax in list(axes.flat)[len(terms) :]:
        ax.axis("off")
    for row in axes:
        row[0].set_ylabel("loss (unweighted)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.suptitle(
        "Training losses of each arm, on the train images (the result is the held-out figures)"
        + (f"\n{title_note}" if title_note else ""),
        fontsize=12,
    )
    legend_rows = -(-len(handles) // 2)
    fig.tight_layout(rect=(0, (0.2 + 0.22 * legend_rows) / fig.get_figheight(), 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=min(len(handles), 2), frameon=False, fontsize=9)
    _save(fig, path, dpi, files)
    plt.close(fig)
    return path
