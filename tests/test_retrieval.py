"""Retrieval beside LGIP (run_lgip_retrieval.py, lgip/retrieval.py; LGIP_SPEC.md section 7): every
figure equals a brute-force restatement (every text and image encoded, full similarity matrices,
ranked and counted), in one gallery and in blocks that leave a smaller last one; ties as section 7
says; a run after run_lgip_by_fliptype (or run_lgip_multi) loads no weights."""

import copy
import doctest
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import (
    FIXTURES,
    OPENCLIP_TINY,
    REFERENCE,
    ROOT,
    SIGLIP_TINY,
    TINY_MODELS,
    encode_texts,
    eval_args,
    eval_settings,
    run_here,
)

TYPES = ("color", "number", "object")
KS = (1, 5, 10)


# --- the brute-force restatement -------------------------------------------------------------------


def brute_force(records, image_emb, text_emb, size, types=TYPES):
    """Section 7 restated: `records` [{"image", "captions", "flips": [[..] per caption], "typed": {t: [[..]]},
    "paras": [[..]]}] whose image reads, in file order; `image_emb` / `text_emb`: key -> unit vector.
    Similarities of the distinct vectors (by their bytes) in one matrix, so copies of a text or an
    image, and two texts with the same embedding, tie exactly."""

    def distinct(keys, emb):
        vecs = [np.asarray(emb[k], dtype=np.float32) for k in keys]
        number = {}
        col = [number.setdefault(v.tobytes(), len(number)) for v in vecs]
        return col, [np.frombuffer(b, dtype=np.float32) for b in number]

    def sims(a_keys, b_keys, a_emb, b_emb):
        (ca, ua), (cb, ub) = distinct(a_keys, a_emb), distinct(b_keys, b_emb)
        if not ua or not ub:
            return np.zeros((len(a_keys), len(b_keys)), dtype=np.float32)
        return (np.stack(ua) @ np.stack(ub).T)[ca][:, cb]

    hits = {
        f: []
        for f in ["i2t@%d" % k for k in KS]
        + ["t2i@%d" % k for k in KS]
        + ["flip@%d" % k for k in KS]
        + ["top1", "own", "para_r1", "para_agree"]
    }
    typed = {t: ([], []) for t in types}
    counts = {"num_captions": 0, "num_flips": 0, "num_paraphrases": 0, "num_blocks": 0}
    n = len(records)
    size = size or n
    for lo in range(0, n, size):
        block = records[lo : lo + size]
        counts["num_blocks"] += 1
        imgs = [r["image"] for r in block]
        caps = [(p, i, c) for p, r in enumerate(block) for i, c in enumerate(r["captions"])]
        flips = [(p, f) for p, r in enumerate(block) for fl in r["flips"] for f in fl]
        tflips = {t: [(p, f) for p, r in enumerate(block) for fl in r["typed"].get(t, []) for f in fl] for t in types}
        paras = [(p, i, q) for p, r in enumerate(block) for i, ps in enumerate(r["paras"]) for q in ps]
        counts["num_captions"] += len(caps)
        counts["num_flips"] += len(flips)
        counts["num_paraphrases"] += len(paras)
        # one matrix of every text of the block: a text that is a caption and a flip gets one similarity
        gallery = [c for _, _, c in caps] + [f for _, f in flips] + [f for t in types for _, f in tflips[t]]
        s_all, cut = (
            sims(imgs, gallery, image_emb, text_emb),
            np.cumsum([len(caps), len(flips)] + [len(tflips[t]) for t in types]),
        )
        s_ic, s_if, *s_typed = np.split(s_all, cut[:-1], axis=1)
        s_it = dict(zip(types, s_typed))
        for p in range(len(block)):
            own = [j for j, (q, _, _) in enumerate(caps) if q == p]
            if not own:
                continue
            target = s_ic[p, own].max()
            rank, flip_rank = 1 + (s_ic[p] > target).sum(), 1 + (s_ic[p] > target).sum() + (s_if[p] > target).sum()
            for k in KS:
                hits["i2t@%d" % k].append(rank <= k)
                hits["flip@%d" % k].append(flip_rank <= k)
            best_c = s_ic[p].max()
            hits["top1"].append(len(flips) > 0 and s_if[p].max() > best_c)
            own_f = [j for j, (q, _) in enumerate(flips) if q == p]
            if own_f:
                hits["own"].append(s_if[p, own_f].max() > target)
            for t in types:
                own_t = [j for j, (q, _) in enumerate(tflips[t]) if q == p]
                if own_t:
                    typed[t][0].append(s_it[t][p].max() > best_c)
                    typed[t][1].append(s_it[t][p, own_t].max() > target)
        s_all = sims([c for _, _, c in caps] + [q for _, _, q in paras], imgs, text_emb, image_emb)
        s_ci, s_pi = s_all[: len(caps)], s_all[len(caps) :]
        best_of = {}
        for j, (p, i, _) in enumerate(caps):
            for k in KS:
                hits["t2i@%d" % k].append(1 + (s_ci[j] > s_ci[j, p]).sum() <= k)
            best_of[(p, i)] = int(np.argmax(s_ci[j]))  # first on ties, in block order
        for j, (p, i, _) in enumerate(paras):
            hits["para_r1"].append(not (s_pi[j] > s_pi[j, p]).any())
            hits["para_agree"].append(int(np.argmax(s_pi[j])) == best_of[(p, i)])
    mean = lambda xs: float(np.mean(xs)) if xs else None
    out = {
        "num_samples": sum(1 for r in records if r["captions"]),
        "gallery_size": min(size, n),
        **counts,
        "num_images_with_flips": len(hits["own"]),
        "i2t_flip_top1_rate": mean(hits["top1"]),
        "own_flip_preferred_rate": mean(hits["own"]),
        "t2i_paraphrase_recall@1": mean(hits["para_r1"]),
        "t2i_paraphrase_agreement@1": mean(hits["para_agree"]),
    }
    for k in KS:
        out[f"i2t_recall@{k}"], out[f"t2i_recall@{k}"] = mean(hits["i2t@%d" % k]), mean(hits["t2i@%d" % k])
        out[f"i2t_flip_recall@{k}"] = mean(hits["flip@%d" % k])
    if types:
        out["by_flip_type"] = {
            t: {
                "i2t_flip_top1_rate": mean(typed[t][0]),
                "own_flip_preferred_rate": mean(typed[t][1]),
                "count": len(typed[t][0]),
            }
            for t in types
        }
    return out


