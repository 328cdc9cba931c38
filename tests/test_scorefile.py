"""The per-pair score files (lgip/scorefile.py): they reproduce the metrics; their lines equal one
dict per caption dumped as first written; labels need a value per pair; later models reuse the
layout; rounded similarities written as round() and repr() write them."""

import json

import numpy as np
import pytest

from lgip.records import dump_jsonl_line
from lgip.memory import KEPT
from lgip.scorefile import PerModel, ScoreSidecar, _json_values, _rounded, _rounded_json
from lgip.scoring import Pairs
from conftest import CASES


def test_sidecar_reproduces_the_metrics(reference_runs):
    folder, _ = reference_runs["run_lgip_multi.py"]
    metrics = json.load(open(folder / "fixture_with_perturb__LGIP_tiny_siglip.metrics.json"))
    rows = [json.loads(line) for line in open(folder / metrics["scores_file"])]
    assert len(rows) == 60 and rows[0]["image_id"] == 1 and rows[0]["line"] == 1
    errs = [abs(r["sim"] - p["sim"]) for r in rows for p in r.get("paraphrases", [])]
    gaps = [r["sim"] - f["sim"] for r in rows for f in r.get("flips", [])]
    assert np.mean(errs) == pytest.approx(metrics["invariance_error_mean"], abs=1e-5)
    assert np.mean(gaps) == pytest.approx(metrics["sensitivity_gap_mean"], abs=1e-5)
    assert {f["type"] for r in rows for f in r.get("flips", [])} == {"color", "number", "object"}
    folder, _ = reference_runs["rebuttal_enhanced_lgip_by_transformation.py"]
    m = json.load(open(folder / CASES[2][2][0]))[0]
    rows = [json.loads(line) for line in open(folder / m["scores_file"])]
    assert sum(len(r.get("flips", [])) for r in rows) == m["corrected"]["global_sensitivity"]["count"]
    assert sum(len(r.get("combined", [])) for r in rows) == m["corrected"]["combined"]["global_sensitivity"]["count"]
    kinds = [p["kind"] for r in rows for p in r.get("paraphrases", [])]
    assert kinds.count("simple") == m["paraphrase_simple_count"]


class _DictSidecar:
    """The score file as first written: a dict per caption, filled pair by pair, dumped per line."""

    def __init__(self, records):
        self.records, self.rows = records, {}

    def add(self, group, pairs, **labels):
        for n in range(len(pairs)):
            k, i = pairs.rec[n], pairs.cap[n]
            if (k, i) not in self.rows:
                line, rec = self.records[k]
                self.rows[(k, i)] = {
                    "line": line,
                    "image_id": rec.get("image_id"),
                    "image_path": rec["image_path"],
                    "caption_index": i,
                    "caption": rec["orig_captions"][i],
                    "sim": None,
                }
            row = self.rows[(k, i)]
            row["sim"] = round(float(pairs.base_sim[n]), 6)
            item = {"text": pairs.text[n], "sim": round(float(pairs.sim[n]), 6)}
            item.update({key: v[n] for key, v in labels.items()})
            row.setdefault(group, []).append(item)

    def lines(self):
        return [dump_jsonl_line(self.rows[key]) for key in sorted(self.rows)]


def _score_groups(rng):
    """Records and three scored groups: out of record order, quotes, non-ASCII, NaN, None labels."""
    records = [
        (
            k + 3,
            {
                "image_id": k if k % 3 else f"id-{k}",
                "image_path": f"images/{k}.jpg",
                "orig_captions": [f'caption {k}.{i} "quoted" \\ café ☃' for i in range(5)],
            },
        )
        for k in range(60)
    ]
    para, flips, combined = Pairs(), Pairs(), Pairs()
    for k in rng.permutation(60):  # pairs of a group out of record order, some captions without a group
        for i in range(5):
            c = records[k][1]["orig_captions"][i]
            if (k + i) % 4:
                texts = [f"a photo of {c}", f"{c} in the scene", "ünïcode\n\ttab"]
                para.add(k, i, 0, [0, 1, 2], texts, "simple" if k % 2 else "advanced")
            if (3 * k + i) % 5:
                flips.add(k, i, 0, [0], [c.replace("caption", "bus")], "all")
            if k % 7 == 0:
                combined.add(k, i, 0, [0, 1], ["x", "y"], "color+object")
    for pairs in (para, flips, combined):
        base = {}
        pairs.base_sim = np.array([base.setdefault(key, rng.normal()) for key in zip(pairs.rec, pairs.cap)])
        pairs.sim = rng.normal(size=len(pairs)) * 10.0 ** rng.integers(-9, 2, size=len(pairs))
    para.sim[:3] = [np.nan, np.inf, -0.0]
    flip_types = [None if n % 3 == 0 else "color" for n in range(len(flips))]
    strength = np.round(rng.random(len(combined)), 6)
    return records, para, flips, combined, flip_types, strength


