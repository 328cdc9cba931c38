"""lgip.classification.rows: one model's class scores over DATASETS made into its row's figures (LGIP_SPEC.md 16:
`temperature`, `datasets`, `ood`, `cue_conflict`), its JSONL lines, and what the paired comparisons of the run's
models need of it; the comparisons themselves once every model is done.

    >>> made = model_figures(sets, scored, settings)        # scored: {set name: (z, cos, failed)} in dataset order
    >>> made.figures["datasets"]["imagenet"]["acc1"], made.lines[0]
    >>> comparisons([("a", made_a.kept), ("b", made_b.kept)], sets, settings)   # {"a": [{a, b, dataset, ...}]}
"""

from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from . import figures as F


@dataclass
class Made:
    figures: dict  # temperature, datasets, ood, cue_conflict
    lines: list  # the JSONL's lines, DATASETS order, each set's images in its own order
    kept: dict  # {set name: per-image arrays the comparisons need}


def _readable(n, failed):
    return np.array([j for j in range(n) if j not in failed], dtype=np.int64)


def model_figures(sets, scored, settings):
    """A model's figures and lines (module docstring). scored: {set name: (z [n, C] float64 with NaN rows where the
    image was not read, cos or None, {index: why not read})}; settings: OOD_SCORE, SPLIT_SEED, BOOTSTRAP,
    BOOTSTRAP_SEED. T* is fitted on the id set's calibration half (no id set: T* = 1, temperature None)."""
    kind, resamples, seed = settings["OOD_SCORE"], settings["BOOTSTRAP"], settings["BOOTSTRAP_SEED"]
    idset = next((s for s in sets if s.role == "id"), None)
    t, halves = 1.0, None
    if idset is not None:
        z, _, failed = scored[idset.name]
        ok = _readable(len(idset.images), failed)
        if len(ok) < 2:
            raise InputError(
                f"DATASETS: the 'id' set {idset.name!r} has {len(ok)} readable image of {len(idset.images)}: its "
                f"temperature needs at least 2 (fitted on one half, judged on the other); see the unreadable images"
            )
        halves = F.split_halves([idset.split_keys[j] for j in ok], settings["SPLIT_SEED"])
        y = np.asarray([idset.labels[j] for j in ok])
        t = F.fit_temperature(z[ok][halves[0]], y[halves[0]])
        cos = scored[idset.name][1]
        s_id = (ok, F.ood_score(kind, z[ok], t, cos[ok] if cos is not None else None))  # (all of I's images)
    out = {"temperature": t if idset is not None else None, "datasets": {}, "ood": {}, "cue_conflict": {}}
    lines, kept = [], {}
    for s in sets:
        z, cos, failed = scored[s.name]
        ok = _readable(len(s.images), failed)
        block = {"role": s.role, "source": s.source, "num_classes": len(s.classes), "n": int(len(ok))}
        listed = [s.shown[j] if s.unreadable_as == "path" and s.shown[j] is not None else j for j in sorted(failed)]
        unread = {"n_unreadable": len(failed), "unreadable": listed}
        zs = z[ok]
        score = F.ood_score(kind, zs, t, cos[ok] if cos is not None else None) if s.role in ("id", "ood") else None
        if s.role == "ood":
            out["datasets"][s.name] = {**block, **unread}
            lines += _lines(s, ok, zs, None, None, score)
            kept[s.name] = {"index": ok, "S": score, "S_id": s_id}
            out["ood"][s.name] = {"ood_score": kind, **F.ood_figures(s_id[1], score, resamples, seed)}
            continue
        y = np.asarray([s.labels[j] for j in ok], dtype=np.int64)
        pred = F.predictions(zs) if len(ok) else np.zeros(0, dtype=np.int64)
        if s.role == "cue_conflict":
            shape = np.asarray([s.shape_labels[j] for j in ok], dtype=np.int64)
            texture = np.asarray([s.texture_labels[j] for j in ok], dtype=np.int64)
            keep = shape != texture
            ok, zs, y, shape, texture = ok[keep], zs[keep], y[keep], shape[keep], texture[keep]
            block["n"] = int(len(ok))
            pred = F.category_predictions(F.probabilities(zs), s.categories) if s.categories else F.predictions(zs)
            bias = F.shape_bias(pred, shape, texture)
            out["cue_conflict"][s.name] = {**bias, "n": int(len(ok)), "dropped": int((~keep).sum())}
        if not len(ok):
            raise InputError(f"DATASETS: set {s.name!r} has no image to score (every one unreadable or dropped)")
        test = halves[1] if s.role == "id" else None
        if test is not None:
            block["n_test"] = int(len(test))
        figures = F.set_figures(zs, y, t, test=test, resamples=resamples, seed=seed)
        out["datasets"][s.name] = {**block, **unread, **figures}
        correct, _, conf = F.per_image(zs, y)
        _, _, conf_t = F.per_image(zs, y, t)
        if s.role == "id":
            out["datasets"][s.name]["reliability"] = {
                "t1": F.reliability(conf, correct),
                "t": F.reliability(conf_t[test], correct[test]),
            }
        is_test = np.zeros(len(ok), dtype=bool)
        is_test[test if test is not None else slice(None)] = True
        kept[s.name] = {"index": ok, "correct": correct, "conf_t": conf_t, "test": is_test, "S": score}
        lines += _lines(s, ok, zs, y, pred, score)
    return Made(out, lines, kept)