def assert_figures(ours, expected):
    for key, value in expected.items():
        if key == "by_flip_type":
            assert set(ours[key]) == set(value)
            for t in value:
                assert_figures(ours[key][t], value[t])
        elif value is None or isinstance(value, int):
            assert ours[key] == value, key
        else:
            assert ours[key] == pytest.approx(value, abs=1e-12), key
            ci = ours.get(key + "_ci95")
            if ci is not None:
                assert ci[0] - 1e-12 <= value <= ci[1] + 1e-12, key


# --- the library on synthetic embeddings ------------------------------------------------------------


def test_worked_example_in_the_module_docstring():
    import lgip.retrieval

    assert doctest.testmod(lgip.retrieval).failed == 0


def synthetic(rng, n, d=6):
    """Records with copies (an image in two records, captions and flips repeated) and records
    without flips, paraphrases or captions; vectors are unit rows."""
    unit = lambda: (lambda v: v / np.linalg.norm(v))(rng.normal(size=d)).astype(np.float32)
    images = {f"img{j}": unit() for j in range(max(1, n - 2))}
    texts = {}

    def text():
        key = f"t{rng.integers(0, 4 * n)}"  # drawn from a small pool: repeats
        texts.setdefault(key, unit())
        return key

    records = []
    for p in range(n):
        n_caps = int(rng.integers(0, 4)) if p % 5 == 4 else int(rng.integers(1, 4))
        has_flips = p % 3 != 1
        flips = [[text() for _ in range(int(rng.integers(0, 3)))] if has_flips else [] for _ in range(n_caps)]
        typed = {t: [[f for f in fl if rng.random() < 0.5] for fl in flips] for t in TYPES}
        records.append(
            {
                "image": f"img{int(rng.integers(0, len(images)))}",
                "captions": [text() for _ in range(n_caps)],
                "flips": flips,
                "typed": typed,
                "paras": [[text() for _ in range(int(rng.integers(0, 3)))] for _ in range(n_caps)],
            }
        )
    return records, images, texts