def test_score_file_lines_equal_one_dict_per_caption(tmp_path):
    records, para, flips, combined, flip_types, strength = _score_groups(np.random.default_rng(0))
    files = []
    for sidecar in (_DictSidecar(records), ScoreSidecar(records)):
        sidecar.add("paraphrases", para, kind=para.label)
        sidecar.add("flips", flips, type=flip_types, n=list(range(len(flips))))
        sidecar.add("combined", combined, type=combined.label, strength=strength)
        files.append(list(sidecar.lines()))
    assert files[0] == files[1] and len(files[0]) == len(
        {(k, i) for p in (para, flips, combined) for k, i in zip(p.rec, p.cap)}
    )
    path = ScoreSidecar(records)
    path.add("flips", flips, type=flip_types)
    written = path.write(tmp_path / "s.jsonl")
    rows = [json.loads(line) for line in open(written, encoding="utf-8")]
    assert [(r["line"], r["caption_index"]) for r in rows] == sorted({(k + 3, i) for k, i in zip(flips.rec, flips.cap)})
    assert all(list(r) == ["line", "image_id", "image_path", "caption_index", "caption", "sim", "flips"] for r in rows)
    assert ScoreSidecar(records).lines() == []
    with pytest.raises(ValueError, match="added twice"):
        path.add("flips", flips)


def test_score_labels_need_a_value_per_pair():
    pairs = Pairs()
    pairs.add(0, 0, 0, [1, 2], ["a", "b"], "x")
    sidecar = ScoreSidecar([(1, {"image_path": "a.jpg", "orig_captions": ["c"]})])
    with pytest.raises(ValueError, match="'strength' of group 'flips' has 3 values for 2 pairs"):
        sidecar.add("flips", pairs, strength=PerModel([0.1, 0.2, 0.3]))
    with pytest.raises(ValueError, match="'type' of group 'flips' has 1 values for 2 pairs"):
        sidecar.add("flips", pairs, type=["color"])


def _rescored(pairs, rng):
    """A later model's copy of the pairs (ModelRun.pairs: the same lists), with its own similarities."""
    import copy

    out = copy.copy(pairs)
    base = {}
    out.base_sim = np.array([base.setdefault(key, rng.normal()) for key in zip(pairs.rec, pairs.cap)])
    out.sim = rng.normal(size=len(pairs))
    return out


def test_later_models_score_files_reuse_the_layout_and_equal_a_fresh_one():
    rng = np.random.default_rng(5)
    records, para, flips, combined, flip_types, strength = _score_groups(rng)
    KEPT.score_layout = None
    layouts = []
    for model in range(4):  # a run's models: the same pair lists and labels, new similarities
        p, f, c = (_rescored(x, rng) for x in (para, flips, combined))
        labels = flip_types if model != 2 else ["number"] * len(flips)  # changed labels: a layout of their own
        sub = f.subset(np.flatnonzero(np.arange(len(f)) % 3))  # (the same subset for every model: the same lists)
        strength = np.round(rng.random(len(sub)), 6)  # a label of this model's own
        files = []
        for sidecar, per_model in ((_DictSidecar(records), lambda v: v), (ScoreSidecar(records), PerModel)):
            sidecar.add("paraphrases", p, kind=p.label)
            sidecar.add(
                "flips", sub, type=[labels[j] for j in range(len(f)) if j % 3], strength=per_model(strength), n=sub.cap
            )
            sidecar.add(
                "combined", c, strength=per_model(-strength[: len(c)] * 1e-7), last=per_model(strength[: len(c)])
            )
            files.append(list(sidecar.lines()))
        assert files[0] == files[1]
        layouts.append(KEPT.score_layout[1])
    assert layouts[1] is layouts[0] and layouts[2] is not layouts[0] and layouts[3] is not layouts[2]
    sub = flips.subset(list(range(0, len(flips), 2)))  # (a model whose failed images dropped pairs: other lists)
    sub.base_sim, sub.sim = rng.normal(size=len(sub)), rng.normal(size=len(sub))
    files = []
    for sidecar in (_DictSidecar(records), ScoreSidecar(records)):
        sidecar.add("flips", sub, type=sub.label)
        files.append(list(sidecar.lines()))
    assert files[0] == files[1] and KEPT.score_layout[1] not in layouts


def test_rounded_similarities_are_written_as_round_and_repr_write_them():
    rng = np.random.default_rng(11)
    ties = (rng.integers(-(10**6), 10**6, size=20000) + 0.5) / 1e6  # x.xxxxxx5: round half to even, on the binary value
    edges = np.array(
        [0.0, -0.0, 2e-4, -2e-4, 1e-4, 5e-7, -5e-7, 0.99, -0.99, 0.9999995, 1.0, -1.0, 1.5, np.nan, np.inf, -np.inf]
    )
    values = np.concatenate(
        [
            rng.normal(0.2, 0.15, 50000),
            rng.normal(size=20000) * 10.0 ** rng.integers(-9, 3, size=20000),
            ties,
            np.nextafter(ties, 2),
            np.nextafter(ties, -2),
            edges,
            np.nextafter(edges, 2),
            np.nextafter(edges, -2),
        ]
    )
    assert _rounded_json(values) == _json_values(_rounded(values))
    assert _rounded_json(np.clip(values, -1e30, 1e30).astype(np.float32)) == _json_values(
        _rounded(np.clip(values, -1e30, 1e30).astype(np.float32))
    )
