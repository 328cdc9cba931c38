"""lgip.classification.figures: LGIP_SPEC.md 16's figures as pure functions of class scores z [n, C] (float64),
labels and settings, each docstring its formula. Where a well-kept library computes a figure it does: scikit-learn's
balanced_accuracy_score (mean per-class recall), roc_auc_score (AUROC), average_precision_score (AUPR-in); SciPy's
softmax, bounded scalar minimiser (the temperature) and normal quantiles (effective robustness). The bootstrap's
resamples are section 9's (lgip.scoring.bootstrap_draws: W = default_rng(seed).multinomial(n, 1/n, size=B)), each
row's figure computed on the images drawn with their multiplicities as weights.

    >>> t = fit_temperature(z[calibrate], y[calibrate]); figures = set_figures(z, y, t, test=test, resamples=1000)
    >>> ood_figures(s_in, s_out, resamples=1000, seed=0)["auroc"]
    >>> effective_robustness(rows)   # report.py's <N>__LGIP_classification_er.metrics.json
"""

import hashlib
import math

import numpy as np

from ..scoring import bootstrap_draws

N_BINS = 15  # ECE's equal-width confidence bins
EDGES = np.arange(N_BINS + 1) / N_BINS  # b / 15: bin b holds k in (b/15, (b+1)/15], k <= 1/15 in bin 0
T_BOUNDS = (math.log(0.01), math.log(100.0))  # u = ln T searched in [ln 0.01, ln 100]
OOD_SCORES = ("msp", "maxlogit", "mcm")


def log_probabilities(z, t=1.0):
    """log p(c | x) = log softmax(z / T)_c, float64 (scipy.special.log_softmax: no overflow at any scale)."""
    from scipy.special import log_softmax

    return log_softmax(np.asarray(z, dtype=np.float64) / t, axis=1)


def probabilities(z, t=1.0):
    """p(c | x) = softmax(z / T)_c, float64."""
    return np.exp(log_probabilities(z, t))


def predictions(z):
    """yhat = argmax_c z_c, ties to the lowest index (numpy.argmax)."""
    return np.argmax(np.asarray(z), axis=1)


def top_classes(z, k):
    """The k classes of largest z per image, largest first, ties to lower indices (a stable sort of -z)."""
    return np.argsort(-np.asarray(z), axis=1, kind="stable")[:, :k]


def ece_bins(conf):
    """The ECE bin of each top-1 confidence k: bin b = 0..14 holds k in (b/15, (b+1)/15], k <= 1/15 in bin 0
    (numpy.searchsorted on the edges b/15, side "left": a k exactly at an edge falls in the bin below it)."""
    return np.clip(np.searchsorted(EDGES, np.asarray(conf, dtype=np.float64), side="left") - 1, 0, N_BINS - 1)


def ece(conf, correct, weights=None):
    """ECE = sum over non-empty bins b of (|B_b| / n) |mean_{B_b} [yhat = y] - mean_{B_b} k| = sum_b |sum_{B_b}
    w ([yhat = y] - k)| / sum w (weights w: a resample's multiplicities; none: 1 each)."""
    conf, correct = np.asarray(conf, dtype=np.float64), np.asarray(correct, dtype=np.float64)
    w = np.ones(len(conf)) if weights is None else np.asarray(weights, dtype=np.float64)
    gap = np.bincount(ece_bins(conf), weights=w * (correct - conf), minlength=N_BINS)
    return float(np.abs(gap).sum() / w.sum())


def reliability(conf, correct):
    """The reliability diagram's bins: {"n", "acc", "conf"} lists over the 15 ECE bins (acc and conf None where a
    bin is empty): what ECE sums."""
    conf, correct = np.asarray(conf, dtype=np.float64), np.asarray(correct, dtype=np.float64)
    b = ece_bins(conf)
    n = np.bincount(b, minlength=N_BINS)
    acc, mean = np.bincount(b, correct, N_BINS), np.bincount(b, conf, N_BINS)
    at = lambda v: [float(v[j] / n[j]) if n[j] else None for j in range(N_BINS)]
    return {"n": n.tolist(), "acc": at(acc), "conf": at(mean)}