def gallery_of(records, images, texts, device="cpu"):
    """The library's Gallery of the synthetic records: a text table with a row per distinct text."""
    import torch
    from lgip.retrieval import Gallery, Items

    keys = sorted(texts)
    row = {k: j for j, k in enumerate(keys)}

    def items(get):
        got = [(p, i, t) for p, r in enumerate(records) for i, ts in enumerate(get(r)) for t in ts]
        return Items([p for p, _, _ in got], [row[t] for _, _, t in got], [i for _, i, _ in got])

    return Gallery(
        torch.tensor(np.stack([images[r["image"]] for r in records])).to(device),
        torch.tensor(np.stack([texts[k] for k in keys])).to(device),
        items(lambda r: [[c] for c in r["captions"]]),
        items(lambda r: r["flips"]),
        items(lambda r: r["paras"]),
        {t: items(lambda r, t=t: r["typed"][t]) for t in TYPES},
    )


@pytest.mark.parametrize("seed", range(4))
def test_search_equals_brute_force_on_synthetic_embeddings(seed):
    from lgip.retrieval import Gallery, retrieval_figures, search_galleries

    rng = np.random.default_rng(seed)
    records, images, texts = synthetic(rng, 23)
    gallery = gallery_of(records, images, texts)
    for size, chunk in ((None, None), (23, 7), (5, 3), (7, 1 << 20), (1, 2)):  # 5 and 7: a smaller last block
        ours = retrieval_figures(search_galleries(gallery, size, chunk_elements=chunk), resamples=0)
        assert_figures(ours, brute_force(records, images, texts, size))
        # torchrun's path: parts of every other record, merged on rank 0, give the same figures
        halves = []
        for r in (0, 1):
            part = gallery_of(records[r::2], images, texts)
            part.records = np.arange(r, len(records), 2)
            halves.append(part.to_host())
        merged = Gallery.merged(halves)
        assert retrieval_figures(search_galleries(merged, size), resamples=0) == ours


def test_ties_count_for_the_correct_item():
    """Two records with one image and one caption: each caption's image ranks 1, each image's
    caption ranks 1, and the first of the tied images is the one both texts find."""
    import torch
    from lgip.retrieval import Gallery, Items, retrieval_figures, search_galleries

    v = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    g = Gallery(
        v,
        torch.tensor([[0.6, 0.8], [0.8, 0.6]]),
        Items([0, 1], [0, 0], [0, 0]),
        Items([0, 1], [1, 1], [0, 0]),
        Items([0, 1], [1, 1], [0, 0]),
    )
    f = retrieval_figures(search_galleries(g, None), resamples=0)
    assert f["i2t_recall@1"] == f["t2i_recall@1"] == f["t2i_paraphrase_recall@1"] == 1.0
    assert f["t2i_paraphrase_agreement@1"] == 1.0
    # the flip (.8) beats the caption (.6) for both images: it ranks them 2nd, and is the top-1 text
    assert f["i2t_flip_recall@1"] == 0.0 and f["i2t_flip_recall@5"] == 1.0 and f["i2t_flip_top1_rate"] == 1.0
    assert "by_flip_type" not in f


