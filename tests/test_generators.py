"""The three generators against the published outputs in tests/fixtures/reference/."""

import json
import os
import random

import pytest

from lgip.method import (
    COLORS,
    FLIP_TYPES,
    NUMBER_WORDS,
    OBJECTS,
    advanced_paraphrases,
    passive_paraphrases,
    simple_paraphrases,
    synonym_paraphrases,
    typed_flips,
)
from conftest import BASE_JSONL, REFERENCE, run_script

GENERATORS = [
    ("diff_gen_caption.py", "fixture_with_perturb.jsonl"),
    ("make_perturb_with_fliptypes.py", "fixture_with_fliptypes.jsonl"),
]
ENHANCED = "rebuttal_enhanced_perturb_with_fliptypes.py"
ENHANCED_REF = os.path.join(REFERENCE, "rebuttal_enhanced_fixture_with_fliptypes.jsonl")


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def load(path):
    return [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]


@pytest.mark.parametrize("script,reference", GENERATORS)
def test_byte_identical_to_published(tmp_path, script, reference):
    out = tmp_path / "out.jsonl"
    proc = run_script(script, f"--INPUT_JSONL={BASE_JSONL}", f"--OUTPUT_JSONL={out}")
    assert read_bytes(out) == read_bytes(os.path.join(REFERENCE, reference))
    assert "12 records, 60 captions" in proc.stdout and "records/s" in proc.stdout
    meta = json.load(open(str(out) + ".meta.json"))
    assert meta["config"]["SEED"] == 42 and meta["counts"]["records"] == 12
    assert "python" in meta["versions"]


def test_enhanced_in_published_set_order_is_byte_identical(tmp_path):
    """With the published set order and the fixtures' hash seed, everything else (RNG stream,
    combined_caps) must match the published output exactly."""
    out = tmp_path / "out.jsonl"
    run_script(
        ENHANCED,
        f"--INPUT_JSONL={BASE_JSONL}",
        f"--OUTPUT_JSONL={out}",
        "--PARAPHRASE_ORDER='set'",
        env={"PYTHONHASHSEED": "0"},
    )
    assert read_bytes(out) == read_bytes(ENHANCED_REF)


def test_enhanced_is_independent_of_hash_seed(tmp_path):
    outputs = []
    for seed in ("0", "1", "12345"):
        out = tmp_path / f"out{seed}.jsonl"
        run_script(ENHANCED, f"--INPUT_JSONL={BASE_JSONL}", f"--OUTPUT_JSONL={out}", env={"PYTHONHASHSEED": seed})
        outputs.append(read_bytes(out))
    assert outputs[0] == outputs[1] == outputs[2]


def test_enhanced_draws_from_published_candidate_pool(tmp_path):
    out = tmp_path / "out.jsonl"
    run_script(ENHANCED, f"--INPUT_JSONL={BASE_JSONL}", f"--OUTPUT_JSONL={out}")
    ours, ref = load(out), load(ENHANCED_REF)
    assert len(ours) == len(ref) == 12
    for mine, theirs in zip(ours, ref):
        for i, c in enumerate(mine["orig_captions"]):
            # flips: the same words flipped as published (the new word follows the RNG stream)
            for t in FLIP_TYPES:
                allowed = possible_flips(c)
                for ours_f, theirs_f in zip(
                    mine["diff_caps_" + t][str(i)], theirs["diff_caps_" + t][str(i)], strict=True
                ):
                    assert (ours_f, t) in allowed and (theirs_f, t) in allowed
            pool = set(advanced_paraphrases(c, "set"))
            assert set(theirs["same_caps"][str(i)]) <= pool  # the pool is the published one
            same = mine["same_caps"][str(i)]
            assert set(same) <= pool and len(set(same)) == len(same)
            assert len(same) == min(6, len([p for p in pool if p.strip() != c.strip()]))
            combos = {(f, "para+" + t, p) for p in pool for f, t in possible_flips(p)}
            for item in mine["combined_caps"][str(i)] + theirs["combined_caps"][str(i)]:
                assert (item["text"], item["combined_type"], item["intermediate_para"]) in combos, item


class _Forced:
    """Stands in for the RNG: choice() returns `word` when it may, else the first option."""

    def __init__(self, word):
        self.word = word

    def choice(self, seq):
        return self.word if self.word in seq else seq[0]


def possible_flips(c):
    """Every (text, type) any RNG state could make of c."""
    words = COLORS + NUMBER_WORDS + OBJECTS
    return {flip for w in words for flip in typed_flips(c, _Forced(w))}


def test_typed_flips_consume_one_choice_per_matching_list():
    rng_a, rng_b = random.Random(7), random.Random(7)
    flips = typed_flips("two red dog", rng_a)
    assert [t for _, t in flips] == ["color", "number", "object"]
    for _ in range(3):
        rng_b.choice([0])
    assert rng_a.getstate() == rng_b.getstate()
    assert typed_flips("a kitchen", rng_a) == []


def test_paraphrases_rules():
    assert "dog" not in simple_paraphrases("dog")  # len("dog") < 5 is dropped
    assert passive_paraphrases("A cat sits on a computer.") == ["A a computer sits on cat."]  # as published
    assert "A feline sits on a computer." in synonym_paraphrases("A cat sits on a computer.")
    assert "A feline rests on a computer." in synonym_paraphrases("A cat sits on a computer.")
