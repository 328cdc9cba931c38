"""lgip/models/families.py: a model type is one record. A new family registered here (as its own module would
register it) runs through every part of a run (the settings check, the Hub check, the loader, the scorer, the
card) with nothing else added; its figures are the wrapped model's."""

import dataclasses
import json
import shutil

import pytest

from conftest import OPENCLIP_TINY, REFERENCE, eval_settings, run_here
from lgip.errors import ConfigError, ModelError
from lgip.models import FAMILIES, Family, family, register
from lgip.models.encoder import _Model
from lgip.scorers import PairScorer, Scored
from lgip.models.openclip import load_openclip


def _load_mine(spec, protocol, device, dtype):
    """A family of one's own: an open_clip folder given as "weights" (the tiny fixture model)."""
    return load_openclip(dict(spec, type="openclip", model_name=spec["weights"]), protocol, device, dtype)


def _mine_card(spec, model, enc):
    return {"architecture": "mine-arch", "params_total": sum(p.numel() for p in model.parameters()) if model else None}


@pytest.fixture
def mine(monkeypatch):
    record = Family(
        "mine",
        required="weights",
        options=("size",),
        load=_load_mine,
        named=lambda spec: {"pretrained": spec["weights"]},
        card=_mine_card,
        score_kind=lambda spec: "cosine",
    )
    monkeypatch.setitem(FAMILIES, "mine", record)  # (register() adds it for the process; the test's ends with it)
    return record


def test_a_new_family_is_one_record(tmp_path, mine):
    src = tmp_path / "x_with_perturb.jsonl"
    shutil.copy(REFERENCE + "/fixture_with_perturb.jsonl", src)
    spec = {"name": "mine_tiny", "type": "mine", "weights": OPENCLIP_TINY["model_name"]}
    rows, _, _ = run_here(
        "run_lgip_multi.py", **eval_settings(src, "corrected", [spec, OPENCLIP_TINY], BOOTSTRAP=0, CACHE_DIR=None)
    )
    ours, theirs = rows
    card = ours["model_card"]
    assert card["source"] == "mine" and card["architecture"] == "mine-arch" and card["params_total"] > 0
    assert card["pretrained"] == spec["weights"] and card["score_kind"] == "cosine"
    for key in ("invariance_error_mean", "sensitivity_gap_mean", "sensitivity_pos_rate"):
        assert ours[key] == theirs[key]  # (the same weights, loaded by the new family)
    saved = json.load(open(tmp_path / "x_with_perturb__LGIP_ALL.metrics.json"))
    assert [r["model_tag"] for r in saved] == ["mine_tiny", "tiny_openclip"]


def test_a_spec_of_a_family_is_checked_by_its_record(tmp_path, mine):
    src = tmp_path / "x_with_perturb.jsonl"
    shutil.copy(REFERENCE + "/fixture_with_perturb.jsonl", src)
    with pytest.raises(ConfigError, match=r"type .mine. needs .weights."):
        run_here("run_lgip_multi.py", **eval_settings(src, "corrected", [{"name": "m", "type": "mine"}]))
    with pytest.raises(ConfigError, match=r"colour.*size"):
        run_here(
            "run_lgip_multi.py",
            **eval_settings(src, "corrected", [{"name": "m", "type": "mine", "weights": "x", "colour": 1}]),
        )
    with pytest.raises(ModelError, match=r"unknown type 'mien'; valid: openclip, .*itm, causal_lm, mine"):
        family({"name": "m", "type": "mien"})


def test_the_registered_families_and_register_refuses_what_is_not_a_record():
    assert list(FAMILIES)[:6] == ["openclip", "transformers", "siglip", "python", "generative", "itm"]
    assert [FAMILIES[t].scorer for t in ("openclip", "siglip", "python", "generative", "itm")] == [
        "embeddings",
        "embeddings",
        "embeddings",
        "joint",
        "joint",
    ]
    assert FAMILIES["itm"].spec_keys() == ("name", "type", "model_id", "card", "demo")
    with pytest.raises(TypeError):
        register({"type": "x"})
    with pytest.raises(TypeError, match="scorer is a scorer kind's name or a PairScorer class"):
        register(dataclasses.replace(FAMILIES["openclip"], type="x", scorer=5))
    assert "x" not in FAMILIES