def test_texts_with_equal_embeddings_tie_wherever_their_columns_sit():
    """Two texts with byte-identical embeddings in separate table rows (distinct strings that
    tokenize alike: "A dog." and "a dog.") tie exactly, as section 7 says, though a float32 matrix
    product need not give equal columns equal values (a CPU kernel's last columns are summed
    another way): the record's own caption ranks 1 in every trial, alone and on torchrun's path."""
    import torch
    from lgip.retrieval import Gallery, Items, search_galleries

    unit = lambda x: x / x.norm(dim=-1, keepdim=True)
    for seed in range(40):
        g = torch.Generator().manual_seed(seed)
        t = unit(torch.randn(1, 512, generator=g))
        images = unit(torch.cat([t + 0.03 * torch.randn(1, 512, generator=g), torch.randn(1, 512, generator=g)]))
        table = torch.cat([t, unit(torch.randn(4, 512, generator=g)), t.clone()])  # row 5: record 1's copy of row 0
        caps = Items([0, 1, 1, 1, 1, 1], [0, 1, 2, 3, 4, 5], [0, 0, 1, 2, 3, 4])
        assert search_galleries(Gallery(images, table, caps, Items(), Items()), None).i2t_rank[0] == 1, seed
        parts = [
            Gallery(images[:1], table, Items([0], [0], [0]), Items(), Items(), records=[0]).to_host(),
            Gallery(
                images[1:], table, Items([0] * 5, [1, 2, 3, 4, 5], [0, 1, 2, 3, 4]), Items(), Items(), records=[1]
            ).to_host(),
        ]
        assert search_galleries(Gallery.merged(parts), None).i2t_rank[0] == 1, seed


@pytest.mark.parametrize("size", [None, 3, 4])
def test_a_model_that_embeds_every_text_alike_ranks_every_item_first(size):
    """All texts (distinct strings, a row each) with one embedding: every similarity of an image is
    the same number, so every rank is 1, no flip beats a caption, agreement is the first image."""
    import torch
    from lgip.retrieval import Gallery, Items, retrieval_figures, search_galleries

    torch.manual_seed(0)
    n = 7
    table = torch.nn.functional.normalize(torch.randn(1, 512), dim=1).repeat(5 * n + 2 * n + n, 1)
    images = torch.nn.functional.normalize(torch.randn(n, 512), dim=1)
    caps = Items(np.repeat(np.arange(n), 5), np.arange(5 * n), np.tile(np.arange(5), n))
    flips = Items(np.repeat(np.arange(n), 2), 5 * n + np.arange(2 * n), np.zeros(2 * n, int))
    paras = Items(np.arange(n), 7 * n + np.arange(n), np.zeros(n, int))
    f = retrieval_figures(search_galleries(Gallery(images, table, caps, flips, paras), size), resamples=0)
    for k in KS:
        assert f[f"i2t_recall@{k}"] == f[f"i2t_flip_recall@{k}"] == 1.0
    assert f["i2t_flip_top1_rate"] == f["own_flip_preferred_rate"] == 0.0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
def test_distinct_rows_by_bytes_on_the_device_equal_the_hosts(dtype, monkeypatch):
    """_distinct_rows (hashes where the embeddings are) numbers rows as grouping their bytes on the
    host does; a hash that puts distinct rows together is caught, and the host's grouping used."""
    import torch
    from lgip import retrieval

    x = torch.randn(50, 24).to(getattr(torch, dtype))
    x = x[torch.as_tensor(np.random.default_rng(0).integers(0, 20, 90))]  # 90 rows, at most 20 distinct
    x[3, 0] = 0.0
    x[4] = x[3]
    x[4, 0] = -0.0  # equal as numbers, not as bytes
    expected = retrieval._unique_first(retrieval._row_bytes(x))
    got = retrieval._distinct_rows(x)
    assert all(np.array_equal(a, b) for a, b in zip(got, expected))
    assert len(got[0]) <= 22 and got[1][3] != got[1][4]
    colliding = lambda bits: torch.zeros(len(bits), 2, dtype=torch.int64)
    got = retrieval._distinct_rows(x, hashes=colliding)
    assert all(np.array_equal(a, b) for a, b in zip(got, expected))


def test_flip_types_are_those_the_input_has():
    import run_lgip_retrieval

    rec = {"image_path": "a.jpg", "orig_captions": ["a red bus"]}
    assert run_lgip_retrieval.flip_types([(1, rec)]) == []
    assert run_lgip_retrieval.flip_types([(1, rec), (2, dict(rec, diff_caps_color={"0": ["a blue bus"]}))]) == ["color"]
    typed = {f"diff_caps_{t}": {} for t in TYPES}
    assert run_lgip_retrieval.flip_types([(1, dict(rec, **typed))]) == list(TYPES)


