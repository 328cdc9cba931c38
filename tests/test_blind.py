"""blind_audit.py and lgip/blind.py (LGIP_SPEC.md 15): each scorer restated on small hand-made records (the
n-gram model's probabilities by hand, Witten-Bell's back-off, the edit words' weights), the folds (a pair is
never scored by a model that saw its own image's captions), planted artifacts found by the scorer that should
see them, the figures and intervals as the spec writes them, and bad input stopped before anything is written."""

import json
import math

import numpy as np
import pytest

from conftest import run_here
from lgip import blind
from lgip.errors import ConfigError, InputError

COLORS = ["red", "green", "blue", "yellow", "black", "white"]
THINGS = ["car", "dog", "cat", "bus", "boat", "kite", "bench", "horse"]


def _records(n=60):
    """n records, two captions each; a color flip swaps the color word for "purple" (a word no caption has),
    a number flip adds the word "two" (one word longer), both in `diff_caps` too."""
    out = []
    for r in range(n):
        caps = [
            f"a {COLORS[r % 6]} {THINGS[r % 8]} near the road",
            f"the {THINGS[(r + 3) % 8]} is {COLORS[(r + 1) % 6]}",
        ]
        color = {str(i): [c.replace(c.split()[1 if i == 0 else 3], "purple")] for i, c in enumerate(caps)}
        number = {str(i): ["two " + c] for i, c in enumerate(caps)}
        out.append(
            {
                "image_id": r,
                "image_path": f"images/{r:06d}.jpg",
                "orig_captions": caps,
                "diff_caps": {str(i): color[str(i)] + number[str(i)] for i in range(2)},
                "diff_caps_color": color,
                "diff_caps_number": number,
            }
        )
    return out


