"""lgip.blind: the blind audit of a perturbation set (LGIP_SPEC.md section 15): how often a scorer that
never sees the image picks a caption over its flip, per flip type, before any model runs. The pairs of an
input (`blind_pairs`), the folds by image (`fold_of`), the text-only scorers (`length`; cross-fitted
`ngram<n>`, interpolated Witten-Bell; `edit`, a model of the generator's edit words), each pair's gap, and
the figures with their intervals over images (`blind_figures`). Text only: no image is read. The table of
SCORERS' forms, the model scorers (`lm:`, `prior:`) and the gaps file: lgip.blind_scorers.

    >>> pairs = blind_pairs(records); folds = [fold_of(rec, 5) for _, rec in records]
    >>> gaps = ngram_gaps(pairs, records, folds, 5, 3)      # {pair index: g}, each by a model of other folds
"""

import collections
import hashlib
import math
import re
from dataclasses import dataclass

from . import accelerations
from .records import caption_texts, flip_types
from .scoring import bootstrap_ci

_WORD = re.compile(r"[^\W_]+")


def words(text):
    """w(x): runs of letters and digits of the lower-cased text (section 15)."""
    return _WORD.findall(text.lower())


@dataclass(frozen=True)
class Pair:
    """One caption and one flip of it: record ordinal r, caption index i, type t, position j in its list."""

    r: int
    i: int
    t: str
    j: int
    caption: str
    flip: str


def blind_pairs(records):
    """Every (caption, flip) pair of the records ([(line, record)]), ordered by r, i, t, j: the texts of
    `diff_caps_<t>[i]` per type in order of first appearance; an input without typed lists has the one type
    `all`, from `diff_caps`. Returns (pairs, types)."""
    types = flip_types(records)
    fields = [(t, "diff_caps_" + t) for t in types] if types else [("all", "diff_caps")]
    pairs = []
    for r, (_, rec) in enumerate(records):
        for i, caption in enumerate(rec["orig_captions"]):
            for t, field in fields:
                pairs += [Pair(r, i, t, j, caption, f) for j, f in enumerate(caption_texts(rec, field, i))]
    return pairs, [t for t, _ in fields]


def fold_of(rec, folds):
    """The record's fold: sha256 of its image_id (an int or a string) or else its image_path, mod FOLDS."""
    key = rec.get("image_id")
    key = str(key) if isinstance(key, (int, str)) and not isinstance(key, bool) else rec["image_path"]
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") % folds


def _gap(a, b):
    return round(a - b, 9)


def length_gaps(pairs):
    """`length`: s = -len(w(x)), the shorter text wins."""
    return [_gap(-len(words(p.caption)), -len(words(p.flip))) for p in pairs]


class NGram:
    """An n-gram model of captions, interpolated Witten-Bell (section 15): counts c_k(h, w) for k = 1..n,
    P_1 add-one over the vocabulary plus one unseen word, P_k backing off to P_{k-1} by T(h)."""

    def __init__(self, n, captions):
        self.n = n
        self.counts = collections.defaultdict(collections.Counter)  # h (a tuple of k - 1 tokens) -> {w: count}
        for c in captions:
            t = ["<s>"] * (n - 1) + words(c) + ["</s>"]
            for p in range(n - 1, len(t)):
                for k in range(1, n + 1):
                    self.counts[tuple(t[p - k + 1 : p])][t[p]] += 1
        self.totals = {h: sum(c.values()) for h, c in self.counts.items()}  # c(h)
        self.types = {h: len(c) for h, c in self.counts.items()}  # T(h)
        self.empty = not self.counts
        self.memo = {} if accelerations.NGRAM_MEMO else None

    def prob(self, w, h):
        """P_k(w | h), k = len(h) + 1 (computed once per (w, h) with NGRAM_MEMO: the same float)."""
        if self.memo is None:
            return self._prob(w, h)
        key = (w, h)
        p = self.memo.get(key)
        if p is None:
            p = self.memo[key] = self._prob(w, h)
        return p

    def _prob(self, w, h):
        if not h:
            unigram = self.counts.get((), {})
            return (unigram.get(w, 0) + 1) / (self.totals.get((), 0) + self.types.get((), 0) + 1)
        lower = self.prob(w, h[1:])
        total = self.totals.get(h, 0)
        if not total:
            return lower
        return (self.counts[h].get(w, 0) + self.types[h] * lower) / (total + self.types[h])

    def score(self, text):
        """s(x): the mean log-probability of the text's tokens, `</s>` included (0 for an empty corpus)."""
        if self.empty:
            return 0.0
        n = self.n
        t = ["<s>"] * (n - 1) + words(text) + ["</s>"]
        total = 0.0
        for p in range(n - 1, len(t)):
            total += math.log(self.prob(t[p], tuple(t[p - n + 1 : p])))
        return total / (len(t) - n + 1)


def fold_corpora(records, folds, n_folds, extra=()):
    """Each fold's corpus: the distinct captions of each record (first occurrence kept) of the records of
    the other folds, in order, then `extra` (NGRAM_CORPUS's lines)."""
    per_record = [list(dict.fromkeys(rec["orig_captions"])) for _, rec in records]
    return [
        [c for r, caps in enumerate(per_record) if folds[r] != k for c in caps] + list(extra) for k in range(n_folds)
    ]