def test_gallery_size_must_be_a_positive_int_or_none():
    from lgip.errors import ConfigError
    from lgip.retrieval import check_gallery_size

    for bad in (0, -5, 2.5, "5000", True):
        with pytest.raises(ConfigError, match="positive int .* or None"):
            check_gallery_size(bad)
    assert check_gallery_size(None) is None and check_gallery_size(1000) == 1000


# --- the script on the fixture -----------------------------------------------------------------------


def fixture_records(folder, unreadable="corrupt.jpg"):
    """The fixture's records, plus: a copy of the first (the same image and texts: ties), a record
    whose image is unreadable (corrupt.jpg: not an image; any other name: no such file), one
    without flips or paraphrases and one without captions."""
    recs = [json.loads(line) for line in open(os.path.join(REFERENCE, "fixture_with_fliptypes.jsonl"))]
    shutil.copytree(os.path.join(FIXTURES, "images"), folder / "images")
    (folder / "images" / "corrupt.jpg").write_bytes(b"not a jpeg")
    empty = {f: {} for f in ["same_caps", "diff_caps"] + ["diff_caps_" + t for t in TYPES]}
    no_flips = dict(recs[5], image_path=recs[4]["image_path"], **empty)
    no_flips["same_caps"] = recs[5]["same_caps"]
    no_captions = dict(recs[8], orig_captions=[], **empty)
    out = [recs[0], copy.deepcopy(recs[0]), recs[1], dict(recs[2], image_path="images/" + unreadable)] + recs[2:]
    out += [no_flips, no_captions]
    path = folder / "in_with_fliptypes.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in out))
    return path


def brute_force_of(jsonl, image_root, spec, size, types=TYPES):
    """brute_force on a JSONL with a model: every text and image encoded on its own (SigLIP padded to
    64, as the corrected protocol encodes it), an unreadable image's record left out."""
    key = (str(jsonl), str(image_root), spec["name"], types)
    if key not in _ENCODED:
        _ENCODED.clear()
        _ENCODED[key] = encoded(jsonl, image_root, spec, types)
    return brute_force(*_ENCODED[key], size, types)


_ENCODED = {}  # the last encoded (JSONL, model): a test compares several gallery sizes with it


def encoded(jsonl, image_root, spec, types):
    """(records as brute_force reads them, image key -> vector, text -> vector) of a JSONL."""
    import torch
    from PIL import Image
    from lgip.models import load_model

    enc = load_model(spec, "corrected", "cpu")
    records, image_emb, texts = [], {}, set()
    for line in open(jsonl):
        rec = json.loads(line)
        path = os.path.join(image_root, rec["image_path"])
        try:
            x = enc.image_transform(Image.open(path).convert("RGB"))
        except Exception:
            continue
        x = {k: v[None] for k, v in x.items()} if isinstance(x, dict) else x[None]
        with torch.no_grad():
            image_emb[path] = enc.encode_images(x)[0].float().numpy()
        n = len(rec["orig_captions"])
        field = lambda f: [rec.get(f, {}).get(str(i), []) for i in range(n)]
        records.append(
            {
                "image": path,
                "captions": rec["orig_captions"],
                "flips": field("diff_caps"),
                "typed": {t: field("diff_caps_" + t) for t in types},
                "paras": field("same_caps"),
            }
        )
        texts.update(rec["orig_captions"], *field("diff_caps"), *field("same_caps"))
    return records, image_emb, encode_texts(enc, texts)  # (each text padded as the corrected protocol pads it alone)


def metrics(folder, stem):
    return json.load(open(folder / f"{stem}__LGIP_retrieval.metrics.json"))


