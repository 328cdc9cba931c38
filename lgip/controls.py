"""lgip.controls: is it the image? The text-prior controls of LGIP_SPEC.md section 9, the hard
positives of section 10 (SugarCrepe++'s ITT and TOT), and paired model comparisons, all from the
pairs an evaluation already scored.

- Text prior: a flip pair's gap g = v_r . (t_i - t_f) beside its prior gap b = m_r . (t_i - t_f),
  m_r the mean of the OTHER images (Pairs.prior_base / .prior, made by lgip.scorer.score_by_cosine from one sum
  of the run's image embeddings): `prior_figures` adds prior_gap_mean, grounded_gap_mean,
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
        for key, values in (("prior_gap_mean", prior), ("grounded_gap_mean", grounded),
                            ("prior_pos_rate", prior > 0), ("grounded_pos_rate", grounded > 0)):
            block[key] = mean_or_none(values)
            add_ci(block, key, rec, values, resamples, seed)
    if paras_too:
        if paras is None or not hasattr(paras, "prior") or not _usable(paras.prior):
            block.update({x: None for k in INVARIANCE_PRIOR_KEYS for x in (k, k + "_ci95")})
            return block
        shift, prior_shift = paras.sim - paras.base_sim, paras.prior - paras.prior_base
        rec = np.asarray(paras.rec)
        for key, values in (("invariance_error_prior_mean", np.abs(prior_shift)),
                            ("invariance_error_grounded_mean", np.abs(shift - prior_shift))):
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
    caption once, on the device of the text table."""
    from .device import cosines
    n_f = len(flips.rec)
    flips.has_para = np.zeros(n_f, dtype=bool)
    flips.robust = np.zeros(n_f, dtype=bool)
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
    row_of = lambda slots: rows[np.asarray(slots, dtype=np.int64)]  # noqa: E731
    f_slot, p_slot, c_slot = row_of(flips.slot), row_of(paras.slot), row_of(paras.base_slot)
    cap_para = cosines(txt_emb, txt_emb, c_slot[q_of], p_slot[q_of])   # cos(t_i, t_p)
    cap_flip = cosines(txt_emb, txt_emb, c_slot[q_of], f_slot[j_of])   # cos(t_i, t_f)
    para_flip = cosines(txt_emb, txt_emb, p_slot[q_of], f_slot[j_of])  # cos(t_p, t_f)
    text_ok = (cap_para > cap_flip) & (cap_para > para_flip)
    image_ok = paras.sim[q_of] > flips.sim[j_of]  # cos(v, t_p) > cos(v, t_f)
    first = np.cumsum(count) - count  # each flip's first (j, q) position, for those with a paraphrase
    has = count > 0
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
    for key, values in (("robust_pos_rate", flips.robust[has]), ("text_only_rate", flips.text_only[has])):
        block[key] = mean_or_none(values)
        add_ci(block, key, rec, values, resamples, seed)
    return block


class Comparisons:
    """Per model, the per-pair values of each compared figure (by image), for paired differences.
    >>> cmp.add(model, "grounded_pos_rate", "color", rec_of_each_pair, values_of_each_pair)"""

    def __init__(self):
        self.models, self.values = [], {}  # (model, figure, flip_type) -> (rec, values)

    def add(self, model, figure, flip_type, rec, values):
        if values is None:
            return
        if model not in self.models:
            self.models.append(model)
        self.values[(model, figure, flip_type)] = (np.asarray(rec, dtype=np.int64), np.asarray(values, dtype=np.float64))

    def rows(self, script, resamples, seed):
        """One dict per pair of models a < b (in the order they were added), figure and flip type
        both models have: {script, a, b, figure, flip_type, diff, diff_ci95, a_value, b_value,
        num_images, excludes_zero}. diff = X(a) - X(b) over all their pairs; diff_ci95: the 2.5 and
        97.5 percentiles of X(a) - X(b) over `resamples` resamples of the images with replacement
        (seed), the SAME drawn images for both models (bootstrap_draws, as every interval here)."""
        out = []
        keys = list(dict.fromkeys((figure, flip_type) for _, figure, flip_type in self.values))
        for ia, a in enumerate(self.models):
            for b in self.models[ia + 1:]:
                for figure, flip_type in keys:
                    if (a, figure, flip_type) in self.values and (b, figure, flip_type) in self.values:
                        out.append(dict(script=script, a=a, b=b, figure=figure, flip_type=flip_type,
                                        **self._paired(self.values[(a, figure, flip_type)],
                                                       self.values[(b, figure, flip_type)], resamples, seed)))
        return out

    @staticmethod
    def _paired(va, vb, resamples, seed):
        (ra, xa), (rb, xb) = va, vb
        if not len(xa) or not len(xb):
            return {"diff": None, "diff_ci95": None, "a_value": mean_or_none(xa), "b_value": mean_or_none(xb),
                    "num_images": 0, "excludes_zero": None}
        used = np.union1d(ra, rb)  # the images either model has pairs of: resampled together
        n = len(used)

        def sums(r, x):
            pos = np.searchsorted(used, r)
            return np.bincount(pos, weights=x, minlength=n), np.bincount(pos, minlength=n).astype(np.float64)
        (sa, ca), (sb, cb) = sums(ra, xa), sums(rb, xb)
        diff = float(sa.sum() / ca.sum() - sb.sum() / cb.sum())
        ci = None
        if resamples:
            draws = bootstrap_draws(n, resamples, seed)
            stats = []
            for start in range(0, resamples, 50):
                w = draws[start:start + 50].astype(np.float64)
                with np.errstate(invalid="ignore", divide="ignore"):
                    stats.append((w @ sa) / (w @ ca) - (w @ sb) / (w @ cb))
            stats = np.concatenate(stats)
            stats = stats[np.isfinite(stats)]  # (a resample that drew no pair of one model)
            if len(stats):
                lo, hi = np.quantile(stats, [0.025, 0.975])
                ci = [float(lo), float(hi)]
        return {"diff": diff, "diff_ci95": ci, "a_value": float(sa.sum() / ca.sum()), "b_value": float(sb.sum() / cb.sum()),
                "num_images": int(n), "excludes_zero": None if ci is None else bool(ci[0] > 0 or ci[1] < 0)}
