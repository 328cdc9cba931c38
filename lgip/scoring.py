"""lgip.scoring: the method's numbers (LGIP_SPEC.md section 4): the (record, caption, text) pairs an
evaluation scores (`Pairs`: plain data; what scores them is lgip.scorers), means, and seeded bootstrap
intervals over images. The room for a new metric.

    >>> inv, sens = run.score(inv, sens).pairs; err = abs(inv.base_sim - inv.sim)
    >>> add_ci(m, "invariance_error_mean", inv.rec, err, resamples=1000, seed=0)
"""

import itertools

from . import accelerations


class Pairs:
    """(record, caption, text) pairs, each to be scored against its record's image and caption: plain
    data, the scores filled in by the model's scorer (lgip.scorers: base_sim, sim, labels; text_cos,
    prior_base and prior, the hard positives' fields when asked for). base_sim and sim are s, the pair's
    score of the model's score_kind (LGIP_SPEC.md 13): a cosine for a dual encoder, a log-probability or
    log-odds for a joint scorer; the published names are kept (the score files' `sim`).

    >>> pairs = Pairs(); pairs.add(k, i, orig[i], bank.add_call(texts), texts, "para")
    >>> inv, = run.score(pairs).pairs         # inv.base_sim, inv.sim
    """

    def __init__(self):
        self.rec, self.cap, self.base_slot, self.slot, self.text, self.label = [], [], [], [], [], []
        # idx bytes -> the subset's lists; shared by shallow copies (the run's models: ModelRun.pairs)
        self._subsets = {}

    def add(self, k, i, base_slot, slots, texts, label):
        n = len(texts)
        if len(slots) != n:
            raise ValueError(f"{len(slots)} slots for {n} texts")
        repeat = itertools.repeat
        self.rec.extend(repeat(k, n)), self.cap.extend(repeat(i, n)), self.base_slot.extend(repeat(base_slot, n))
        self.slot.extend(slots), self.text.extend(texts), self.label.extend(repeat(label, n))

    def __len__(self):
        return len(self.rec)

    _FIELDS = ("rec", "cap", "base_slot", "slot", "text", "label")
    # (prior_base, prior: the caption's and the text's mean cosine with the OTHER images, LGIP_SPEC.md 9;
    # has_para, robust, text_only: a flip's hard-positive outcomes, section 10: lgip.controls)
    _SCORES = ("base_sim", "sim", "labels", "text_cos", "prior_base", "prior", "has_para", "robust", "text_only")

    def state(self):
        return {n: getattr(self, n) for n in self._FIELDS + self._SCORES if hasattr(self, n)}

    @classmethod
    def merged(cls, states):
        """Pairs from several processes, in record order (as one process would list them)."""
        import numpy as np

        out = cls()
        rec = np.concatenate([np.asarray(st["rec"], dtype=np.int64) for st in states])
        order = np.argsort(rec, kind="stable")  # each process lists its records in order
        for name in cls._FIELDS:
            seq = [x for st in states for x in st[name]]
            setattr(out, name, [seq[j] for j in order])
        for name in cls._SCORES:
            if name in states[0]:
                setattr(out, name, np.concatenate([st[name] for st in states])[order])
        return out

    def subset(self, idx):
        """The scored pairs at positions idx. Its lists are those of the last such subset of
        these pairs, when there was one: the run's later models take the same subsets (of the
        images that decode; the typed flips), and a score file's layout is made for those lists."""
        import numpy as np

        key = np.asarray(idx, dtype=np.int64).tobytes()
        fields = self._subsets.get(key)  # (the lists only grow while pairs are built: positions keep their pair)
        if fields is None:
            fields = [[seq[j] for j in idx] for seq in (getattr(self, name) for name in self._FIELDS)]
            if len(self._subsets) >= 4:
                self._subsets.pop(next(iter(self._subsets)))
            self._subsets[key] = fields
        out = Pairs()
        for name, seq in zip(self._FIELDS, fields):
            setattr(out, name, seq)
        for name in self._SCORES:
            if hasattr(self, name):
                setattr(out, name, getattr(self, name)[idx])
        return out


def mean_or_none(values):
    import numpy as np

    return float(np.mean(values)) if len(values) else None


BOOTSTRAP_CACHE_BYTES = 1 << 29  # resample draws kept for later metrics and models (1000 x 40,000 images: 40 MB)


_BOOTSTRAP_DRAWS = {}  # (records, resamples, seed, chunk) -> [resamples, records] draw counts, most recent last


