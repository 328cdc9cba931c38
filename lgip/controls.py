"""lgip.controls: is it the image? The text-prior controls of LGIP_SPEC.md section 9, the hard
positives of section 10 (SugarCrepe++'s ITT and TOT), and paired model comparisons, all from the
pairs an evaluation already scored.

- Text prior: a flip pair's gap g = v_r . (t_i - t_f) beside its prior gap b = m_r . (t_i - t_f),
  m_r the mean of the OTHER images (Pairs.prior_base / .prior, made by lgip.scorers.embeddings.score_by_cosine
  from one sum of the run's image embeddings): `prior_figures` adds prior_gap_mean, grounded_gap_mean,
  prior_pos_rate, grounded_pos_rate (and for paraphrase pairs invariance_error_prior_mean,
  invariance_error_grounded_mean), each with its interval over images.
- Hard positives: `mark_hard_positives` (on each process, before its pairs are gathered: it needs
  the text embeddings) marks each flip pair whose caption has a paraphrase, whether the image
  scores the caption and every paraphrase above the flip (robust) and whether the text tower
  alone puts every paraphrase nearer the caption than the flip (text_only); `hard_positive_figures`
  adds robust_pos_rate and text_only_rate.
- Paired comparisons: `Comparisons` keeps, per model, each compared figure's per-pair values by
  image; `rows` gives for each pair of models a < b (MODELS order) the difference and its interval
  from the SAME resampled images for both models.

    >>> prior_figures(m, flips, paras, 1000, 0)      # m["prior_pos_rate"], m["grounded_pos_rate"], ...
    >>> hard_positive_figures(m, flips, 1000, 0)     # m["robust_pos_rate"], m["text_only_rate"]
    >>> cmp = Comparisons(); cmp.add("a", "sensitivity_pos_rate", None, flips.rec, gaps > 0)
    >>> cmp.rows("run_lgip_multi.py", 1000, 0)[0]
    {'script': 'run_lgip_multi.py', 'a': 'a', 'b': 'b', 'figure': 'sensitivity_pos_rate', 'flip_type': None,
     'diff': 0.021, 'diff_ci95': [0.004, 0.038], ...}
"""

import numpy as np

from .scoring import add_ci, bootstrap_draws, mean_or_none

PRIOR_KEYS = ("prior_gap_mean", "grounded_gap_mean", "prior_pos_rate", "grounded_pos_rate")
INVARIANCE_PRIOR_KEYS = ("invariance_error_prior_mean", "invariance_error_grounded_mean")
HARD_POSITIVE_KEYS = ("robust_pos_rate", "text_only_rate")
COMPARED = ("sensitivity_pos_rate", "grounded_pos_rate", "invariance_error_mean")  # section 9's paired figures


def _usable(values):
    return values is not None and len(values) and not np.isnan(values).any()


def prior_values(flips):
    """(prior gap b, grounded gap g - b) of each flip pair; None when the run had fewer than 2 images."""
    if not hasattr(flips, "prior") or not _usable(flips.prior):
        return None, None
    gap = flips.base_sim - flips.sim
    prior = flips.prior_base - flips.prior
    return prior, gap - prior


def prior_figures(block, flips, paras, resamples, seed, paras_too=True):
    """Section 9's figures of these flip pairs (and paraphrase pairs) added to `block`, each with its
    `*_ci95` over images; None where there are no pairs or fewer than 2 images."""
    prior, grounded = prior_values(flips)
    if prior is None:  # (the same keys as with figures, each interval right after its figure)
        block.update({x: None for k in PRIOR_KEYS for x in (k, k + "_ci95")})
    else:
        rec = np.asarray(flips.rec)
        for key, values in (
            ("prior_gap_mean", prior),
            ("grounded_gap_mean", grounded),
            ("prior_pos_rate", prior > 0),
            ("grounded_pos_rate", grounded > 0),
        ):
            block[key] = mean_or_none(values)
            add_ci(block, key, rec, values, resamples, seed)
    if paras_too:
        if paras is None or not hasattr(paras, "prior") or not _usable(paras.prior):
            block.update({x: None for k in INVARIANCE_PRIOR_KEYS for x in (k, k + "_ci95")})
            return block
        shift, prior_shift = paras.sim - paras.base_sim, paras.prior - paras.prior_base
        rec = np.asarray(paras.rec)
        for key, values in (
            ("invariance_error_prior_mean", np.abs(prior_shift)),
            ("invariance_error_grounded_mean", np.abs(shift - prior_shift)),
        ):
            block[key] = mean_or_none(values)
            add_ci(block, key, rec, values, resamples, seed)
    return block


