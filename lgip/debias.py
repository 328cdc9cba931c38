"""lgip.debias: a debiased copy of a perturbation set (LGIP_SPEC.md 15, after SugarCrepe's adversarial
refinement): in each cell of flip type and |gap| bins of the debiasing scorers, pairs of mirrored sign
patterns kept in equal numbers, so that each debiasing scorer is at chance on what is kept; a held-out scorer,
never used here, then says what is left. The records rewritten with the kept flips (`debiased_record`).

    >>> keep, edges = balance(pairs, {s: gaps[s] for s in D}, bins=5, seed=0)   # keep[x]: pair x kept
"""

import collections
import hashlib
import math

from .blind import type_blocks
from .records import caption_texts


def edges_of(values, bins):
    """The bin edges of one scorer: a = the sorted |g| != 0 (M values), e_j = a[ceil(j * M / BINS) - 1] for
    j = 1..BINS-1 (none when M = 0)."""
    a = sorted(abs(v) for v in values if v != 0)
    return [a[math.ceil(j * len(a) / bins) - 1] for j in range(1, bins)] if a else []


def bin_of(g, edges):
    """0 for a tie, else 1 + the number of edges strictly below |g|."""
    return 0 if g == 0 else 1 + sum(1 for e in edges if e < abs(g))


def _sign(g):
    return (g > 0) - (g < 0)


def rank(seed, p):
    """A pair's seeded rank: which of a group are kept does not depend on the order they are met in."""
    return int.from_bytes(hashlib.sha256(f"{seed}|{p.r}|{p.i}|{p.t}|{p.j}".encode()).digest()[:8], "big")


def balance(pairs, gaps, bins, seed):
    """(keep: a bool per pair, edges {scorer: [e_1, ...]}, unscored: a bool per pair) over the debiasing
    scorers' gaps ({name: [g or None per pair]}): pairs without a gap from every one are unscored (not
    kept); in each cell (type, each scorer's bin) the groups of sign patterns sigma and -sigma keep m pairs
    each, m the smaller group's size (the smallest `rank`s); pairs with every gap 0 are all kept."""
    names = list(gaps)
    unscored = [any(gaps[s][x] is None for s in names) for x in range(len(pairs))]
    scored = [x for x in range(len(pairs)) if not unscored[x]]
    edges = {s: edges_of([gaps[s][x] for x in scored], bins) for s in names}
    cells = collections.defaultdict(lambda: collections.defaultdict(list))
    for x in scored:
        key = (pairs[x].t, tuple(bin_of(gaps[s][x], edges[s]) for s in names))
        cells[key][tuple(_sign(gaps[s][x]) for s in names)].append(x)
    keep = [False] * len(pairs)
    for groups in cells.values():
        for sigma, members in groups.items():
            mirror = tuple(-v for v in sigma)
            if sigma == mirror:  # every gap 0: kept, as SugarCrepe keeps them
                for x in members:
                    keep[x] = True
                continue
            m = min(len(members), len(groups.get(mirror, ())))
            for x in sorted(members, key=lambda x: rank(seed, pairs[x]))[:m]:
                keep[x] = True
    return keep, edges, unscored


def debiased_record(rec, r, pairs_of, keep, types):
    """The record with only its kept flips: each `diff_caps_<t>[i]` its kept texts in order; `diff_caps[i]`
    in order, an entry kept while caption i's kept typed pairs with its text are not used up (one in no typed
    list: dropped and counted); type `all`: its kept texts. Every other key, and the keys' order, unchanged.
    Returns (the record, untyped entries dropped)."""
    out, dropped = dict(rec), 0
    if types == ["all"]:
        field = dict(rec.get("diff_caps", {}))
        for key in field:
            field[key] = [t for j, t in enumerate(field[key]) if keep[pairs_of[(r, int(key), "all", j)]]]
        out["diff_caps"] = field
        return out, 0
    typed_all = collections.defaultdict(collections.Counter)  # caption -> every typed text, kept or not
    kept = collections.defaultdict(collections.Counter)  # caption -> kept typed texts
    for t in types:
        name = "diff_caps_" + t
        if name not in rec:
            continue
        field = dict(rec[name])
        for key in field:
            i = int(key)
            texts = caption_texts(rec, name, i)
            typed_all[i].update(texts)
            field[key] = [f for j, f in enumerate(texts) if keep[pairs_of[(r, i, t, j)]]]
            kept[i].update(field[key])
        out[name] = field
    if "diff_caps" in rec:
        field = dict(rec["diff_caps"])
        for key in field:
            i, texts, left = int(key), [], kept[int(key)]
            for f in field[key]:
                if left[f] > 0:
                    texts.append(f)
                    left[f] -= 1
                elif not typed_all[i][f]:
                    dropped += 1
            field[key] = texts
        out["diff_caps"] = field
    return out, dropped


def kept_blocks(pairs, keep, unscored, types):
    """{block: {count, unscored, kept, kept_fraction}} for `all`, then each type."""
    out = {}
    for name, idx in type_blocks(pairs, types).items():
        count, kept = len(idx), sum(1 for x in idx if keep[x])
        out[name] = {
            "count": count,
            "unscored": sum(1 for x in idx if unscored[x]),
            "kept": kept,
            "kept_fraction": kept / count if count else None,
        }
    return out