def test_a_scorer_kind_that_is_not_registered_is_an_error_naming_the_valid_ones(monkeypatch):
    from lgip.scorers import scorer_for

    monkeypatch.setitem(FAMILIES, "x", dataclasses.replace(FAMILIES["openclip"], type="x", scorer="pairs"))
    with pytest.raises(ValueError, match="family 'x': unknown scorer 'pairs'; valid: embeddings, joint"):
        scorer_for({"name": "m", "type": "x"})


class _Rule(_Model):
    """A text-only "model": no weights, no image; its score of a text is minus its length in words."""

    weights_loaded = True
    score_kind = "rule"

    def __init__(self, device):
        self.device, self.info = device, {}


def _minus_words(text):
    return -float(len(text.split()))


class _TextOnlyScorer(PairScorer):
    """A third kind of scorer (section 15's blind scorers are of this kind): it reads no image, and gives
    scores alone; every record with captions counts as read."""

    def values(self, ctx, wanted):
        """({text: its score} of the unique texts `wanted`, Scored.looked): the rule's, minus the words."""
        return {t: _minus_words(t) for t in wanted}, {}

    def score(self, ctx, request):
        import numpy as np

        texts = ctx.bank.calls.texts
        wanted = sorted(set(texts))
        value, looked = self.values(ctx, wanted)
        for pairs in request.pairs:
            pairs.base_sim = np.array([value[texts[b]] for b in pairs.base_slot])
            pairs.sim = np.array([value[t] for t in pairs.text])
            pairs.labels = np.array(pairs.label, dtype=object)
        ok = list(ctx.mine)
        return Scored(
            pairs=list(request.pairs),
            ok=ok,
            failed=[],
            n_ok=len(ok),
            n_samples=sum(1 for k in ok if ctx.records[k][1]["orig_captions"]),
            image_report={"num_failed_images": 0, "failed_images": []},
            texts={"unique": len(wanted), "encoded": len(wanted), "positions": {}},
            nonfinite={"images": 0, "texts": 0, "first_image": None, "first_text": None},
            provides=self.provides,
            looked=looked,
        )


def test_a_new_scorer_kind_is_its_module_and_its_family_record(tmp_path, monkeypatch):
    """A scorer of a new kind (here a text-only one: the class and the record below, nothing else of lgip
    touched) runs through the evaluations; its figures are its rule's, restated here; a step that needs
    embeddings leaves it out in a line."""
    import numpy as np

    record = Family(
        "rule", required="words", load=lambda spec, protocol, device, dtype: _Rule(device), scorer=_TextOnlyScorer
    )
    monkeypatch.setitem(FAMILIES, "rule", record)
    src = tmp_path / "x_with_perturb.jsonl"
    shutil.copy(REFERENCE + "/fixture_with_perturb.jsonl", src)
    spec = {"name": "by_length", "type": "rule", "words": "split"}
    (row,), _, _ = run_here("run_lgip_multi.py", **eval_settings(src, "corrected", [spec], BOOTSTRAP=0))
    errors, gaps = [], []
    for line in open(src, encoding="utf-8"):
        rec = json.loads(line)
        for i, cap in enumerate(rec["orig_captions"]):
            n = len(cap.split())
            errors += [abs(n - len(t.split())) for t in rec["same_caps"].get(str(i), [])]
            gaps += [len(t.split()) - n for t in rec["diff_caps"].get(str(i), [])]
    assert row["model_tag"] == "by_length" and row["score_kind"] == "rule"
    assert row["invariance_error_mean"] == pytest.approx(np.mean(errors))
    assert row["sensitivity_gap_mean"] == pytest.approx(np.mean(gaps))
    assert row["sensitivity_pos_rate"] == pytest.approx(np.mean(np.array(gaps) > 0))
    got, out, _ = run_here("run_lgip_retrieval.py", **eval_settings(src, "corrected", [spec]))
    assert got is None
    assert "model 'by_length' (type 'rule') is left out: its scorer gives no embeddings" in out