def _groups(pairs):
    """Integer id of each pair's (record, caption)."""
    return np.asarray(pairs.rec, dtype=np.int64) * 1_000_003 + np.asarray(pairs.cap, dtype=np.int64)


def mark_hard_positives(flips, paras, txt_emb, rows):
    """Set flips.has_para (its caption has a paraphrase), flips.robust (the image scores the caption
    and every paraphrase p of it strictly above the flip f) and flips.text_only (for every p:
    cos(t_i, t_p) > cos(t_i, t_f) and cos(t_i, t_p) > cos(t_p, t_f)), LGIP_SPEC.md section 10. Both
    Pairs are scored (base_sim, sim); the text cosines are computed here, for each (p, f) of a
    caption once, on the device of the text table. txt_emb None (a joint scorer, section 13: no text
    embeddings): text_only is not set, and text_only_rate is None."""
    from .device import cosines

    n_f = len(flips.rec)
    flips.has_para = np.zeros(n_f, dtype=bool)
    flips.robust = np.zeros(n_f, dtype=bool)
    if txt_emb is not None:
        flips.text_only = np.zeros(n_f, dtype=bool)
    if not n_f or not len(paras.rec):
        return flips
    gf, gp = _groups(flips), _groups(paras)
    order_p = np.argsort(gp, kind="stable")
    sorted_gp = gp[order_p]
    start = np.searchsorted(sorted_gp, gf, side="left")
    count = np.searchsorted(sorted_gp, gf, side="right") - start
    flips.has_para = count > 0
    # every (flip j, paraphrase q) of a caption, flips in order: j repeated count[j] times
    j_of = np.repeat(np.arange(n_f), count)
    offsets = np.arange(len(j_of)) - np.repeat(np.cumsum(count) - count, count)
    q_of = order_p[np.repeat(start, count) + offsets]
    if not len(j_of):
        return flips
    image_ok = paras.sim[q_of] > flips.sim[j_of]  # cos(v, t_p) > cos(v, t_f)
    first = np.cumsum(count) - count  # each flip's first (j, q) position, for those with a paraphrase
    has = count > 0
    if txt_emb is not None:
        row_of = lambda slots: rows[np.asarray(slots, dtype=np.int64)]
        f_slot, p_slot, c_slot = row_of(flips.slot), row_of(paras.slot), row_of(paras.base_slot)
        cap_para = cosines(txt_emb, txt_emb, c_slot[q_of], p_slot[q_of])  # cos(t_i, t_p)
        cap_flip = cosines(txt_emb, txt_emb, c_slot[q_of], f_slot[j_of])  # cos(t_i, t_f)
        para_flip = cosines(txt_emb, txt_emb, p_slot[q_of], f_slot[j_of])  # cos(t_p, t_f)
        text_ok = (cap_para > cap_flip) & (cap_para > para_flip)
        flips.text_only[has] = np.logical_and.reduceat(text_ok, first[has])
    flips.robust[has] = np.logical_and.reduceat(image_ok, first[has]) & (flips.base_sim[has] > flips.sim[has])
    return flips