def _write(tmp_path, records, name="x_with_fliptypes.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_the_bigram_models_probabilities_by_hand_and_witten_bells_back_off():
    m = blind.NGram(2, ["a b", "a c"])
    # unigrams: a 2, b 1, c 1, </s> 2 (N = 6, V = 4): P_1(w) = (c + 1) / 11
    assert m.prob("a", ()) == pytest.approx(3 / 11) and m.prob("zzz", ()) == pytest.approx(1 / 11)
    assert m.prob("b", ("a",)) == pytest.approx((1 + 2 * 2 / 11) / (2 + 2))  # c(a) = 2, T(a) = 2
    assert m.prob("a", ("<s>",)) == pytest.approx((2 + 1 * 3 / 11) / (2 + 1))
    assert m.prob("</s>", ("d",)) == pytest.approx(3 / 11)  # an unseen history: P_1
    expected = (math.log(25 / 33) + math.log(15 / 44) + math.log(7 / 11)) / 3
    assert m.score("A b!") == pytest.approx(expected)  # (words: lower-cased runs of letters and digits)
    assert m.score("d") == pytest.approx((math.log((1 / 11) / 3) + math.log(3 / 11)) / 2)
    assert blind.NGram(3, []).score("anything") == 0.0  # an empty corpus: all ties
    assert blind.words("A dog_s 2nd-floor, café") == ["a", "dog", "s", "2nd", "floor", "café"]


def test_folds_keep_a_records_captions_out_of_its_own_model():
    records = [(r + 1, rec) for r, rec in enumerate(_records(30))]
    folds = [blind.fold_of(rec, 5) for _, rec in records]
    assert folds == [blind.fold_of(dict(rec, image_path="elsewhere.jpg"), 5) for _, rec in records]  # by image_id
    assert blind.fold_of({"image_id": True, "image_path": "p.jpg"}, 7) == blind.fold_of({"image_path": "p.jpg"}, 7)
    corpora = blind.fold_corpora(records, folds, 5, extra=["one more line"])
    for k, corpus in enumerate(corpora):
        own = {c for r, (_, rec) in enumerate(records) if folds[r] == k for c in rec["orig_captions"]}
        others = [c for r, (_, rec) in enumerate(records) if folds[r] != k for c in rec["orig_captions"]]
        assert not (own - set(others)) & set(corpus) and corpus == others + ["one more line"]  # (a caption
        # repeated by a record of another fold is that record's)
    pairs, types = blind.blind_pairs(records)
    assert types == ["color", "number"] and len(pairs) == 30 * 2 * 2
    assert [(p.r, p.i, p.t) for p in pairs[:4]] == [
        (0, 0, "color"),
        (0, 0, "number"),
        (0, 1, "color"),
        (0, 1, "number"),
    ]


def test_planted_artifacts_are_found_by_the_scorer_that_should_see_them(tmp_path):
    src = _write(tmp_path, _records())
    m, out, _ = run_here("blind_audit.py", JSONL_PATH=str(src), SCORERS=["length", "ngram1", "ngram3", "edit"])
    by = m["by_scorer"]
    assert by["length"]["number"]["acc_untied"] == 1.0 and by["length"]["color"]["scored"] == 120
    assert by["length"]["color"]["ties"] == 120 and by["length"]["color"]["acc_untied"] is None  # (a swap: a tie)
    assert by["ngram1"]["color"]["acc_untied"] >= 0.9  # "purple" is in no caption: an unseen word
    assert by["edit"]["color"]["acc_untied"] >= 0.9 and by["edit"]["number"]["acc_untied"] >= 0.9
    assert "  length: acc_untied 1.000 [1.000, 1.000], ties 0.500 (color n/a, number 1.000)" in out.splitlines()
    lines = [json.loads(x) for x in open(tmp_path / "x_with_fliptypes__LGIP_blind.gaps.jsonl", encoding="utf-8")]
    assert len(lines) == m["num_pairs"] == 240 and lines[0]["line"] == 1 and set(lines[0]["gaps"]) == set(by)
    assert m["types"] == ["color", "number"] and sum(m["folds"]) == 60 and len(m["input_sha256"]) == 64


def test_the_figures_and_their_intervals_as_the_spec_writes_them(tmp_path):
    records = _records(12)
    src = _write(tmp_path, records)
    m, _, _ = run_here("blind_audit.py", JSONL_PATH=str(src), SCORERS=["ngram1"], BOOTSTRAP=200, BOOTSTRAP_SEED=3)
    block = m["by_scorer"]["ngram1"]["all"]
    lines = [json.loads(x) for x in open(tmp_path / "x_with_fliptypes__LGIP_blind.gaps.jsonl", encoding="utf-8")]
    g = np.array([x["gaps"]["ngram1"] for x in lines])
    rec = np.array([x["record"] for x in lines])
    assert block["right"] == (g > 0).sum() and block["wrong"] == (g < 0).sum() and block["ties"] == (g == 0).sum()
    assert block["acc"] == pytest.approx((g > 0).mean())
    used = np.unique(rec)
    right = np.array([(g[rec == r] > 0).sum() for r in used], dtype=float)
    count = np.array([(rec == r).sum() for r in used], dtype=float)
    w = np.random.default_rng(3).multinomial(len(used), np.full(len(used), 1.0 / len(used)), size=200)
    assert block["acc_ci95"] == pytest.approx(list(np.quantile((w @ right) / (w @ count), [0.025, 0.975])))
    assert list(block) == [
        "count", "scored", "right", "wrong", "ties", "num_images", "acc", "acc_ci95", "tie_rate", "acc_untied",
        "acc_untied_ci95",
    ]  # fmt: skip


def test_an_untyped_input_is_one_type_all_and_bad_input_stops_before_writing(tmp_path):
    untyped = [{k: v for k, v in r.items() if not k.startswith("diff_caps_")} for r in _records(10)]
    src = _write(tmp_path, untyped, "y_with_perturb.jsonl")
    m, _, _ = run_here("blind_audit.py", JSONL_PATH=str(src), SCORERS=["length"], BOOTSTRAP=0)
    assert m["types"] == ["all"] and list(m["by_scorer"]["length"]) == ["all"]
    assert m["by_scorer"]["length"]["all"]["acc_ci95"] is None  # (BOOTSTRAP 0)
    bad = tmp_path / "bad"
    bad.mkdir()
    src = _write(bad, _records(5))
    for settings, error, words in (
        ({"SCORERS": ["lenght"]}, ConfigError, "did you mean 'length'"),
        ({"SCORERS": ["ngram7"]}, ConfigError, "n is 1 to 5"),
        ({"SCORERS": ["edit", "edit"]}, ConfigError, "named twice"),
        ({"FOLDS": 1}, ConfigError, "FOLDS must be an int >= 2"),
        ({"NGRAM_CORPUS": str(bad / "none.txt")}, InputError, "is not a file"),
    ):
        with pytest.raises(error, match=words):
            run_here("blind_audit.py", JSONL_PATH=str(src), **settings)
    no_flips = [dict(r, diff_caps={}, diff_caps_color={}, diff_caps_number={}) for r in _records(3)]
    with pytest.raises(InputError, match="no pair to audit"):
        run_here("blind_audit.py", JSONL_PATH=str(_write(bad, no_flips, "z.jsonl")))
    assert sorted(p.name for p in bad.iterdir()) == ["x_with_fliptypes.jsonl", "z.jsonl"]


def test_a_corpus_line_equal_to_a_caption_is_dropped_and_counted(tmp_path):
    records = _records(10)
    src = _write(tmp_path, records)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(records[0]["orig_captions"][0].upper() + "\n\nsomething else entirely\n", encoding="utf-8")
    m, _, _ = run_here("blind_audit.py", JSONL_PATH=str(src), SCORERS=["ngram2"], NGRAM_CORPUS=str(corpus))
    assert m["corpus_lines"] == 1 and m["corpus_lines_dropped"] == 1


def test_the_reports_section_says_each_scorer_and_a_sentence_per_type(tmp_path):
    from lgip.report import blind_file, blind_lines, load_blind

    base = tmp_path / "x.jsonl"
    src = _write(tmp_path, _records())
    assert blind_file(str(base)) is None and blind_lines(load_blind(None)) is None
    run_here("blind_audit.py", JSONL_PATH=str(src), SCORERS=["length", "ngram1"], BOOTSTRAP=100)
    lines = blind_lines(load_blind(blind_file(str(base))))  # (found beside the base's _with_fliptypes file)
    assert lines["header"] == ["Scorer", "all", "color", "number"] and [r["label"] for r in lines["rows"]] == [
        "length",
        "ngram1",
    ]
    assert lines["rows"][0]["cells"][1] == {"text": "n/a", "ci": ""}  # (a swap: every color pair a tie)
    assert (
        "A word-length rule (the shorter text wins) picks the true caption in 100% of number flips "
        "(95% interval 100% to 100%, above chance)."
    ) in lines["sentences"]
    assert "Ties on every color pair: length." in lines["sentences"]
    bad = tmp_path / "x_with_fliptypes__LGIP_blind.metrics.json"
    data = json.loads(bad.read_text(encoding="utf-8"))
    data["by_scorer"]["ngram1"]["color"]["acc_untied"] = 1.5
    bad.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(InputError, match=r"by_scorer.ngram1.color.acc_untied: not a rate in \[0, 1\]: 1.5"):
        load_blind(str(bad))


def test_a_scorer_reliably_wrong_is_said_as_one_reliably_right():
    from lgip.report.blind_text import type_sentences

    scorers = {
        "length": {"number": (None, None, 1.0, 40)},
        "ngram1": {"number": (0.077, [0.023, 0.162], 0.0, 40)},
        "ngram3": {"number": (0.52, [0.3, 0.7], 0.1, 40)},
    }
    said = type_sentences(scorers, "number")
    assert said[0].startswith(
        "A unigram model of the other images' captions picks the true caption in only 8% of number flips "
        "(95% interval 2% to 16%, below chance): reliably wrong"
    )
    assert said[1:] == ["Ties on every number pair: length."]  # (ngram3 at chance: no sentence while one is told)
    scorers["ngram1"]["number"] = (0.45, [0.3, 0.6], 0.0, 40)
    assert type_sentences(scorers, "number")[0] == (
        "No scorer is told from chance: the best, ngram3, picks the true caption in 52% of number flips "
        "(95% interval 30% to 70%)."
    )


def test_the_edit_words_weights_by_hand():
    """r0 (fold 0) swaps red -> blue; r1 (fold 1) red -> green; r2 (fold 1) two -> three. For r0, the other
    fold took red out once and put blue in never: g = 1 * log 2 - 1 * (log 1 - log 1) = log 2; for r1 the same
    from fold 0; for r2 neither word was edited elsewhere: a tie."""
    pairs = [
        blind.Pair(0, 0, "color", 0, "a red car", "a blue car"),
        blind.Pair(1, 0, "color", 0, "red bus", "green bus"),
        blind.Pair(2, 0, "number", 0, "two dogs", "three dogs"),
    ]
    assert blind.edit_gaps(pairs, [0, 1, 1], 2) == [round(math.log(2), 9), round(math.log(2), 9), 0.0]
    assert blind.length_gaps([blind.Pair(0, 0, "t", 0, "a b", "a b c")]) == [1.0]


def test_the_ngram_memo_gives_the_plain_gaps(monkeypatch):
    """NGRAM_MEMO (lgip/accelerations.py): each probability computed once, the same floats as the plain path."""
    from lgip import accelerations

    records = [(r + 1, rec) for r, rec in enumerate(_records(30))]
    pairs, _ = blind.blind_pairs(records)
    folds = [blind.fold_of(rec, 3) for _, rec in records]
    corpora = blind.fold_corpora(records, folds, 3)
    got = {}
    for memo in (False, True):
        monkeypatch.setattr(accelerations, "NGRAM_MEMO", memo)
        got[memo] = [blind.ngram_gaps(pairs, corpora, folds, n) for n in (1, 3)]
    assert got[True] == got[False]