class _RuleWeights(_Rule):
    """The rule "model" with weights to load (its loads counted) and without (its KeyEncoder, a re-run's)."""

    loads = []

    def __init__(self, device, loaded=True):
        super().__init__(device)
        self.weights_loaded = loaded
        if loaded:
            _RuleWeights.loads.append(1)


class _CachedTextOnlyScorer(_TextOnlyScorer):
    """The text-only scorer computing its rule through the cache (ctx.cache.through: lm-eval's CachingLM), nothing
    else of caching written: what it computes is counted."""

    computed = []

    def values(self, ctx, wanted):
        def compute(todo):
            ctx.load_weights()
            _CachedTextOnlyScorer.computed.extend(wanted[p] for p in todo)
            return [[_minus_words(wanted[p])] for p in todo]

        rows = ctx.cache.through("text", ["rule|" + t for t in wanted], compute)
        return {t: row[0] for t, row in zip(wanted, rows)}, {"texts": len(wanted)}


def test_a_new_scorer_kind_gets_the_cache_from_the_wrapper_around_it(tmp_path, monkeypatch):
    """The cache is wrapped around any scorer (lgip.scorers.cached): a scorer that computes through
    ctx.cache.through computes each text once; the re-run reads them all from the cache, loads no weights, says
    so and records it in its run block; without a cache (CACHE_DIR None) every run computes them all."""
    record = Family(
        "cached_rule",
        required="words",
        load=lambda spec, protocol, device, dtype: _RuleWeights(device),
        keys=lambda spec, protocol: _RuleWeights("cpu", loaded=False),
        scorer=_CachedTextOnlyScorer,
    )
    monkeypatch.setitem(FAMILIES, "cached_rule", record)
    monkeypatch.setattr(_RuleWeights, "loads", [])
    monkeypatch.setattr(_CachedTextOnlyScorer, "computed", [])
    src = tmp_path / "x_with_perturb.jsonl"
    shutil.copy(REFERENCE + "/fixture_with_perturb.jsonl", src)
    spec = {"name": "by_length", "type": "cached_rule", "words": "split"}
    settings = eval_settings(src, "corrected", [spec], BOOTSTRAP=0, CACHE_DIR=str(tmp_path / "cache"))
    (first,), _, _ = run_here("run_lgip_multi.py", **settings)
    n = len(_CachedTextOnlyScorer.computed)
    assert n > 0 and len(set(_CachedTextOnlyScorer.computed)) == n and _RuleWeights.loads == [1]
    assert first["run"]["cache"]["resumed"] == {"texts": [0, n]}
    (again,), out, _ = run_here("run_lgip_multi.py", **settings)
    assert len(_CachedTextOnlyScorer.computed) == n and _RuleWeights.loads == [1]  # (nothing computed, no load)
    assert again["run"]["cache"]["resumed"] == {"texts": [n, n]} and again["run"]["cache"]["text_hits"] == n
    assert f"by_length: from the cache: {n:,} of {n:,} texts (all of them: the model's weights were not loaded)" in out
    for key in ("invariance_error_mean", "sensitivity_gap_mean", "sensitivity_pos_rate"):
        assert again[key] == first[key]
    (plain,), _, _ = run_here("run_lgip_multi.py", **dict(settings, CACHE_DIR=None))
    assert len(_CachedTextOnlyScorer.computed) == 2 * n and _RuleWeights.loads == [1, 1]
    assert "cache" not in plain["run"] and plain["sensitivity_gap_mean"] == first["sensitivity_gap_mean"]