def ngram_gaps(pairs, corpora, folds, n):
    """`ngram<n>`: each pair's gap by the model of its record's fold's corpus (fit on the other folds)."""
    models, memo, out = {}, {}, []
    for p in pairs:
        k = folds[p.r]
        if k not in models:
            models[k] = NGram(n, corpora[k])
        s = lambda x: memo[(k, x)] if (k, x) in memo else memo.setdefault((k, x), models[k].score(x))
        out.append(_gap(s(p.caption), s(p.flip)))
    return out


def edit_gaps(pairs, folds, n_folds):
    """`edit`: the words a flip took out (A) and put in (Z), weighted by how often the other folds' pairs
    took each word out versus put it in (lambda(u) = log(n_true(u) + 1) - log(n_flip(u) + 1))."""
    diffs = []
    for p in pairs:
        c, f = collections.Counter(words(p.caption)), collections.Counter(words(p.flip))
        diffs.append((c - f, f - c))
    n_true = [collections.Counter() for _ in range(n_folds)]
    n_flip = [collections.Counter() for _ in range(n_folds)]
    for p, (a, z) in zip(pairs, diffs):
        n_true[folds[p.r]].update(a)
        n_flip[folds[p.r]].update(z)
    every_true, every_flip = sum(n_true, collections.Counter()), sum(n_flip, collections.Counter())
    out = []
    for p, (a, z) in zip(pairs, diffs):
        k = folds[p.r]
        lam = lambda u: math.log(every_true[u] - n_true[k][u] + 1) - math.log(every_flip[u] - n_flip[k][u] + 1)
        g = 0.0
        for u in sorted(a):
            g += a[u] * lam(u)
        for u in sorted(z):
            g -= z[u] * lam(u)
        out.append(round(g, 9))
    return out


def type_blocks(pairs, types):
    """{block: pair positions}: `all`, then each type (an input of the one type `all`: that block alone)."""
    blocks = {"all": list(range(len(pairs)))}
    for t in types:
        if t != "all":
            blocks[t] = [x for x, p in enumerate(pairs) if p.t == t]
    return blocks


def blind_figures(pairs, gaps, types, resamples, seed):
    """{block: figures} for `all`, then each type (section 15): count, scored, right, wrong, ties, num_images,
    acc (right / scored) with its interval over the records with a scored pair, tie_rate, acc_untied
    (right / (right + wrong)) with its interval over the records with an untied pair; None over 0."""
    out = {}
    for name, idx in type_blocks(pairs, types).items():
        scored = [x for x in idx if gaps[x] is not None]
        untied = [x for x in scored if gaps[x] != 0]
        right = sum(1 for x in scored if gaps[x] > 0)
        wrong = sum(1 for x in scored if gaps[x] < 0)
        block = {
            "count": len(idx),
            "scored": len(scored),
            "right": right,
            "wrong": wrong,
            "ties": len(scored) - right - wrong,
            "num_images": len({pairs[x].r for x in scored}),
            "acc": right / len(scored) if scored else None,
            "acc_ci95": bootstrap_ci([pairs[x].r for x in scored], [gaps[x] > 0 for x in scored], resamples, seed),
            "tie_rate": (len(scored) - right - wrong) / len(scored) if scored else None,
            "acc_untied": right / len(untied) if untied else None,
            "acc_untied_ci95": bootstrap_ci(
                [pairs[x].r for x in untied], [gaps[x] > 0 for x in untied], resamples, seed
            ),
        }
        out[name] = block
    return out


def interval_side(ci):
    """ "above" or "below" where an accuracy's interval [lo, hi] excludes chance (0.5) on that side, else
    "chance" (None, no interval, counts as chance)."""
    return "above" if ci and ci[0] > 0.5 else "below" if ci and ci[1] < 0.5 else "chance"


def side_of_chance(block):
    """Where a blind_figures block stands: "none" (nothing scored), "ties" (every scored pair a tie), "above" or
    "below" (acc_untied's interval excludes 0.5 on that side), else "chance" (no interval counts as chance)."""
    if not block["scored"]:
        return "none"
    if not block["right"] + block["wrong"]:
        return "ties"
    return interval_side(block["acc_untied_ci95"])


def standing(block):
    """A blind_figures block in words, its counts beside its rate: "ties on all 40", "at chance (4 right,
    4 wrong)", "right on 30 of 32 untied (0.938 [0.850, 1.000])", "wrong on ...", "scores none"."""
    side, right, wrong = side_of_chance(block), block["right"], block["wrong"]
    if side == "none":
        return "scores none"
    if side == "ties":
        return f"ties on all {block['scored']:,}"
    ties = f", {block['ties']:,} tied" if block["ties"] else ""
    if side == "chance":
        return f"at chance ({right:,} right, {wrong:,} wrong{ties})"
    lo, hi = block["acc_untied_ci95"]
    rate = f"({block['acc_untied']:.3f} [{lo:.3f}, {hi:.3f}]{ties})"
    return (
        f"right on {right:,} of {right + wrong:,} untied {rate}"
        if side == "above"
        else (f"wrong on {wrong:,} of {right + wrong:,} untied {rate}")
    )


def corpus_lines(path, records):
    """NGRAM_CORPUS's lines (blank ones skipped) and how many were dropped because their words equal a
    caption's of the input (they would leak it into its own fold's model)."""
    with open(path, encoding="utf-8") as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
    own = {tuple(words(c)) for _, rec in records for c in rec["orig_captions"]}
    kept = [line for line in lines if tuple(words(line)) not in own]
    return kept, len(lines) - len(kept)
