"""Word attribution of flips (LGIP_SPEC.md section 8): token scores against plain restatements written
here (open_clip: a hand-written float64 forward; SigLIP and transformers CLIP: the model's own eager
forward with output_attentions), a finite-difference check of dS/dA, tokens put on words, and
explain_flips.py's lines and figures."""

import copy
import json
import math
import os

import pytest
import torch

from conftest import FIXTURES, OPENCLIP_TINY, REFERENCE, SIGLIP_TINY, run_here
from lgip import attribution
from lgip.models.encoder import Encoder
from lgip.errors import ModelError

TEXTS = ["A red bus parked on the side of the street.", "two  DOGS, one cat!!", "a dog"]


@pytest.fixture(scope="module")
def siglip():
    from lgip.models import load_model

    return load_model(SIGLIP_TINY, "corrected", "cpu")


def _tiny_transformers_clip(enc, name):
    """A tiny random-init transformers CLIPModel or MetaClip2Model (eager attention) fed the
    open_clip tokenizer's ids (the same BPE vocabulary), wrapped as an Encoder as a loader would."""
    import transformers

    config, model = getattr(transformers, name + "Config"), getattr(transformers, name + "Model")
    cfg = config(
        text_config=dict(
            vocab_size=49408,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            max_position_embeddings=77,
            bos_token_id=49406,
            eos_token_id=49407,
            pad_token_id=0,
        ),
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=32,
            patch_size=16,
        ),
        projection_dim=16,
    )
    torch.manual_seed(0)
    return _encoder(model._from_config(cfg, attn_implementation="eager").eval(), enc.tokenize, 0, lambda lengths: None)


def _encoder(model, tokenize, pad_id, pad_length):
    """A tiny model wrapped as an Encoder as a loader would, for what attribution reads of it."""
    return Encoder(
        model=model,
        device="cpu",
        dtype=None,
        tokenizer=None,
        image_transform=None,
        tokenize=tokenize,
        encode_tokens=None,
        encode_images=None,
        pad_id=pad_id,
        pad_length=pad_length,
        text_key_tag="",
    )


@pytest.fixture(scope="module")
def hf_clip(enc):
    return _tiny_transformers_clip(enc, "CLIP")


@pytest.fixture(scope="module")
def metaclip2(enc):
    return _tiny_transformers_clip(enc, "MetaClip2")


@pytest.fixture(scope="module")
def siglip2(siglip):
    """A tiny random-init transformers Siglip2Model fed the SigLIP fixture's ids, padded to 64."""
    from transformers import Siglip2Config, Siglip2Model

    cfg = Siglip2Config(
        text_config=dict(
            vocab_size=400,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            max_position_embeddings=64,
        ),
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            patch_size=16,
            num_patches=4,
        ),
    )
    torch.manual_seed(0)
    return _encoder(
        Siglip2Model._from_config(cfg, attn_implementation="eager").eval(),
        siglip.tokenize,
        siglip.pad_id,
        siglip.pad_length,
    )


@pytest.fixture(scope="module")
def custom_text(enc):
    """A tiny random-init open_clip CustomTextCLIP (EVA02's kind: the text tower in model.text)."""
    import open_clip

    torch.manual_seed(0)
    model = open_clip.CustomTextCLIP(
        16,
        dict(layers=1, width=32, patch_size=16, image_size=32, head_width=16),
        dict(context_length=77, vocab_size=49408, width=32, heads=2, layers=2),
    ).eval()
    return _encoder(model, enc.tokenize, 0, lambda lengths: None)


def _image(dim, seed=1):
    return torch.randn(1, dim, generator=torch.Generator().manual_seed(seed))


def _ours(e, texts=TEXTS, layers=3):
    als = attribution.align_words(e.tokenize, texts)
    ids = attribution.pad_ids(e, [a.ids for a in als])
    tower = attribution.text_tower(e.model)
    v = _image(tower.reference(ids[:1]).shape[-1]).expand(len(texts), -1)
    s, scores = attribution.attribute(tower, ids, v, layers)
    return ids, v, s, scores