def test_figures_equal_brute_force_and_need_no_weights_after_by_fliptype(tmp_path):
    # (a missing image: a corrupt one has no cached embedding, so every re-run loads the weights to try it)
    jsonl = fixture_records(tmp_path, unreadable="missing.jpg")
    run_here(
        "run_lgip_by_fliptype.py",
        **eval_settings(jsonl, "corrected", TINY_MODELS, image_root=tmp_path, BOOTSTRAP=0, WRITE_SCORES=False),
    )
    runs = {}
    for size in (None, 4):  # 15 readable records: one gallery; 4, 4, 4 and 3
        run_here(
            "run_lgip_retrieval.py",
            **eval_settings(jsonl, "corrected", TINY_MODELS, image_root=tmp_path, GALLERY_SIZE=size, BOOTSTRAP=50),
        )
        runs[size] = metrics(tmp_path, "in_with_fliptypes")
    for j, spec in enumerate(TINY_MODELS):
        for size, got in runs.items():
            m = got[j]
            assert m["model_tag"] == spec["name"] and m["run"]["model"]["weights_loaded"] is False
            assert m["run"]["num_failed_images"] == 1 and m["run"]["config"]["GALLERY_SIZE"] == size
            assert_figures(m, brute_force_of(jsonl, tmp_path, spec, size))
            # the record without flips: its captions are in the galleries, no flip and no own-flip query
            assert (m["num_samples"], m["num_captions"], m["num_images_with_flips"]) == (14, 70, 13)
            assert m["num_blocks"] == (1 if size is None else 4) and "retrieval" in m["run"]["seconds_by_phase"]


def test_reference_protocol_and_a_perturb_file_load_no_weights(reference_runs, tmp_path):
    """After the session's reference-protocol runs: run_lgip_by_fliptype's cache serves the
    retrieval whole (SigLIP keys depend on the published calls there) with the numbers of a run
    without a cache; run_lgip_multi's serves a _with_perturb file (no typed lists: no by_flip_type)."""
    folder = reference_runs["run_lgip_by_fliptype.py"][0]
    jsonl = folder / "fixture_with_fliptypes.jsonl"
    run_here("run_lgip_retrieval.py", **eval_settings(jsonl, "reference", TINY_MODELS, GALLERY_SIZE=5))
    cached = metrics(folder, "fixture_with_fliptypes")
    assert [m["run"]["model"]["weights_loaded"] for m in cached] == [False, False]
    shutil.copy(jsonl, tmp_path / jsonl.name)
    run_here(
        "run_lgip_retrieval.py",
        **eval_settings(tmp_path / jsonl.name, "reference", [SIGLIP_TINY], GALLERY_SIZE=5, CACHE_DIR=None),
    )
    fresh = metrics(tmp_path, "fixture_with_fliptypes")[0]
    assert fresh["run"]["model"]["weights_loaded"] is True
    assert {k: v for k, v in cached[1].items() if k != "run"} == {k: v for k, v in fresh.items() if k != "run"}
    folder = reference_runs["run_lgip_multi.py"][0]
    jsonl = folder / "fixture_with_perturb.jsonl"
    run_here("run_lgip_retrieval.py", **eval_settings(jsonl, "reference", [OPENCLIP_TINY], GALLERY_SIZE=None))
    perturb = metrics(folder, "fixture_with_perturb")[0]
    assert perturb["run"]["model"]["weights_loaded"] is False and "by_flip_type" not in perturb
    # open_clip encodes alike in both protocols: its figures are the brute force's
    assert_figures(perturb, brute_force_of(jsonl, FIXTURES, OPENCLIP_TINY, None, types=()))


def test_torchrun_two_gloo_processes_give_the_brute_force(tmp_path):
    jsonl = fixture_records(tmp_path)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        os.path.join(ROOT, "run_lgip_retrieval.py"),
        *eval_args(jsonl, "corrected", [SIGLIP_TINY], image_root=tmp_path, GALLERY_SIZE=4, CACHE_DIR=None, BOOTSTRAP=0),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = metrics(tmp_path, "in_with_fliptypes")[0]
    assert m["run"]["num_processes"] == 2 and m["run"]["num_failed_images"] == 1
    assert_figures(m, brute_force_of(jsonl, tmp_path, SIGLIP_TINY, 4))
