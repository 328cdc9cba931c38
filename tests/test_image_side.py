"""The image side (run_lgip_images.py, lgip/alterations.py, lgip/image_side.py; LGIP_SPEC.md section 11):
every alteration's pixels equal a restatement written from the section with PIL and numpy, the same
SEED gives the same bytes in any process, and every figure equals a restatement that makes the
pixels that way and encodes each image and caption on its own; hflip leaves out captions naming
left or right; an unreadable image is skipped and counted; N < 2 makes no flips and says so; a
cached re-run loads no weights; remembered pixels never stand in for an altered image; torchrun's
two processes give one process's figures and score files."""

import glob
import hashlib
import io
import json
import os
import random
import shutil
import string
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image, ImageOps

from conftest import (
    FIXTURES,
    OPENCLIP_TINY,
    REFERENCE,
    ROOT,
    SIGLIP_TINY,
    embed_image,
    encode_texts,
    eval_args,
    run_script,
)
from test_evaluation import assert_matches

PARA, FLIPS = ("jpeg", "downscale", "crop", "hflip"), ("mix", "patch")
KINDS = PARA + FLIPS
KS = (1, 5, 10)


# --- section 11 restated ------------------------------------------------------------------------------


def restated(x, kind, y=None, seed=0, r=0):
    """The altered image, as section 11 writes it."""
    W, H = x.size
    if kind == "jpeg":
        buf = io.BytesIO()
        x.save(buf, format="JPEG", quality=30)
        return Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    if kind == "downscale":
        return x.resize((max(1, W // 2), max(1, H // 2)), Image.BICUBIC).resize((W, H), Image.BICUBIC)
    if kind == "crop":
        w, h = round(0.9 * W), round(0.9 * H)
        left, top = (W - w) // 2, (H - h) // 2
        return x.crop((left, top, left + w, top + h))
    if kind == "hflip":
        return ImageOps.mirror(x)
    xa = np.asarray(x).astype(np.float64)
    ya = np.asarray(y.convert("RGB").resize((W, H), Image.BICUBIC)).astype(np.float64)
    if kind == "mix":
        return Image.fromarray(np.clip(np.rint(0.9 * xa + 0.1 * ya), 0, 255).astype(np.uint8))
    cut_w, cut_h = int(W * np.sqrt(1 - 0.9)), int(H * np.sqrt(1 - 0.9))
    rng = np.random.default_rng([seed, r])
    cx = rng.integers(W)
    cy = rng.integers(H)
    x1, x2 = np.clip(cx - cut_w // 2, 0, W), np.clip(cx + cut_w // 2, 0, W)
    y1, y2 = np.clip(cy - cut_h // 2, 0, H), np.clip(cy + cut_h // 2, 0, H)
    out = xa.copy()
    out[y1:y2, x1:x2] = ya[y1:y2, x1:x2]
    return Image.fromarray(out.astype(np.uint8))


def names_left_or_right(caption):
    punctuation = string.punctuation + "\u201c\u201d\u2018\u2019\u00ab\u00bb\u2026\u00bf\u00a1\u2014"
    return any(w.lower().strip(punctuation) in ("left", "right") for w in caption.split())


def fixture_images():
    return [Image.open(p).convert("RGB") for p in sorted(glob.glob(os.path.join(FIXTURES, "images", "*.jpg")))]


def odd_images():
    """Sizes whose 0.9 is a half (5 -> 4.5, 15 -> 13.5: halves to even), 1 pixel wide, 2 pixels high."""
    rng = np.random.default_rng(1)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in ((5, 15), (1, 2), (33, 7))]


# --- the alterations themselves --------------------------------------------------------------------------


def test_every_alteration_makes_the_sections_pixels():
    from lgip.alterations import alter

    images = fixture_images() + odd_images()
    for j, x in enumerate(images):
        before = x.tobytes()
        for kind in KINDS:
            y = images[(j + 5) % len(images)]
            for seed, r in ((0, j), (7, 3 * j + 1)):
                got, want = alter(x, kind, y, seed, r), restated(x, kind, y, seed, r)
                assert got.mode == "RGB" and got.size == want.size, (j, kind)
                assert got.tobytes() == want.tobytes(), (j, kind, seed, r)
        assert x.tobytes() == before  # the decoded image is never changed
    assert alter(images[-3], "crop").size == (4, 14)  # round(4.5) = 4, round(13.5) = 14


def test_flips_change_with_the_seed_and_the_record_paraphrases_do_not():
    from lgip.alterations import alter, patch_box

    x, y = fixture_images()[:2]
    boxes = {patch_box(x.size, seed, r) for seed in range(3) for r in range(3)}
    assert len(boxes) > 5
    assert alter(x, "jpeg", seed=1, r=4).tobytes() == alter(x, "jpeg", seed=2, r=0).tobytes()
    assert alter(x, "mix", y, 0, 0).tobytes() == alter(x, "mix", y, 5, 9).tobytes()  # (mix: y alone)
    with pytest.raises(ValueError, match="needs the other record's image"):
        alter(x, "mix")
    with pytest.raises(ValueError, match="unknown image alteration"):
        alter(x, "blur")


_HASH = """
import hashlib, glob, os, sys
sys.path.insert(0, {root!r})
from PIL import Image
from lgip.alterations import KINDS, alter
h = hashlib.sha256()
images = [Image.open(p).convert("RGB") for p in sorted(glob.glob(os.path.join({images!r}, "*.jpg")))]
for j, x in enumerate(images):
    for kind in KINDS:
        h.update(alter(x, kind, images[(j + 1) % len(images)], 3, j).tobytes())
print(h.hexdigest())
"""


def test_the_same_seed_gives_the_same_bytes_in_any_process():
    """Two fresh interpreters (another hash seed each) and this process make the same bytes; the
    loader's workers (lgip.images._ImageFiles) make them too."""
    from lgip.alterations import KINDS as ALL, AlteredImage, alter
    from lgip.images import _ImageFiles

    code = _HASH.format(root=ROOT, images=os.path.join(FIXTURES, "images"))
    digests = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env=dict(os.environ, PYTHONHASHSEED=str(s)),
        ).stdout.strip()
        for s in (1, 2)
    }
    h = hashlib.sha256()
    images = fixture_images()
    for j, x in enumerate(images):
        for kind in ALL:
            h.update(alter(x, kind, images[(j + 1) % len(images)], 3, j).tobytes())
    assert digests == {h.hexdigest()}
    paths = sorted(glob.glob(os.path.join(FIXTURES, "images", "*.jpg")))
    items = [AlteredImage(paths[j], kind, paths[(j + 1) % len(paths)], 3, j) for j in range(3) for kind in ALL]
    files = _ImageFiles(items, lambda img: img.tobytes())
    for n, item in enumerate(items):
        j = paths.index(item.source)
        assert files[n] == (n, restated(images[j], item.kind, images[(j + 1) % len(images)], 3, j).tobytes(), None)
    assert len(files._recent) <= files.RECENT


def test_left_right_rule_and_partners():
    from lgip.alterations import flip_offset, mentions_left_or_right, partner

    for caption in (
        "A dog to the left of a car.",
        "RIGHT: a bus",
        "(left) a cat",
        "turn left!",
        "a dog on the \u201cleft\u201d",
        "the car on the left\u2026",
        "turn \u00abright\u00bb",
        "\u00bfleft?",
    ):
        assert mentions_left_or_right(caption) and names_left_or_right(caption)
    for caption in ("leftover pizza", "a right-handed player", "the bright lights", "lefty", "\u201cleftover\u201d"):
        assert not mentions_left_or_right(caption)
    for n in (2, 3, 12, 40):
        for seed in (0, 1, 99):
            k = flip_offset(n, seed)
            assert k == 1 + random.Random(seed).randrange(n - 1) and 1 <= k < n
            assert sorted(partner(r, n, k) for r in range(n)) == list(range(n))  # a rotation
            assert all(partner(r, n, k) != r for r in range(n))
    assert flip_offset(1, 0) is None and flip_offset(0, 0) is None


def test_altered_cache_keys_name_source_kind_seed_and_for_flips_the_other_image():
    from lgip.alterations import AlteredImage
    from lgip.cache import image_cache_key, image_cache_keys

    a, b = sorted(glob.glob(os.path.join(FIXTURES, "images", "*.jpg")))[:2]
    keys = image_cache_keys(
        [
            a,
            AlteredImage(a, "jpeg", None, 0, 0),
            AlteredImage(a, "jpeg", None, 1, 0),
            AlteredImage(a, "mix", b, 0, 0),
            AlteredImage(a, "mix", b, 0, 1),
            AlteredImage(a, "mix", a, 0, 0),
            AlteredImage(a, "jpeg", None, 0, 5),
            AlteredImage(a, "mix", os.path.join(FIXTURES, "missing.jpg"), 0, 0),
        ]
    )
    assert len(set(keys.values())) == 6 and 7 not in keys  # a missing other image: no key (it fails, reported)
    assert keys[6] == keys[1]  # a paraphrase's pixels do not depend on r
    assert all(k.startswith(image_cache_key(a) + "|") for j, k in keys.items() if j)
    assert "|jpeg|seed=0|" in keys[1] and image_cache_key(b) in keys[3] and keys[3].endswith("|r=0")


def test_settings_are_checked_before_any_work():
    from lgip.errors import ConfigError
    from lgip.image_side import check_kinds, check_seed

    assert check_kinds(["mix", "jpeg"]) == ["jpeg", "mix"] and check_kinds("patch, crop") == ["crop", "patch"]
    for bad, match in (
        ([], "non-empty"),
        (["blur"], "unknown image alteration 'blur'"),
        (["mix", "mix"], "twice"),
        (3, "non-empty list"),
    ):
        with pytest.raises(ConfigError, match=match):
            check_kinds(bad)
    for bad in (-1, 1.5, True, "0"):
        with pytest.raises(ConfigError, match="SEED must be an int >= 0"):
            check_seed(bad)
    proc = run_script("run_lgip_images.py", "--KINDS=['jpeg', 'blurred']", "--MODELS=['demo']", check=False)
    assert proc.returncode == 2 and "unknown image alteration 'blurred'" in proc.stderr + proc.stdout


def test_search_doctest_and_ties():
    """The module's worked example; an altered image equal to an original, byte for byte, ties with it:
    the caption's own image keeps rank 1 and the top-1 stays an original."""
    import doctest
    import torch
    import lgip.alterations
    import lgip.image_side
    from lgip.image_side import flip_search

    assert doctest.testmod(lgip.image_side).failed == 0 and doctest.testmod(lgip.alterations).failed == 0
    v = torch.nn.functional.normalize(torch.randn(6, 16, generator=torch.Generator().manual_seed(0)), dim=1)
    altered = v[[0, 2, 1, 4, 3, 5]].clone()
    altered[1] = float("nan")  # not made: not in the gallery
    rank, top1 = flip_search(v, altered, np.arange(6), v.clone(), size=None)
    assert rank.tolist() == [1] * 6 and not top1.any()
    rank4, _ = flip_search(v, altered, np.arange(6), v.clone(), size=4, chunk_elements=3)
    assert rank4.tolist() == [1] * 6


# --- the script on the fixture --------------------------------------------------------------------------


def fixture_jsonl(folder, n=None, unreadable=True):
    """The fixture's records (the first n), plus: a copy of the first (the same image: ties), a
    record whose image is missing, one without captions, and a caption naming left (no hflip pair)."""
    recs = [json.loads(line) for line in open(os.path.join(REFERENCE, "fixture_with_fliptypes.jsonl"))][:n]
    shutil.copytree(os.path.join(FIXTURES, "images"), folder / "images", dirs_exist_ok=True)
    if len(recs) > 1:
        recs[1]["orig_captions"][2] = "A cat sits to the left of a laptop."
    out = [recs[0], json.loads(json.dumps(recs[0]))] + recs[1:]
    if unreadable:
        out.insert(min(3, len(out)), dict(recs[min(2, len(recs) - 1)], image_path="images/missing.jpg"))
    if n is None:
        out.append(dict(recs[7], orig_captions=[], same_caps={}, diff_caps={}))
    path = folder / "in_with_fliptypes.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in out))
    return path


def restate(jsonl, image_root, spec, size, kinds=KINDS, seed=0):
    """Section 11's figures, from images altered by `restated` and every image and caption encoded on its own."""
    from lgip.models import load_model

    enc = load_model(spec, "corrected", "cpu")

    def embed(img):
        return embed_image(enc, img).astype(np.float64)

    readable = []
    for line in open(jsonl):
        rec = json.loads(line)
        try:
            readable.append((rec, Image.open(os.path.join(image_root, rec["image_path"])).convert("RGB")))
        except OSError:
            continue
    n = len(readable)
    k = 1 + random.Random(seed).randrange(n - 1) if n >= 2 else None
    flips = [kind for kind in kinds if kind in FLIPS and k is not None]
    v = [embed(img) for _, img in readable]
    alt = {
        kind: [
            embed(restated(img, kind, readable[(r + k) % n][1] if kind in FLIPS else None, seed, r))
            for r, (_, img) in enumerate(readable)
        ]
        for kind in [*[x for x in kinds if x in PARA], *flips]
    }
    text = encode_texts(enc, [c for rec, _ in readable for c in rec["orig_captions"]])
    rows = {kind: [] for kind in kinds}  # (image index, value)
    search = {kind: {"rank": [], "top1": [], "img": []} for kind in flips}
    for r, (rec, _) in enumerate(readable):
        for c in rec["orig_captions"]:
            t = text[c]
            base = v[r] @ t
            for kind in kinds:
                if kind in PARA and not (kind == "hflip" and names_left_or_right(c)):
                    rows[kind].append((r, abs(alt[kind][r] @ t - base)))
                elif kind in flips:
                    rows[kind].append((r, base - alt[kind][r] @ t))
    step = size or n
    for kind in flips:
        for lo in range(0, n, step):
            block = range(lo, min(lo + step, n))
            for r in block:
                for c in readable[r][0]["orig_captions"]:
                    orig = np.array([v[q] @ text[c] for q in block])
                    made = np.array([alt[kind][q] @ text[c] for q in block])
                    own = orig[r - lo]
                    search[kind]["rank"].append(1 + (orig > own).sum() + (made > own).sum())
                    search[kind]["top1"].append(made.max() > orig.max())
                    search[kind]["img"].append(r)
    mean = lambda xs: float(np.mean(xs)) if len(xs) else None
    para_values = [x for kind in kinds if kind in PARA for _, x in rows[kind]]
    flip_values = [x for kind in flips for _, x in rows[kind]]
    out = {
        "num_samples": sum(1 for rec, _ in readable if rec["orig_captions"]),
        "num_images": n,
        "flip_offset": k,
        "image_invariance_error_mean": mean(para_values),
        "image_sensitivity_gap_mean": mean(flip_values),
        "image_sensitivity_pos_rate": mean([x > 0 for x in flip_values]) if flip_values else None,
        "by_kind": {},
    }
    for kind in kinds:
        values = [x for _, x in rows[kind]]
        if kind in PARA:
            out["by_kind"][kind] = {"count": len(values), "image_invariance_error_mean": mean(values)}
            continue
        block = out["by_kind"][kind] = {
            "count": len(values),
            "image_sensitivity_gap_mean": mean(values),
            "image_sensitivity_pos_rate": mean([x > 0 for x in values]) if values else None,
        }
        s = search.get(kind, {"rank": [], "top1": []})
        for q in KS:
            block[f"t2i_flip_recall@{q}"] = mean([x <= q for x in s["rank"]])
        block["t2i_flip_top1_rate"] = mean(s["top1"])
    return out


def assert_figures(ours, expected, path="$"):
    for key, value in expected.items():
        if isinstance(value, dict):
            assert [k for k in ours[key] if not k.endswith("_ci95") and k != "note"] == list(value), (
                f"{path}.{key}: keys"
            )
            assert_figures(ours[key], value, f"{path}.{key}")
        elif value is None or isinstance(value, (int, bool)):
            assert ours[key] == value, f"{path}.{key}"
        else:
            assert ours[key] == pytest.approx(value, abs=1e-6), f"{path}.{key}"
            ci = ours.get(key + "_ci95")
            if ci is not None:
                assert ci[0] - 1e-9 <= ours[key] <= ci[1] + 1e-9, f"{path}.{key}_ci95"


def metrics(folder):
    return json.load(open(folder / "in_with_fliptypes__LGIP_images.metrics.json"))


TWIN = dict(OPENCLIP_TINY, name="tiny_openclip_twin")  # the same weights and geometry: its pixels are remembered


def test_figures_equal_the_restatement_and_a_cached_rerun_loads_no_weights(tmp_path):
    jsonl = fixture_jsonl(tmp_path)
    models = [OPENCLIP_TINY, TWIN, SIGLIP_TINY]
    run_script(
        "run_lgip_images.py",
        *eval_args(
            jsonl,
            "corrected",
            models,
            image_root=tmp_path,
            GALLERY_SIZE=4,
            BOOTSTRAP=50,
            SAVE_EXAMPLES=2,
            NUM_WORKERS=2,
        ),
    )
    first = metrics(tmp_path)
    for m, spec in zip(first, models):
        assert m["model_tag"] == spec["name"] and m["run"]["model"]["weights_loaded"] is True
        assert m["run"]["num_failed_images"] == 1 and m["num_images"] == 14 and m["num_samples"] == 13
        assert m["num_blocks"] == 4 and m["gallery_size"] == 4
        if spec is not TWIN:  # (the twin: compared with its first below)
            assert_figures(m, restate(jsonl, tmp_path, spec, 4))
        # 13 records with captions, 65 captions; hflip leaves out the one naming left
        assert [m["by_kind"][k]["count"] for k in KINDS] == [65, 65, 65, 64, 65, 65]
        assert m["altered_images"]["num_failed"] == 0 and list(m) == [
            "model_tag",
            "num_samples",
            "image_invariance_error_mean",
            "image_invariance_error_mean_ci95",
            "image_sensitivity_gap_mean",
            "image_sensitivity_gap_mean_ci95",
            "image_sensitivity_pos_rate",
            "image_sensitivity_pos_rate_ci95",
            "by_kind",
            "num_images",
            "flip_offset",
            "gallery_size",
            "num_blocks",
            "altered_images",
            "scores_file",
            "score_kind",
            "model_card",
            "run",
        ]
        phases = m["run"]["seconds_by_phase"]
        assert "altered_images" in phases and "image_side" in phases
    # the twin's altered pixels came from the first model's (pixel memory), and are the altered ones
    sources = first[1]["altered_images"]
    assert sources["from_pixel_memory"] == sources["num"] > 0 and sources["decoded"] == 0
    same = lambda m: {k: v for k, v in m.items() if k not in ("model_tag", "run", "scores_file", "altered_images")}
    assert_matches(same(first[1]), same(first[0]))
    # (unique altered images: 14 readable records, 13 with captions and the copy's paraphrases shared)
    assert first[0]["altered_images"]["num"] == 12 * 4 + 14 * 2
    examples = sorted(os.listdir(tmp_path / "in_with_fliptypes__LGIP_images_examples"))
    assert examples == sorted(f"{line}_{k}.png" for line in (1, 2) for k in ("original",) + KINDS)
    # the score file: a line per record and caption, the kinds in order, hflip absent for the left caption
    lines = [json.loads(x) for x in open(tmp_path / first[0]["scores_file"])]
    assert len(lines) == 65 and [x["text"] for x in lines[0]["image_paraphrases"]] == list(PARA)
    left = next(x for x in lines if "left" in x["caption"])
    assert [x["text"] for x in left["image_paraphrases"]] == ["jpeg", "downscale", "crop"]
    assert [x["text"] for x in lines[0]["image_flips"]] == list(FLIPS) and "other_image_path" in lines[0][
        "image_flips"
    ][0]
    # each flip names the record's index among the readable ones (patch's box: the report remakes it)
    readable_lines = [
        i for i, line in enumerate(open(jsonl), 1) if os.path.isfile(tmp_path / json.loads(line)["image_path"])
    ]
    assert len(readable_lines) == 14
    assert all(f["r"] == readable_lines.index(x["line"]) for x in lines for f in x["image_flips"])
    # a re-run: everything from the cache, no weights, the same figures
    run_script(
        "run_lgip_images.py", *eval_args(jsonl, "corrected", models, image_root=tmp_path, GALLERY_SIZE=4, BOOTSTRAP=50)
    )
    again = metrics(tmp_path)
    for a, b in zip(again, first):
        assert a["run"]["model"]["weights_loaded"] is False, a["model_tag"]
        assert a["altered_images"]["from_cache"] == a["altered_images"]["num"]
        for m in (a, b):
            m.pop("run"), m.pop("altered_images")
        assert a == b


def test_kinds_seed_one_gallery_and_too_few_images(tmp_path):
    """KINDS selects the kinds; another SEED pairs other images (its flips encoded anew, the weights
    loaded); with one readable image there are no flips, said in the console and the metrics."""
    jsonl = fixture_jsonl(tmp_path)
    run_script(
        "run_lgip_images.py",
        *eval_args(
            jsonl,
            "corrected",
            [OPENCLIP_TINY],
            image_root=tmp_path,
            GALLERY_SIZE=None,
            KINDS=["patch", "crop"],
            SEED=3,
            BOOTSTRAP=0,
            WRITE_SCORES=False,
            CACHE_DIR=None,
        ),
    )
    m = metrics(tmp_path)[0]
    assert list(m["by_kind"]) == ["crop", "patch"] and m["num_blocks"] == 1
    assert_figures(m, restate(jsonl, tmp_path, OPENCLIP_TINY, None, kinds=("crop", "patch"), seed=3))
    assert m["image_invariance_error_mean_ci95"] is None and "scores_file" not in m
    one = tmp_path / "one"
    one.mkdir()
    jsonl = fixture_jsonl(one, n=1)  # the first record, its copy, and a missing image: N = 2; then N = 1
    lines = open(jsonl).read().splitlines()
    (one / "in_with_fliptypes.jsonl").write_text("\n".join([lines[0], lines[2]]) + "\n")
    proc = run_script(
        "run_lgip_images.py",
        *eval_args(jsonl, "corrected", [OPENCLIP_TINY], image_root=one, BOOTSTRAP=10, CACHE_DIR=None),
    )
    m = metrics(one)[0]
    assert m["num_images"] == 1 and m["flip_offset"] is None and m["run"]["num_failed_images"] == 1
    assert "no image flips" in proc.stdout
    for kind in FLIPS:
        block = m["by_kind"][kind]
        assert (
            block["count"] == 0 and block["image_sensitivity_pos_rate"] is None and block["t2i_flip_recall@1"] is None
        )
        assert "N >= 2" in block["note"]
    assert m["image_sensitivity_gap_mean"] is None and m["image_invariance_error_mean"] is not None
    assert_figures(m, restate(jsonl, one, OPENCLIP_TINY, 5000))


def test_torchrun_two_gloo_processes_give_single_process_figures(tmp_path):
    single, multi = tmp_path / "single", tmp_path / "multi"
    for folder in (single, multi):
        folder.mkdir()
        fixture_jsonl(folder)
    args = lambda folder: eval_args(
        folder / "in_with_fliptypes.jsonl",
        "corrected",
        [OPENCLIP_TINY],
        image_root=folder,
        GALLERY_SIZE=5,
        BOOTSTRAP=20,
        CACHE_DIR=None,
    )
    run_script("run_lgip_images.py", *args(single))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        os.path.join(ROOT, "run_lgip_images.py"),
        *args(multi),
    ]
    proc = subprocess.run(
        cmd,
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1", LGIP_DIST_BACKEND="gloo"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ours, ref = metrics(multi)[0], metrics(single)[0]
    assert ours["run"]["num_processes"] == 2 and ours["run"]["num_failed_images"] == 1
    # (the processes encode other batches of images: the same embeddings to float rounding)
    a, b = ([json.loads(x) for x in open(folder / m["scores_file"])] for folder, m in ((multi, ours), (single, ref)))
    assert len(a) == len(b) == 65
    for x, y in zip(a, b):
        assert x["sim"] == pytest.approx(y["sim"], abs=2e-6)
        for group in ("image_paraphrases", "image_flips"):
            assert [{**i, "sim": None} for i in x[group]] == [{**i, "sim": None} for i in y[group]]
            assert [i["sim"] for i in x[group]] == pytest.approx([i["sim"] for i in y[group]], abs=2e-6)
    # (what each process encoded: the first record's copy lies on the other process, its paraphrases made twice)
    assert (ours["altered_images"]["num"], ref["altered_images"]["num"]) == (80, 76)
    for m in (ours, ref):
        m.pop("run"), m.pop("altered_images")
    assert_matches(ours, ref)


def test_altered_images_the_model_overflows_on_are_counted_as_not_made(tmp_path):
    """A model whose embeddings of the altered images are inf (an fp16 overflow on them, say) while
    the originals and captions are finite: each such image is counted and listed as not made, with
    why, its pairs left out; no NaN figure is written (their figures are None, the originals' stay)."""
    import run_lgip_images

    jsonl = fixture_jsonl(tmp_path)
    spec = {
        "name": "later",
        "type": "python",
        "loader": os.path.join(os.path.dirname(os.path.abspath(__file__)), "user_loaders.py") + ":overflows_later",
    }
    m = run_lgip_images.run(
        JSONL_PATH=str(jsonl),
        IMAGE_ROOT=str(tmp_path),
        MODELS=[spec],
        DEVICE="cpu",
        NUM_WORKERS=0,
        BOOTSTRAP=0,
        WRITE_SCORES=False,
        CACHE_DIR=None,
        IMAGE_BATCH_SIZE=64,
    )[0]
    made = m["altered_images"]
    assert made["num_failed"] == made["num"] > 0
    assert "is not finite (NaN or inf): the model overflowed on it (in float32)" in made["failed"][0]["error"]
    assert m["image_invariance_error_mean"] is None and m["image_sensitivity_pos_rate"] is None
    assert all(b["count"] == 0 for b in m["by_kind"].values())
    assert json.dumps(m, allow_nan=False)  # (no NaN anywhere in the row)