def split_halves(keys, seed):
    """The temperature split (LGIP_SPEC.md 16): each image's key = sha256 hex of f"{seed}:{k}" (UTF-8); images
    sorted by (key, k); the first floor(n / 2) calibrate, the others test. Returns (calibrate, test) as index
    arrays in the images' own order."""
    hashed = [(hashlib.sha256(f"{seed}:{k}".encode("utf-8")).hexdigest(), k, i) for i, k in enumerate(keys)]
    order = [i for _, _, i in sorted(hashed)]
    half = len(order) // 2
    return np.array(sorted(order[:half]), dtype=np.int64), np.array(sorted(order[half:]), dtype=np.int64)


def mean_nll(z, y, t=1.0):
    """NLL = -mean log p(y | x) at temperature T."""
    lp = log_probabilities(z, t)
    return float(-lp[np.arange(len(y)), np.asarray(y)].mean())


def fit_temperature(z, y):
    """T* = exp(u*), u* = argmin over u in [ln 0.01, ln 100] of NLL(z / e^u) on the calibration images, by
    scipy.optimize.minimize_scalar(method="bounded", bounds=(ln 0.01, ln 100), options={"xatol": 1e-6})."""
    from scipy.optimize import minimize_scalar

    z, y = np.asarray(z, dtype=np.float64), np.asarray(y)
    nll = lambda u: mean_nll(z, y, math.exp(u))
    found = minimize_scalar(nll, bounds=T_BOUNDS, method="bounded", options={"xatol": 1e-6})
    return float(math.exp(found.x))


def per_image(z, y, t=1.0):
    """Each image's [yhat = y], -log p(y | x) and top-1 confidence k = max_c p(c | x) at temperature T."""
    lp = log_probabilities(z, t)
    y = np.asarray(y)
    correct = (np.argmax(lp, axis=1) == y).astype(np.float64)  # (argmax of z / T: z's own, ties alike)
    return correct, -lp[np.arange(len(y)), y], np.exp(lp.max(axis=1))


def interval(rows):
    """numpy.quantile(rows, [0.025, 0.975]) as a list, or None (no resamples)."""
    if rows is None or not len(rows):
        return None
    lo, hi = np.quantile(np.asarray(rows, dtype=np.float64), [0.025, 0.975])
    return [float(lo), float(hi)]


def draws(n, resamples, seed):
    """W [resamples, n] (section 9's: default_rng(seed).multinomial(n, full(n, 1/n), size=resamples)), as drawn
    (uint8 counts, shared by every figure and model: lgip.scoring.bootstrap_draws); None without resamples."""
    return bootstrap_draws(n, resamples, seed) if resamples and n else None


def _by_chunks(weights, fn, chunk=50):
    """fn over the rows of W a block at a time, in float64 (a W of 1,000 x 50,000 images is 400 MB in float64)."""
    if weights is None:
        return None
    return np.concatenate([fn(weights[a : a + chunk].astype(np.float64)) for a in range(0, len(weights), chunk)])


def rows_of(weights, values):
    """A mean's bootstrap rows: W @ values / n."""
    values = np.asarray(values, dtype=np.float64)
    return _by_chunks(weights, lambda w: w @ values / w.shape[1])


def ece_rows(weights, conf, correct):
    """ECE of each resample (each row's weights), vectorised: sum_b |W[:, B_b] @ ([yhat = y] - k)[B_b]| / n."""
    b = ece_bins(conf)
    gap = np.asarray(correct, dtype=np.float64) - np.asarray(conf, dtype=np.float64)
    onehot = np.zeros((len(b), N_BINS))
    onehot[np.arange(len(b)), b] = gap
    return _by_chunks(weights, lambda w: np.abs(w @ onehot).sum(axis=1) / w.shape[1])