def hard_positive_figures(block, flips, resamples, seed):
    """robust_pos_rate and text_only_rate (with intervals over images) over the flip pairs whose
    caption has a paraphrase; None where none has (or the pairs were not marked)."""
    has = getattr(flips, "has_para", None)
    if has is None or not has.any():
        block.update({k: None for k in HARD_POSITIVE_KEYS})
        return block
    rec = np.asarray(flips.rec)[has]
    text_only = getattr(flips, "text_only", None)  # (None: a joint scorer's, which has no text embeddings)
    for key, values in (
        ("robust_pos_rate", flips.robust[has]),
        ("text_only_rate", None if text_only is None else text_only[has]),
    ):
        if values is None:
            block[key], block[key + "_ci95"] = None, None
            continue
        block[key] = mean_or_none(values)
        add_ci(block, key, rec, values, resamples, seed)
    return block


def relative_terms(parts):
    """(record of each term, |s(v_r, t_i) - s(v_r, c)|) from a Scored's `relative` parts (LGIP_SPEC.md 13:
    each readable record r's caption i with its own image, and caption (i mod n') of the record before r
    with r's image), joined by (r, i); None when they were not computed."""
    if parts is None:
        return None
    own, other = {}, {}
    for r, i, kind, value in parts:
        (own if kind == "own" else other)[(r, i)] = value
    keys = sorted(k for k in own if k in other)
    return (
        np.array([r for r, _ in keys], dtype=np.int64),
        np.array([abs(own[k] - other[k]) for k in keys], dtype=np.float64),
    )


def relative_figures(block, key, rec, errors, terms, resamples, seed):
    """block[key] = mean(errors) / mean(terms' values): LGIP_SPEC.md 13's invariance_error_rel (how far a
    paraphrase moves the score, in units of how far another image's caption moves it), and key + "_ci95"
    from the same resampled images for both means. None with no paraphrase pair, no terms (N < 2, or
    not computed) or a denominator of 0."""
    errors = np.asarray(errors, dtype=np.float64)
    value = None
    if terms is not None and len(errors) and len(terms[1]) and terms[1].mean() > 0:
        value = float(errors.mean() / terms[1].mean())
    block[key] = value
    block[key + "_ci95"] = (
        ratio_ci(rec, errors, terms[0], terms[1], resamples, seed) if value is not None and resamples else None
    )
    return block


def ratio_ci(rec_a, a, rec_b, b, resamples, seed, level=0.95):
    """Percentile interval of mean(a) / mean(b), both means recomputed over the pairs of the SAME
    resampled images (the union of both sets' records, drawn with replacement)."""
    rec_a, rec_b = np.asarray(rec_a, dtype=np.int64), np.asarray(rec_b, dtype=np.int64)
    used = np.union1d(rec_a, rec_b)
    draws = bootstrap_draws(len(used), resamples, seed)

    def sums(r, x):
        pos = np.searchsorted(used, r)
        return (
            np.bincount(pos, weights=x, minlength=len(used)),
            np.bincount(pos, minlength=len(used)).astype(np.float64),
        )

    (sa, ca), (sb, cb) = sums(rec_a, a), sums(rec_b, b)
    stats = []
    for start in range(0, resamples, 50):
        w = draws[start : start + 50].astype(np.float64)
        num, den = (w @ sa) / np.maximum(w @ ca, 1e-300), (w @ sb) / np.maximum(w @ cb, 1e-300)
        stats.append(np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan))
    stats = np.concatenate(stats)
    stats = stats[np.isfinite(stats)]
    if not len(stats):
        return None
    lo, hi = np.quantile(stats, [(1.0 - level) / 2, 1.0 - (1.0 - level) / 2])
    return [float(lo), float(hi)]