def _restated_openclip(model, ids, v, layers):
    """open_clip's text tower written out in float64; each kept layer's probabilities A are used as
    A * (1 + g) with g = 0, so dS/dg = dS/dA * A: the token scores by another route."""
    m = copy.deepcopy(model).double()
    tw = getattr(m, "text", m)  # (CustomTextCLIP: its text tower)
    n, length = ids.shape
    width = tw.token_embedding.weight.shape[1]
    x = tw.token_embedding(ids) + tw.positional_embedding[:length]
    mask = torch.full((length, length), -math.inf, dtype=torch.float64).triu(1)
    blocks = list(tw.transformer.resblocks)
    gates = []
    for l, blk in enumerate(blocks):
        heads = blk.attn.num_heads
        q, k, val = (blk.ln_1(x) @ blk.attn.in_proj_weight.T + blk.attn.in_proj_bias).split(width, dim=-1)
        q, k, val = (t.view(n, length, heads, width // heads).permute(0, 2, 1, 3) for t in (q, k, val))
        probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(width // heads) + mask, dim=-1)
        if l >= len(blocks) - layers:
            gates.append(torch.zeros_like(probs, requires_grad=True))
            probs = probs * (1 + gates[-1])
        x = x + blk.ls_1(blk.attn.out_proj((probs @ val).permute(0, 2, 1, 3).reshape(n, length, width)))
        x = x + blk.ls_2(blk.mlp(blk.ln_2(x)))
    eot = ids.argmax(dim=-1)
    t = tw.ln_final(x[torch.arange(n), eot])
    t = tw.text_projection(t) if isinstance(tw.text_projection, torch.nn.Linear) else t @ tw.text_projection
    full = torch.zeros(n, 77, dtype=torch.long)
    full[:, :length] = ids
    with torch.no_grad():  # the restatement is the tower
        assert torch.allclose(t, m.encode_text(full), atol=1e-10)
    s = torch.nn.functional.cosine_similarity(t, v.double(), dim=-1)
    grads = torch.autograd.grad(s.sum(), gates)
    return s, torch.stack([g[torch.arange(n), :, eot].mean(dim=1) for g in grads]).mean(dim=0)


def _restated_transformers(model, ids, v, layers, pooled):
    """The model's own forward with eager attention: dS/dA * A on the probabilities its attention
    modules return (forward hooks), the tensors they multiply the values with. (fp32: transformers'
    CLIP cannot make its causal mask in float64.)"""
    m = copy.deepcopy(model)
    tower = getattr(m.text_model, "text_model", m.text_model)
    for layer in tower.encoder.layers:
        layer.self_attn.config._attn_implementation = "eager"  # (the text config, shared by its layers)
        assert layer.self_attn.config._attn_implementation == "eager"
    kept = []
    hooks = [
        layer.self_attn.register_forward_hook(lambda mod, args, out: kept.append(out[1]))
        for layer in tower.encoder.layers[-layers:]
    ]
    try:  # (transformers CLIP's attention returns its probabilities only when asked to)
        t = m.text_model(input_ids=ids, output_attentions=True).pooler_output
    finally:
        for h in hooks:
            h.remove()
    t = m.text_projection(t) if hasattr(m, "text_projection") else t  # (SigLIP's head is in its text model)
    s = torch.nn.functional.cosine_similarity(t, v, dim=-1)
    grads = torch.autograd.grad(s.sum(), kept)
    rows = torch.arange(ids.shape[0])
    return s, torch.stack([(g * a)[rows, :, pooled].mean(dim=1) for a, g in zip(kept, grads)]).mean(dim=0)


@pytest.mark.parametrize("family", ["enc", "custom_text"])
def test_open_clip_token_scores_equal_a_plain_restatement(family, request):
    e = request.getfixturevalue(family)
    ids, v, s, scores = _ours(e)
    s_ref, ref = _restated_openclip(e.model, ids, v, layers=3)
    assert scores.abs().max() > 1e-3  # (scores of a size the tolerance can tell apart)
    torch.testing.assert_close(scores.double(), ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(s.double(), s_ref, atol=1e-6, rtol=0)
    assert (scores[ids == 0] == 0).all()  # causal: nothing after the end of text (the padding here) counts


@pytest.mark.parametrize("family", ["siglip", "siglip2", "hf_clip", "metaclip2"])
def test_transformers_token_scores_equal_the_models_own_attentions(family, request):
    e = request.getfixturevalue(family)
    ids, v, s, scores = _ours(e, layers=1)  # the last layer only (of 2), then both
    scores_all = _ours(e, layers=2)[3]
    pooled = attribution.text_tower(e.model).pooled(ids)
    siglip_like = family.startswith("siglip")
    assert ids.shape[1] == (64 if siglip_like else max(len(x) for x in e.tokenize(TEXTS)))
    assert (pooled == (ids.shape[1] - 1 if siglip_like else ids.argmax(dim=-1))).all()
    for layers, ours in ((1, scores), (2, scores_all)):
        s_ref, ref = _restated_transformers(e.model, ids, v, layers, pooled)
        assert ours.abs().max() > 1e-4
        torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)
        torch.testing.assert_close(s, s_ref, atol=1e-6, rtol=0)


def test_transformers_clip_pools_as_its_config_says(hf_clip):
    tower = attribution.text_tower(hf_clip.model)
    ids = torch.tensor([[49406, 320, 49407, 49407, 49407], [49406, 7, 320, 7, 49407]])
    assert tower.pooled(ids).tolist() == [2, 4]  # the first end-of-text token
    tower.eos_id = 7
    assert tower.pooled(ids).tolist() == [0, 1]
    hf_clip.model.config.text_config.eos_token_id = 2  # a config from before transformers PR #24773: the highest id
    try:
        hf_clip.model.text_model.eos_token_id = 2
        assert attribution.text_tower(hf_clip.model).pooled(ids).tolist() == [2, 4]
    finally:
        hf_clip.model.text_model.eos_token_id = hf_clip.model.config.text_config.eos_token_id = 49407


@pytest.mark.parametrize("family", ["enc", "custom_text", "siglip", "siglip2", "hf_clip", "metaclip2"])
def test_gradient_of_s_against_finite_differences_of_one_probability(family, request):
    e = request.getfixturevalue(family)
    model = copy.deepcopy(e.model).double()
    tower = attribution.text_tower(model)
    ids = attribution.pad_ids(e, e.tokenize(["a red bus"]))
    v = _image(tower.features(ids).shape[-1]).double()
    _, probs, grads = attribution.attention_grads(tower, ids, v, layers=2)
    p = int(tower.pooled(ids)[0])

    def s_at(layer, head, j, eps):
        def edit(l, a):
            if l != layer:
                return a
            a = a.clone()
            a[0, head, p, j] += eps
            return a

        t = tower.features(ids, edit)
        return float(torch.nn.functional.cosine_similarity(t, v, dim=-1)[0])

    for layer, head, j in ((0, 1, 1), (1, 0, 2)):  # the first one reaches s through the second layer's attention too
        eps = 1e-6
        fd = (s_at(layer, head, j, eps) - s_at(layer, head, j, -eps)) / (2 * eps)
        auto = float(grads[layer][0, head, p, j])
        assert abs(auto) > 1e-4 and abs(fd - auto) <= 1e-7 + 1e-6 * abs(auto), (layer, head, j, fd, auto)


def test_unsupported_models_stop_naming_the_families():
    with pytest.raises(ModelError, match="supported: open_clip CLIP.*CLIPModel.*SiglipModel"):
        attribution.text_tower(torch.nn.Linear(2, 2))


TRICKY = [
    "A  Red BUS, parked & waiting at 10:45!",
    "Ünïcödé café — naïve “quotes” &amp; 3½ emojis 🚌",
    "don't stop-believing (ok) ... ",
    "a",
]


@pytest.mark.parametrize("family", ["enc", "siglip"])
def test_tokens_are_put_on_the_words_they_come_from(family, request):
    """Each word's tokens are the ids of that word tokenized alone (CLIP lowercases, runs ftfy and
    html.unescape; SigLIP drops punctuation: a word may have no token), in order, and together
    the text's ids without start and end."""
    e = request.getfixturevalue(family)
    lead = 1 if family == "enc" else 0
    for text, al in zip(TRICKY, attribution.align_words(e.tokenize, TRICKY)):
        assert al is not None and al.words == text.split() and al.ids == e.tokenize([text])[0]
        assert al.token_pos == list(range(lead, len(al.ids) - 1))
        for w, word in enumerate(al.words):
            alone = e.tokenize([word])[0][lead:-1]
            assert [al.ids[p] for p, tw in zip(al.token_pos, al.token_word) if tw == w] == alone, (text, word)
    # A template's tokens are no word's; a text past the length limit leaves its last words without tokens.
    al = attribution.align_words(e.tokenize, ["a dog"], template="A photo depicts ")[0]
    n_template = len(e.tokenize(["A photo depicts"])[0]) - lead - 1
    assert al.words == ["a", "dog"] and al.token_word == [None] * n_template + [0, 1]
    long = attribution.align_words(e.tokenize, ["dog " * 100])[0]
    assert len(long.ids) == (77 if family == "enc" else 64) and long.token_word[-1] < 99
    ws = attribution.word_scores([1.0] * len(long.token_word), long.token_word, len(long.words))
    assert ws[0] == 1.0 and ws[-1] is None


def test_a_tokenizer_merging_across_spaces_is_not_put_on_words():
    def tokenize(texts):  # characters, but "a b" is one token
        return [[1] + [0 if c == "\0" else ord(c) for c in t.replace("a b", "\0")] + [2] for t in texts]

    assert [a is None for a in attribution.align_words(tokenize, ["xa bc", "x ab c"])] == [True, False]


def test_changed_and_blamed_words():
    assert attribution.changed_words("A red bus.", "A blue bus.") == [1]
    assert attribution.changed_words("Two cats, one dog", "Two cats, one bird") == [3]
    assert attribution.changed_words("a bus", "a red bus") == [1]
    assert attribution.blamed_word([0.1, None, -0.2, -0.2]) == 2 and attribution.blamed_word([None]) is None


def _explained(tmp_path):
    """explain_flips.py on the fixture with the tiny models; a score file of this input for the
    open_clip model with chosen similarities, so its TOP_K flips are known."""
    src = tmp_path / "fixture_with_fliptypes.jsonl"
    records = [json.loads(line) for line in open(os.path.join(REFERENCE, "fixture_with_fliptypes.jsonl"))]
    records[-1]["image_path"] = "images/missing.jpg"  # its flips are left out, counted
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    every = [
        (line, int(i), t) for line, rec in enumerate(records, 1) for i, texts in rec["diff_caps"].items() for t in texts
    ]
    preferred = [every[1], every[len(every) // 2]]
    with open(tmp_path / "fixture_with_fliptypes__LGIP_fliptypes_tiny_openclip.scores.jsonl", "w") as f:
        for line, rec in enumerate(records, 1):
            for i, caption in enumerate(rec["orig_captions"]):
                flips = [
                    {"text": t, "sim": 0.9 if (line, i, t) in preferred else 0.1, "type": "x"}
                    for t in rec["diff_caps"].get(str(i), [])
                ]
                f.write(
                    json.dumps({"line": line, "caption_index": i, "caption": caption, "sim": 0.5, "flips": flips})
                    + "\n"
                )
    # the evaluation's metrics beside it: the score file was made under the reference protocol
    (tmp_path / "fixture_with_fliptypes__LGIP_fliptypes.metrics.json").write_text(
        json.dumps(
            [
                {
                    "model_tag": "tiny_openclip",
                    "scores_file": "fixture_with_fliptypes__LGIP_fliptypes_tiny_openclip.scores.jsonl",
                    "run": {"config": {"PROTOCOL": "reference"}},
                }
            ]
        )
    )
    _, stdout, _ = run_here(
        "explain_flips.py",
        JSONL_PATH=str(src),
        IMAGE_ROOT=FIXTURES,
        DEVICE="cpu",
        MODELS=[OPENCLIP_TINY, SIGLIP_TINY],
        N_FLIPS=None,
        TOP_K=2,
        BOOTSTRAP=100,
        NUM_WORKERS=0,
    )
    n_missing = sum(len(t) for t in records[-1]["diff_caps"].values())
    return stdout, json.load(open(tmp_path / "fixture_with_fliptypes__LGIP_explain.metrics.json")), preferred, n_missing


def test_explain_flips_lines_and_figures(tmp_path):
    stdout, metrics, preferred, n_missing = _explained(tmp_path)
    assert [m["model_tag"] for m in metrics] == ["tiny_openclip", "tiny_siglip"]
    for m in metrics:
        lines = [json.loads(x) for x in open(tmp_path / m["explain_file"])]
        assert len(lines) == m["num_flips"] == m["num_random"] and all(x["drawn"] for x in lines)
        assert m["num_top_k"] == (2 if m["model_tag"] == "tiny_openclip" else 0)
        assert m["skipped"] == {
            "image_unreadable": n_missing,
            "tokens_not_on_words": 0,
            "no_scored_changed_word": 0,
            "not_one_word_replaced": 0,
        }
        assert len(lines) + n_missing == 77 and m["run"]["num_failed_images"] == 1
        assert list(m["by_flip_type"]) == ["color", "number", "object"]
        for x in lines:
            assert x["words"] == x["flip"].split() and x["caption_words"] == x["caption"].split()
            assert len(x["tokens"]) == len(x["token_scores"]) == len(x["token_words"])
            for w, score in enumerate(x["word_scores"]):
                mine = [s for s, tw in zip(x["token_scores"], x["token_words"]) if tw == w]
                assert score == pytest.approx(sum(mine) / len(mine), abs=1e-12) if mine else score is None
            assert x["changed"] == [j for j, (a, b) in enumerate(zip(x["caption"].split(), x["words"])) if a != b]
            scored = [(s, j) for j, s in enumerate(x["word_scores"]) if s is not None]
            assert x["blamed"] == min(scored)[1] and x["hit"] == (x["blamed"] in x["changed"])
            assert x["gap"] == pytest.approx(x["sim_caption"] - x["sim_flip"], abs=1e-12)
        hits = [x["hit"] for x in lines]
        assert m["localization_acc"] == pytest.approx(sum(hits) / len(hits))
        lo, hi = m["localization_acc_ci95"]
        assert lo <= m["localization_acc"] <= hi
        detected = [x["hit"] for x in lines if x["gap"] > 0]
        assert m["num_detected"] == len(detected) and m["localization_acc_detected"] == pytest.approx(
            sum(detected) / len(detected)
        )
        preferred_hits = [x["hit"] for x in lines if x["gap"] <= 0]
        assert m["localization_acc_preferred"] == pytest.approx(sum(preferred_hits) / len(preferred_hits))
        chance = [len(x["changed"]) / len(x["words"]) for x in lines]  # section 8: changed / words
        assert m["chance"] == pytest.approx(sum(chance) / len(chance))
        assert sum(b["count"] for b in m["by_flip_type"].values()) == len(lines)
        for t, b in m["by_flip_type"].items():
            typed = [x["hit"] for x in lines if x["flip_type"] == t]
            assert b["localization_acc"] == pytest.approx(sum(typed) / len(typed))
        assert m["run"]["config"]["LAYERS"] == 3 and m["run"]["model"]["attribution_embedding_diff"] < 1e-5
    top = {
        (x["line"], x["caption_index"], x["flip"])
        for x in map(json.loads, open(tmp_path / metrics[0]["explain_file"]))
        if "top_k" in x["drawn"]
    }
    assert top == set(preferred) and metrics[0]["score_file"] and metrics[1]["score_file"] is None
    assert metrics[0]["score_file_protocol"] == "reference" and metrics[1]["score_file_protocol"] is None
    assert "tiny_openclip: note: its TOP_K flips are those" in stdout and "PROTOCOL='reference'" in stdout
    assert "tiny_openclip: localization" in stdout


def _one_model_explained(tmp_path, records, **settings):
    import explain_flips

    src = tmp_path / "x_with_fliptypes.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    metrics = explain_flips.run(
        JSONL_PATH=str(src),
        IMAGE_ROOT=FIXTURES,
        DEVICE="cpu",
        MODELS=[OPENCLIP_TINY],
        N_FLIPS=None,
        TOP_K=0,
        BOOTSTRAP=0,
        NUM_WORKERS=0,
        **settings,
    )
    return metrics[0], [json.loads(x) for x in open(tmp_path / metrics[0]["explain_file"])]


def test_chance_counts_every_word_of_a_flip_even_past_the_token_limit(tmp_path):
    """Section 8: chance = mean over flips of changed / words; a caption longer than the 77 tokens
    the text tower reads has words without a score, counted all the same (and never blamed)."""
    rec = json.loads(next(open(os.path.join(REFERENCE, "fixture_with_fliptypes.jsonl"))))
    caption = "a red bus " + " ".join(["parked"] * 80)
    flip = "a blue bus " + " ".join(["parked"] * 80)
    rec.update(
        orig_captions=[caption],
        same_caps={},
        diff_caps={"0": [flip]},
        diff_caps_color={"0": [flip]},
        diff_caps_number={},
        diff_caps_object={},
    )
    m, lines = _one_model_explained(tmp_path, [rec])
    (line,) = lines
    assert len(line["words"]) == 83 and line["word_scores"][-1] is None and line["word_scores"][1] is not None
    assert line["changed"] == [1] and m["chance"] == pytest.approx(1 / 83)


def test_a_template_is_attributed_but_the_gap_is_lgips(tmp_path):
    """With TEMPLATE, the attributed similarities are the templated texts' (sim_*_template) and the
    gap, with the detected / preferred split, is LGIP's: the texts as written, the same as without it."""
    records = [json.loads(x) for x in open(os.path.join(REFERENCE, "fixture_with_fliptypes.jsonl"))][:4]
    plain_m, plain = _one_model_explained(tmp_path, records)
    templ_m, templ = _one_model_explained(tmp_path, records, TEMPLATE="A photo depicts ")
    assert len(plain) == len(templ) > 10
    for a, b in zip(plain, templ):
        assert (a["flip"], a["words"]) == (b["flip"], b["words"]) and "sim_caption_template" not in a
        for key in ("sim_caption", "sim_flip", "gap"):
            assert b[key] == pytest.approx(a[key], abs=1e-6)
        assert b["gap"] == pytest.approx(b["sim_caption"] - b["sim_flip"], abs=1e-12)
        assert b["sim_caption_template"] != pytest.approx(b["sim_caption"], abs=1e-6)
    assert templ_m["num_detected"] == plain_m["num_detected"] == sum(x["gap"] > 0 for x in plain)
    assert templ_m["run"]["config"]["TEMPLATE"] == "A photo depicts "


def test_score_file_gaps_and_a_bad_line(tmp_path):
    from lgip.errors import InputError
    from lgip.scorefile import read_flip_gaps

    path = tmp_path / "x.scores.jsonl"
    path.write_text(
        json.dumps({"line": 3, "caption_index": 1, "sim": 0.5, "flips": [{"text": "a b", "sim": 0.75}]})
        + "\n\n"
        + json.dumps({"line": 4, "caption_index": 0, "flips": []})
        + "\n"
    )
    with pytest.raises(InputError, match=r"x.scores.jsonl:3: field 'sim'"):
        read_flip_gaps(path)
    path.write_text(path.read_text().splitlines()[0] + "\n")
    assert read_flip_gaps(path) == [(3, 1, "a b", -0.25)]