def _lines(s, ok, zs, y, pred, score):
    """The JSONL's lines of one set: {dataset, index, image, label, pred, p_label, top5, conf, ood_score}, p at T = 1
    (pred: a cue_conflict set's category when it has a category map; an "ood" set's over the id set's classes)."""
    p = F.probabilities(zs) if len(ok) else np.zeros((0, max(1, len(s.classes))))
    top = F.top_classes(zs, min(5, zs.shape[1])) if len(ok) else np.zeros((0, 0), dtype=np.int64)
    pred = F.predictions(zs) if pred is None else pred
    out = []
    for r, j in enumerate(ok.tolist()):
        label = int(y[r]) if y is not None else None
        out.append(
            {
                "dataset": s.name,
                "index": j,
                "image": s.shown[j],
                "label": label,
                "pred": int(pred[r]),
                "p_label": float(p[r, label]) if label is not None else None,
                "top5": [[int(c), float(p[r, c])] for c in top[r]],
                "conf": float(p[r].max()),
                "ood_score": float(score[r]) if score is not None else None,
            }
        )
    return out


def comparisons(models, sets, settings):
    """Section 9's paired comparisons of the run's models (LGIP_SPEC.md 16): for each pair a < b in MODELS order,
    every non-"ood" set's acc1 and ece_t (a cue_conflict set's over its kept images; the id set's ece_t over its
    test half) and each "ood" set's auroc, over the images both scored, the same resampled rows for both.
    models: [(name, Made.kept)]. Returns {a: [{a, b, dataset, figure, diff, diff_ci95}]}."""
    resamples, seed = settings["BOOTSTRAP"], settings["BOOTSTRAP_SEED"]
    out = {name: [] for name, _ in models}
    for ia, (a, ka) in enumerate(models):
        for b, kb in models[ia + 1 :]:
            for s in sets:
                if s.name not in ka or s.name not in kb:
                    continue
                xa, xb = ka[s.name], kb[s.name]
                if s.role == "ood":
                    i_a, i_b = _common(xa["S_id"][0], xb["S_id"][0])
                    o_a, o_b = _common(xa["index"], xb["index"])
                    values = ((xa["S_id"][1][i_a], xa["S"][o_a]), (xb["S_id"][1][i_b], xb["S"][o_b]))
                    found = [("auroc", *F.paired(*values, "auroc", resamples, seed))]
                else:
                    pa, pb = _common(xa["index"], xb["index"])
                    found = [("acc1", *F.paired(xa["correct"][pa], xb["correct"][pb], "acc1", resamples, seed))]
                    ta, tb = _common(xa["index"][xa["test"]], xb["index"][xb["test"]])
                    va = (xa["conf_t"][xa["test"]][ta], xa["correct"][xa["test"]][ta])
                    vb = (xb["conf_t"][xb["test"]][tb], xb["correct"][xb["test"]][tb])
                    found.append(("ece_t", *F.paired(va, vb, "ece_t", resamples, seed)))
                for figure, diff, ci in found:
                    out[a].append({"a": a, "b": b, "dataset": s.name, "figure": figure, "diff": diff, "diff_ci95": ci})
    return out


def _common(ia, ib):
    """Positions in ia and in ib of the dataset indices both hold, in dataset order."""
    both = np.intersect1d(ia, ib)
    return np.searchsorted(ia, both), np.searchsorted(ib, both)