def set_figures(z, y, t, test=None, resamples=0, seed=0):
    """A set's figures (LGIP_SPEC.md 16), in the order its dict holds them: acc1, acc5 (None when C < 5), the mean
    per-class recall (sklearn's balanced_accuracy_score), nll, ece, conf_mean at T = 1 over all n images; nll_t,
    ece_t, conf_mean_t at T = t over `test` (the id set's test half; None: all images); acc1_ci95, ece_ci95 from W
    over the n images, nll_t_ci95 from a fresh W over the test images in dataset order (the same seed)."""
    from sklearn.metrics import balanced_accuracy_score

    z, y = np.asarray(z, dtype=np.float64), np.asarray(y, dtype=np.int64)
    correct, nll, conf = per_image(z, y)
    test = np.arange(len(y)) if test is None else np.asarray(test, dtype=np.int64)
    _, nll_t, conf_t = per_image(z[test], y[test], t)
    w, w_t = draws(len(y), resamples, seed), draws(len(test), resamples, seed)
    top5 = top_classes(z, 5) if z.shape[1] >= 5 else None
    return {
        "acc1": float(correct.mean()),
        "acc1_ci95": interval(rows_of(w, correct)),
        "acc5": float((top5 == y[:, None]).any(axis=1).mean()) if top5 is not None else None,
        "mean_per_class_recall": _balanced(balanced_accuracy_score, y, predictions(z)),
        "nll": float(nll.mean()),
        "ece": ece(conf, correct),
        "ece_ci95": interval(ece_rows(w, conf, correct)),
        "conf_mean": float(conf.mean()),
        "nll_t": float(nll_t.mean()),
        "nll_t_ci95": interval(rows_of(w_t, nll_t)),
        "ece_t": ece(conf_t, correct[test]),
        "conf_mean_t": float(conf_t.mean()),
    }