class Comparisons:
    """Per model, the per-pair values of each compared figure (by image), for paired differences.
    A figure in a score's units (invariance_error_mean) is compared only between models of one
    score_kind (LGIP_SPEC.md 13); a ratio (invariance_error_rel: `denominator`) across kinds.
    >>> cmp.add(model, "grounded_pos_rate", "color", rec_of_each_pair, values_of_each_pair)"""

    IN_UNITS = ("invariance_error_mean",)  # figures in the score's units

    def __init__(self):
        self.models, self.values, self.kinds = [], {}, {}  # (model, figure, flip_type) -> [(rec, values), ...]

    def add(self, model, figure, flip_type, rec, values, denominator=None, score_kind=None):
        """denominator: (rec, values) whose mean divides the figure's (a ratio of two means)."""
        if values is None or (denominator is not None and denominator[0] is None):
            return
        if model not in self.models:
            self.models.append(model)
        self.kinds.setdefault(model, score_kind)
        parts = [(rec, values)] + ([denominator] if denominator is not None else [])
        self.values[(model, figure, flip_type)] = [
            (np.asarray(r, dtype=np.int64), np.asarray(v, dtype=np.float64)) for r, v in parts
        ]

    def rows(self, script, resamples, seed):
        """One dict per pair of models a < b (in the order they were added), figure and flip type
        both models have: {script, a, b, figure, flip_type, diff, diff_ci95, a_value, b_value,
        num_images, excludes_zero}. diff = X(a) - X(b) over all their pairs; diff_ci95: the 2.5 and
        97.5 percentiles of X(a) - X(b) over `resamples` resamples of the images with replacement
        (seed), the SAME drawn images for both models (bootstrap_draws, as every interval here)."""
        out = []
        keys = list(dict.fromkeys((figure, flip_type) for _, figure, flip_type in self.values))
        for ia, a in enumerate(self.models):
            for b in self.models[ia + 1 :]:
                for figure, flip_type in keys:
                    if figure in self.IN_UNITS and self.kinds.get(a) != self.kinds.get(b):
                        continue  # (a logprob and a cosine are not in one unit)
                    if (a, figure, flip_type) in self.values and (b, figure, flip_type) in self.values:
                        out.append(
                            dict(
                                script=script,
                                a=a,
                                b=b,
                                figure=figure,
                                flip_type=flip_type,
                                **self._paired(
                                    self.values[(a, figure, flip_type)],
                                    self.values[(b, figure, flip_type)],
                                    resamples,
                                    seed,
                                ),
                            )
                        )
        return out

    @staticmethod
    def _paired(va, vb, resamples, seed):
        if any(not len(x) for _, x in va + vb):
            return {
                "diff": None,
                "diff_ci95": None,
                "a_value": None,
                "b_value": None,
                "num_images": 0,
                "excludes_zero": None,
            }
        used = np.unique(np.concatenate([r for r, _ in va + vb]))  # the images either model has pairs of
        n = len(used)

        def sums(r, x):
            pos = np.searchsorted(used, r)
            return np.bincount(pos, weights=x, minlength=n), np.bincount(pos, minlength=n).astype(np.float64)

        sa, sb = [sums(r, x) for r, x in va], [sums(r, x) for r, x in vb]

        def figure(parts, w=None):  # a mean, or a ratio of two means, over the pairs of the drawn images w (None: all)
            means = [(s.sum() / c.sum()) if w is None else (w @ s) / (w @ c) for s, c in parts]
            return means[0] if len(means) == 1 else means[0] / means[1]

        with np.errstate(invalid="ignore", divide="ignore"):
            a_value, b_value = float(figure(sa)), float(figure(sb))
        if not (np.isfinite(a_value) and np.isfinite(b_value)):
            return {
                "diff": None,
                "diff_ci95": None,
                "a_value": None,
                "b_value": None,
                "num_images": int(n),
                "excludes_zero": None,
            }
        ci = None
        if resamples:
            draws = bootstrap_draws(n, resamples, seed)
            stats = []
            for start in range(0, resamples, 50):
                w = draws[start : start + 50].astype(np.float64)
                with np.errstate(invalid="ignore", divide="ignore"):
                    stats.append(figure(sa, w) - figure(sb, w))
            stats = np.concatenate(stats)
            stats = stats[np.isfinite(stats)]  # (a resample that drew no pair of one model)
            if len(stats):
                lo, hi = np.quantile(stats, [0.025, 0.975])
                ci = [float(lo), float(hi)]
        return {
            "diff": a_value - b_value,
            "diff_ci95": ci,
            "a_value": a_value,
            "b_value": b_value,
            "num_images": int(n),
            "excludes_zero": None if ci is None else bool(ci[0] > 0 or ci[1] < 0),
        }