def bootstrap_draws(n, resamples, seed, chunk=50):
    """[resamples, n] draw counts of bootstrap_ci's resamples over n records: row r how often
    resample r drew each record, exactly as rng.multinomial(n, uniform, size=chunk) gives them
    chunk after chunk. They depend on (n, resamples, seed) alone, so every metric of a run and
    every model over the same records share them: drawn once (numpy's multinomial is O(n) per
    resample, ~1.6 s for 1000 x 40,000 images, which each CI paid), kept as uint8.
    >>> bootstrap_draws(3, 4, seed=0).sum(axis=1).tolist()  # each resample draws 3 records
    [3, 3, 3, 3]
    """
    import numpy as np

    key = (n, resamples, seed, chunk)
    draws = _BOOTSTRAP_DRAWS.pop(key, None) if accelerations.SHARED_BOOTSTRAP_DRAWS else None
    if draws is None:
        rng = np.random.default_rng(seed)
        draws = np.empty((resamples, n), dtype=np.uint8)
        for start in range(0, resamples, chunk):
            block = rng.multinomial(n, np.full(n, 1.0 / n), size=min(chunk, resamples - start))
            if draws.dtype == np.uint8 and block.max() > 255:  # (n > 255 draws landing on one record)
                draws = draws.astype(np.int64)
            draws[start : start + len(block)] = block
    if not accelerations.SHARED_BOOTSTRAP_DRAWS:
        return draws
    _BOOTSTRAP_DRAWS[key] = draws
    while sum(d.nbytes for d in _BOOTSTRAP_DRAWS.values()) > BOOTSTRAP_CACHE_BYTES and len(_BOOTSTRAP_DRAWS) > 1:
        del _BOOTSTRAP_DRAWS[next(iter(_BOOTSTRAP_DRAWS))]  # the least recently used
    return draws


def bootstrap_ci(record_idx, values, resamples=1000, seed=0, level=0.95, chunk=50):
    """Percentile bootstrap CI of a pair mean, resampling images (records) with replacement.

    The records resampled are those with at least one pair; a resample weights each by how
    often it was drawn, and the statistic is the mean over all pairs of the drawn records:
    sum(w * record sums) / sum(w * record counts).
    >>> bootstrap_ci([0, 0, 1, 2], [1.0, 1.0, 0.0, 1.0], resamples=200)  # doctest: +SKIP
    [0.33, 1.0]
    """
    import numpy as np

    values = np.asarray(values, dtype=np.float64)
    if len(values) == 0 or not resamples:
        return None
    record_idx = np.asarray(record_idx, dtype=np.int64)
    used = np.unique(record_idx)  # records that contribute pairs; records without any carry no weight
    pos = np.searchsorted(used, record_idx)
    sums = np.bincount(pos, weights=values, minlength=len(used))
    counts = np.bincount(pos, minlength=len(used)).astype(np.float64)
    draws = bootstrap_draws(len(used), resamples, seed, chunk)
    stats = []
    for start in range(
        0, resamples, chunk
    ):  # float64 blocks of the shape the draws came in: the same sums, bit for bit
        w = draws[start : start + chunk].astype(np.float64)
        stats.append((w @ sums) / np.maximum(w @ counts, 1e-300))
    stats = np.concatenate(stats)
    alpha = (1.0 - level) / 2
    lo, hi = np.quantile(stats, [alpha, 1.0 - alpha])
    return [float(lo), float(hi)]


def add_ci(block, key, record_idx, values, resamples, seed):
    """Set block[key + "_ci95"] right after block[key]."""
    ci = bootstrap_ci(record_idx, values, resamples, seed)
    items = list(block.items())
    block.clear()
    for k, v in items:
        block[k] = v
        if k == key:
            block[key + "_ci95"] = ci
    return block


def spearman(xs, ys):
    """Spearman's rank correlation of paired values (ties get their average rank), or None with
    fewer than 3 pairs or a constant side: the report's rank correlation across models.
    >>> spearman([0.1, 0.2, 0.3, 0.4], [0.9, 0.7, 0.8, 0.1]), spearman([1, 2], [3, 4])
    (-0.8, None)
    """
    import numpy as np

    def ranks(v):
        v = np.asarray(v, dtype=np.float64)
        order = np.argsort(v, kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(1, len(v) + 1)
        for value in np.unique(v):  # ties: their average rank
            r[v == value] = r[v == value].mean()
        return r

    if len(xs) != len(ys) or len(xs) < 3:
        return None
    rx, ry = ranks(xs), ranks(ys)
    if rx.std() == 0 or ry.std() == 0:
        return None
    return round(float(np.corrcoef(rx, ry)[0, 1]), 12)