def _balanced(score, y, pred):
    """sklearn's balanced accuracy: the mean recall over the classes that have an image (its warning that a
    prediction names a class without one is what the definition means, not news)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return float(score(y, pred))


def ood_score(kind, z, t=1.0, cos=None):
    """S(x): "msp" = max_c p(c | x) at T*; "maxlogit" = max_c z_c; "mcm" = max_c softmax(cos(x))_c (temperature 1 on
    the cosines, as MCM; a dual encoder's only)."""
    if kind == "msp":
        return np.exp(log_probabilities(z, t).max(axis=1))
    if kind == "maxlogit":
        return np.asarray(z, dtype=np.float64).max(axis=1)
    if kind == "mcm":
        return np.exp(log_probabilities(cos, 1.0).max(axis=1))
    raise ValueError(f"OOD_SCORE {kind!r}: one of {', '.join(OOD_SCORES)}")


def fpr95(s_in, s_out, w_in=None, w_out=None):
    """FPR@95: tau = the m-th largest score of I (with multiplicities), m = ceil(0.95 |I|); the share of O with
    S >= tau (ties with tau count as false positives)."""
    s_in, s_out = np.asarray(s_in, dtype=np.float64), np.asarray(s_out, dtype=np.float64)
    w_in = np.ones(len(s_in)) if w_in is None else np.asarray(w_in, dtype=np.float64)
    w_out = np.ones(len(s_out)) if w_out is None else np.asarray(w_out, dtype=np.float64)
    return float(fpr95_rows(s_in, s_out, w_in[None], w_out[None])[0])


def fpr95_rows(s_in, s_out, w_in, w_out):
    """fpr95 of each row of weights (W_I [R, |I|], W_O [R, |O|]), vectorised; m = ceil(0.95 |I|) in integers."""
    n_in = int(round(w_in[0].sum()))
    m = -(-95 * n_in // 100)
    order = np.argsort(-s_in, kind="stable")
    cum = np.cumsum(w_in[:, order], axis=1)
    tau = s_in[order][np.argmax(cum >= m - 1e-9, axis=1)]
    return (w_out * (s_out[None, :] >= tau[:, None])).sum(axis=1) / w_out.sum(axis=1)


def auroc_rows(s_in, s_out, w_in, w_out):
    """Weighted AUROC of each row of weights (W_I [R, |I|], W_O [R, |O|]; in-distribution positive): sum over pairs
    (i in I, o in O) of w_i w_o ([s_i > s_o] + [s_i = s_o] / 2) / (sum w_I sum w_O), what roc_auc_score gives with
    sample_weight (tests/test_classification.py checks it), vectorised over the scores' distinct values."""
    from scipy import sparse

    uniq, inv = np.unique(np.concatenate([s_in, s_out]), return_inverse=True)

    def at(idx, w):  # [R, distinct values]: each row's weight at each value
        onehot = sparse.csr_matrix((np.ones(len(idx)), (np.arange(len(idx)), idx)), shape=(len(idx), len(uniq)))
        return np.asarray((onehot.T @ w.T).T)

    i_at, o_at = at(inv[: len(s_in)], w_in), at(inv[len(s_in) :], w_out)
    o_below = np.cumsum(o_at, axis=1) - o_at
    return (i_at * (o_below + 0.5 * o_at)).sum(axis=1) / (w_in.sum(axis=1) * w_out.sum(axis=1))


def ood_figures(s_in, s_out, resamples=0, seed=0, chunk=50):
    """OOD figures of scores S on the id set I and an ood set O (in-distribution the positive class): auroc =
    roc_auc_score([1] * |I| + [0] * |O|, S), fpr95, aupr_in = average_precision_score (the same labels); their
    intervals from I and O resampled each by its own generator (default_rng([seed, 0]) for I, [seed, 1] for O)."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    s_in, s_out = np.asarray(s_in, dtype=np.float64), np.asarray(s_out, dtype=np.float64)
    labels, scores = np.r_[np.ones(len(s_in)), np.zeros(len(s_out))], np.r_[s_in, s_out]
    au, fp = ood_rows(s_in, s_out, resamples, seed, chunk)
    return {
        "auroc": float(roc_auc_score(labels, scores)),
        "fpr95": fpr95(s_in, s_out),
        "aupr_in": float(average_precision_score(labels, scores)),
        "auroc_ci95": interval(au),
        "fpr95_ci95": interval(fp),
        "n_id": int(len(s_in)),
        "n_ood": int(len(s_out)),
    }


def ood_rows(s_in, s_out, resamples, seed, chunk=50):
    """(AUROC rows, FPR@95 rows) over the resamples of I and O (ood_figures), or (None, None)."""
    if not resamples:
        return None, None
    w_i = bootstrap_draws(len(s_in), resamples, (seed, 0))
    w_o = bootstrap_draws(len(s_out), resamples, (seed, 1))
    au, fp = [], []
    for a in range(0, resamples, chunk):  # (float64 a block at a time)
        wi, wo = w_i[a : a + chunk].astype(np.float64), w_o[a : a + chunk].astype(np.float64)
        au.append(auroc_rows(s_in, s_out, wi, wo))
        fp.append(fpr95_rows(s_in, s_out, wi, wo))
    return np.concatenate(au), np.concatenate(fp)


def category_predictions(p, categories):
    """yhat over categories: argmax (ties to the first) of each category's mean p over its classes (p at T = 1)."""
    means = np.stack([p[:, members].mean(axis=1) for _, members in categories], axis=1)
    return np.argmax(means, axis=1)


def shape_bias(pred, shape, texture):
    """shape_bias = #[yhat = shape] / (#[yhat = shape] + #[yhat = texture]) (None over 0); shape_match =
    #[yhat = shape] / n; texture_match = #[yhat = texture] / n (n the kept images)."""
    pred, shape, texture = np.asarray(pred), np.asarray(shape), np.asarray(texture)
    hits_s, hits_t, n = int((pred == shape).sum()), int((pred == texture).sum()), len(pred)
    return {
        "shape_bias": hits_s / (hits_s + hits_t) if hits_s + hits_t else None,
        "shape_match": hits_s / n if n else None,
        "texture_match": hits_t / n if n else None,
    }


def paired(values_a, values_b, figure, resamples, seed):
    """A paired comparison (section 9's form): diff = X(a) - X(b), diff_ci95 the 2.5 and 97.5 percentiles of
    X(a) - X(b) over the same resampled rows. `figure`: "acc1" (values: [yhat = y] per image), "ece_t"
    ((k, [yhat = y]) per image at T*), or "auroc" ((S on I, S on O), I and O resampled as ood_figures)."""
    from sklearn.metrics import roc_auc_score

    if figure == "auroc":
        (ia, oa), (ib, ob) = values_a, values_b
        lab = np.r_[np.ones(len(ia)), np.zeros(len(oa))]
        diff = roc_auc_score(lab, np.r_[ia, oa]) - roc_auc_score(lab, np.r_[ib, ob])
        rows = None
        if resamples:
            (ra, _), (rb, _) = ood_rows(ia, oa, resamples, seed), ood_rows(ib, ob, resamples, seed)
            rows = ra - rb
        return float(diff), interval(rows)
    if figure == "acc1":
        ca, cb = np.asarray(values_a, dtype=np.float64), np.asarray(values_b, dtype=np.float64)
        w = draws(len(ca), resamples, seed)
        rows = None if w is None else rows_of(w, ca) - rows_of(w, cb)
        return float(ca.mean() - cb.mean()), interval(rows)
    (ka, ca), (kb, cb) = values_a, values_b
    w = draws(len(ka), resamples, seed)
    rows = None if w is None else ece_rows(w, ka, ca) - ece_rows(w, kb, cb)
    return ece(ka, ca) - ece(kb, cb), interval(rows)


def effective_robustness(rows):
    """LGIP_SPEC.md 16's effective robustness over a metrics file's rows (report.py writes it to
    `<N>__LGIP_classification_er.metrics.json`): per "shift" set, over the rows that have it and the id set (at
    least 3, else None): a = clip(acc1, 0.5 / n, 1 - 0.5 / n) of each set (n its images), x = Phi^-1(a_id),
    y = Phi^-1(a_shift) (scipy.stats.norm.ppf), slope and intercept by numpy.polyfit(x, y, 1); per model
    effective_robustness = acc1_shift - Phi(slope x + intercept). Returns {shift set: {slope, intercept, models,
    effective_robustness {model: value}} or None}."""
    from scipy.stats import norm

    def acc(block):
        return None if not isinstance(block, dict) or block.get("acc1") is None or not block.get("n") else block

    out, shifts = {}, []
    for row in rows:
        for name, block in (row.get("datasets") or {}).items():
            if isinstance(block, dict) and block.get("role") == "shift" and name not in shifts:
                shifts.append(name)
    for shift in shifts:
        pts = []
        for row in rows:
            sets = row.get("datasets") or {}
            ident = next((b for b in sets.values() if isinstance(b, dict) and b.get("role") == "id"), None)
            if acc(ident) and acc(sets.get(shift)):
                pts.append((row.get("model_tag") or row.get("model"), ident, sets[shift]))
        if len(pts) < 3:
            out[shift] = None
            continue
        clip = lambda b: min(max(b["acc1"], 0.5 / b["n"]), 1 - 0.5 / b["n"])
        x = norm.ppf([clip(i) for _, i, _ in pts])
        y = norm.ppf([clip(s) for _, _, s in pts])
        slope, intercept = np.polyfit(x, y, 1)
        out[shift] = {
            "slope": float(slope),
            "intercept": float(intercept),
            "models": [m for m, _, _ in pts],
            "effective_robustness": {
                m: float(s["acc1"] - norm.cdf(slope * xi + intercept)) for (m, _, s), xi in zip(pts, x)
            },
        }
    return out
