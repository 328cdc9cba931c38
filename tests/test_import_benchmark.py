"""import_benchmark.py (LGIP_SPEC.md section 10): SugarCrepe, SugarCrepe++ and RoCOCO files written here
in each source's exact format, read into LGIP records; bad input named by file, item and field;
the per-type positive rate equal to each benchmark's own scoring, restated."""

import json
import os
import re

import numpy as np
import pytest

from conftest import FIXTURES, OPENCLIP_TINY, run_script

IMAGES = os.path.join(FIXTURES, "images")


def img(i):
    return f"{i:012d}.jpg"


def write(folder, name, data):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(data), encoding="utf-8")


def sugarcrepe(folder, missing_image=True):
    """Seven files; ids with a gap; one caption shared by two items of an image; one item written
    twice; an image that is in no folder."""
    files = {
        stem: {} for stem in ("add_att", "add_obj", "replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj")
    }
    files["add_att"] = {
        "0": {
            "filename": img(1),
            "caption": "A red bus on the street.",
            "negative_caption": "A red bus on the wet street.",
        },
        "2": {"filename": img(2), "caption": "A cat on a couch.", "negative_caption": "A small cat on a couch."},
    }  # (id 1 missing)
    files["replace_att"] = {
        "0": {
            "filename": img(1),
            "caption": "A red bus on the street.",
            "negative_caption": "A blue bus on the street.",
        },
        "1": {
            "filename": img(1),
            "caption": "A red bus on the street.",
            "negative_caption": "A blue bus on the street.",
        },
        "2": {"filename": img(3), "caption": "Two dogs in a park.", "negative_caption": "Two cats in a park."},
    }
    files["swap_obj"] = {
        "0": {"filename": img(2), "caption": "A cat sits on a laptop.", "negative_caption": "A laptop sits on a cat."}
    }
    if missing_image:
        files["replace_obj"] = {"7": {"filename": img(999), "caption": "A horse.", "negative_caption": "A cow."}}
    for stem, data in files.items():
        write(folder, stem + ".json", data)
    return folder


def sugarcrepe_pp(folder):
    items = {stem: [] for stem in ("replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj")}
    items["replace_att"] = [
        {
            "id": 0,
            "filename": img(4),
            "caption": "A white boat.",
            "caption2": "A boat that is white.",
            "negative_caption": "A black boat.",
        },
        {
            "id": 1,
            "filename": img(4),
            "caption": "A white boat.",
            "caption2": "A boat coloured white.",
            "negative_caption": "A green boat.",
        },
    ]
    items["swap_obj"] = [
        {
            "id": 0,
            "filename": img(5),
            "caption": "A man rides a horse.",
            "caption2": "A horse ridden by a man.",
            "negative_caption": "A horse rides a man.",
        }
    ]
    for stem, data in items.items():
        write(folder, stem + ".json", data)
    return folder


def rococo(folder):
    originals = [f"Caption {k} of the picture." for k in range(6)]
    altered = [f"Caption {k} of the altered picture." for k in range(5)]
    data = {stem: [] for stem in ("same_concept", "diff_concept", "rand_voca", "danger")}
    data["same_concept"] = [
        {"image": f"val2014/COCO_val2014_{6:012d}.jpg", "caption": originals + altered},  # 11 texts
        {"image": f"val2014/COCO_val2014_{7:012d}.jpg", "caption": originals[:5] + altered},
    ]  # 10
    data["danger"] = [
        {"image": f"val2014/COCO_val2014_{6:012d}.jpg", "caption": originals[:5] + [a + " Danger." for a in altered]}
    ]
    for stem, entries in data.items():
        write(folder, stem + ".json", entries)
    return folder


def run_import(source, folder, tmp_path, dirs=None, check=True):
    out = tmp_path / "out" / f"{source}.jsonl"
    out.parent.mkdir(exist_ok=True)
    return out, run_script(
        "import_benchmark.py",
        f"--SOURCE={source}",
        f"--SOURCE_DIR={folder}",
        f"--IMAGE_DIRS={dirs or [str(tmp_path / 'nothing'), IMAGES]!r}",
        f"--OUTPUT_JSONL={out}",
        check=check,
    )


def lines(path):
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def test_sugarcrepe_records(tmp_path):
    out, proc = run_import("sugarcrepe", sugarcrepe(tmp_path / "sc"), tmp_path)
    recs = lines(out)
    assert [r["image_path"] for r in recs] == [
        os.path.relpath(os.path.join(IMAGES, img(i)), out.parent).replace(os.sep, "/") for i in (1, 2, 3)
    ]
    bus = recs[0]
    assert bus["orig_captions"] == ["A red bus on the street."] and bus["same_caps"] == {}
    assert bus["diff_caps"] == {
        "0": ["A red bus on the wet street.", "A blue bus on the street.", "A blue bus on the street."]
    }
    assert bus["diff_caps_add_att"] == {"0": ["A red bus on the wet street."]}
    assert bus["diff_caps_replace_att"] == {
        "0": ["A blue bus on the street.", "A blue bus on the street."]
    }  # kept twice
    cat = recs[1]
    assert cat["orig_captions"] == ["A cat on a couch.", "A cat sits on a laptop."]
    assert cat["diff_caps_swap_obj"] == {"1": ["A laptop sits on a cat."]}
    meta = json.load(open(str(out) + ".meta.json"))
    assert (
        meta["num_items"] == 7
        and meta["num_images_missing"] == 1
        and meta["missing_images"] == [{"image": img(999), "items": 1}]
    )
    assert meta["items_by_type"]["replace_obj"] == 1 and meta["items_written_by_type"]["replace_obj"] == 0
    assert "1 images found in no folder of IMAGE_DIRS (1 items), not written: 000000000999.jpg" in proc.stdout
    assert "items by type: add_att 2, replace_att 3, replace_obj 0 (of 1), swap_obj 1" in proc.stdout
    assert f"IMAGE_DIRS folder {tmp_path / 'nothing'} does not exist" in proc.stdout


def test_sugarcrepe_pp_slots_and_rococo_namings(tmp_path):
    out, _ = run_import("sugarcrepe++", sugarcrepe_pp(tmp_path / "scpp"), tmp_path)
    boat, horse = lines(out)
    assert boat["orig_captions"] == ["A white boat.", "A white boat."]  # each item its own slot
    assert boat["same_caps"] == {"0": ["A boat that is white."], "1": ["A boat coloured white."]}
    assert boat["diff_caps"] == boat["diff_caps_replace_att"] == {"0": ["A black boat."], "1": ["A green boat."]}
    assert horse["diff_caps_swap_obj"] == {"0": ["A horse rides a man."]}

    out, _ = run_import("rococo", rococo(tmp_path / "ro"), tmp_path)
    six, seven = lines(out)
    assert six["image_path"].endswith(img(6)) and six["image_id"] == 6  # a val2014 name found under the 2017 one
    assert six["orig_captions"] == [f"Caption {k} of the picture." for k in range(6)]
    assert six["diff_caps_same_concept"] == {str(k): [f"Caption {k} of the altered picture."] for k in range(5)}
    assert six["diff_caps_danger"]["4"] == ["Caption 4 of the altered picture. Danger."]
    assert "5" not in six["diff_caps"] and six["diff_caps"]["0"] == [
        "Caption 0 of the altered picture.",
        "Caption 0 of the altered picture. Danger.",
    ]
    assert [k for k in six if k.startswith("diff_caps_")] == ["diff_caps_same_concept", "diff_caps_danger"]
    assert len(seven["orig_captions"]) == 5


@pytest.mark.parametrize(
    "source,make,breaks,message",
    [
        ("sugarcrepe", sugarcrepe, lambda f: os.remove(f / "swap_att.json"), "swap_att.json: no such file"),
        (
            "sugarcrepe",
            sugarcrepe,
            lambda f: (f / "add_obj.json").write_text("[1, 2]"),
            "add_obj.json: expected a JSON object",
        ),
        (
            "sugarcrepe",
            sugarcrepe,
            lambda f: (f / "add_obj.json").write_text('{"5": {"filename": "x.jpg", "caption": "A."}}'),
            "add_obj.json: item '5': missing field 'negative_caption'",
        ),
        (
            "sugarcrepe++",
            sugarcrepe_pp,
            lambda f: (f / "swap_att.json").write_text(
                '[{"id": 3, "filename": "x.jpg", "caption": "", "caption2": "b", "negative_caption": "c"}]'
            ),
            "swap_att.json: item 0 (id 3): field 'caption' must be a non-empty string",
        ),
        (
            "rococo",
            rococo,
            lambda f: (f / "rand_voca.json").write_text('[{"image": "a.jpg", "caption": ["x", "y"]}]'),
            "rand_voca.json: item 0: field 'caption' must list 10 or 11 texts",
        ),
        (
            "rococo",
            rococo,
            lambda f: (f / "rand_voca.json").write_text('[{"image": "a.jpg"}]'),
            "rand_voca.json: item 0: missing field 'caption'",
        ),
        (
            "sugarcrepe",
            sugarcrepe,
            lambda f: (f / "add_obj.json").write_text(
                '{"5": {"filename": "x.jpg", "caption": "A red \\ud800 bus.", "negative_caption": "A bus."}}'
            ),
            "add_obj.json: field '5.caption' holds a lone UTF-16 surrogate",
        ),
        (
            "sugarcrepe",
            sugarcrepe,
            lambda f: [
                (f / (n + ".json")).write_text("{}")
                for n in ("add_att", "add_obj", "replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj")
            ],
            "no item in sugarcrepe's files (",
        ),
    ],
)
def test_bad_input_names_file_item_and_field(tmp_path, source, make, breaks, message):
    folder = make(tmp_path / "src")
    breaks(folder)
    out, proc = run_import(source, folder, tmp_path, check=False)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not out.exists() and not os.path.exists(str(out) + ".meta.json")


def test_an_id_written_twice_is_said_and_the_records_and_meta_are_written_together(tmp_path):
    """An item id written twice in one file: JSON keeps the last (as SugarCrepe's loader reads it),
    said on the console; OUTPUT_JSONL of the wrong type is a settings error; the JSONL and its meta
    file are one set: when the meta cannot be written, the earlier pair stays as it was."""
    folder = sugarcrepe(tmp_path / "src", missing_image=False)
    text = (folder / "add_att.json").read_text(encoding="utf-8")
    (folder / "add_att.json").write_text(
        text[:-1]
        + ', "0": '
        + json.dumps({"filename": img(2), "caption": "A dog.", "negative_caption": "A cat."})
        + "}",
        encoding="utf-8",
    )
    out, proc = run_import("sugarcrepe", folder, tmp_path)
    assert "add_att.json: 1 key(s) written twice in one object ('0'): JSON keeps the last of each" in proc.stderr
    recs = lines(out)
    assert any("A dog." in r["orig_captions"] for r in recs)
    assert not any(
        "A red bus on the street." in r["orig_captions"]
        and "A red bus on the wet street." in sum(r.get("diff_caps", {}).values(), [])
        for r in recs
    )
    before = out.read_bytes(), (tmp_path / "out" / "sugarcrepe.jsonl.meta.json").read_bytes()
    os.remove(str(out) + ".meta.json")
    os.mkdir(str(out) + ".meta.json")  # (a folder where the meta file goes: it cannot be written)
    proc = run_script(
        "import_benchmark.py",
        "--SOURCE=sugarcrepe",
        f"--SOURCE_DIR={sugarcrepe(tmp_path / 'again')}",
        f"--IMAGE_DIRS={[IMAGES]!r}",
        f"--OUTPUT_JSONL={out}",
        check=False,
    )
    assert proc.returncode != 0 and "sugarcrepe.jsonl.meta.json" in proc.stderr
    assert out.read_bytes() == before[0]  # (the records were not replaced without their meta)
    proc = run_script(
        "import_benchmark.py", "--SOURCE=sugarcrepe", f"--SOURCE_DIR={folder}", "--OUTPUT_JSONL=5", check=False
    )
    assert (
        proc.returncode == 2
        and "OUTPUT_JSONL must be None or the path of the JSONL file to write, got 5" in proc.stderr
    )


def test_no_image_found_is_an_error(tmp_path):
    out, proc = run_import("sugarcrepe", sugarcrepe(tmp_path / "sc"), tmp_path, dirs=[str(tmp_path)], check=False)
    assert proc.returncode == 2 and "none of the 4 images of sugarcrepe was found in IMAGE_DIRS" in proc.stderr
    assert not out.exists()


def test_positive_rate_per_type_is_sugarcrepes_accuracy(tmp_path):
    """run_lgip_by_fliptype.py on the imported file: per type, the share of items with
    sim(image, caption) > sim(image, negative), strict, as SugarCrepe's main_eval.py scores them."""
    import run_lgip_by_fliptype
    from lgip.models import load_model
    from PIL import Image

    out, _ = run_import("sugarcrepe", sugarcrepe(tmp_path / "sc", missing_image=False), tmp_path)
    row = run_lgip_by_fliptype.run(
        JSONL_PATH=str(out),
        MODELS=[OPENCLIP_TINY],
        DEVICE="cpu",
        NUM_WORKERS=0,
        BOOTSTRAP=0,
        CACHE_DIR=None,
        WRITE_SCORES=False,
    )[0]
    assert list(row["by_flip_type"]) == ["add_att", "replace_att", "swap_obj"]  # the types the file has, in order
    enc = load_model(OPENCLIP_TINY, "corrected", "cpu")
    import torch

    def emb_text(t):
        return enc.encode_tokens(torch.tensor([enc.tokenize([t])[0]]))[0].double().numpy()

    def emb_image(name):
        with Image.open(os.path.join(IMAGES, name)) as im:
            return enc.encode_images(enc.image_transform(im.convert("RGB"))[None])[0].double().numpy()

    for stem in ("add_att", "replace_att", "swap_obj"):
        items = json.load(open(tmp_path / "sc" / f"{stem}.json")).values()
        wins = [
            emb_image(i["filename"]) @ emb_text(i["caption"])
            > emb_image(i["filename"]) @ emb_text(i["negative_caption"])
            for i in items
        ]
        block = row["by_flip_type"][stem]
        assert block["count"] == len(wins) and block["pos_rate"] == pytest.approx(np.mean(wins), abs=1e-12), stem
    assert row["robust_pos_rate"] is None  # (no paraphrases in SugarCrepe)


def test_an_imported_file_runs_end_to_end_through_run_all(tmp_path):
    """run_all.py on an imported benchmark: the evaluations and the report, no generator step; every
    evaluation breaks its figures down by the benchmark's own types, in the file's order;
    explain_flips.py explains the one-word replacements only and counts the others."""
    out, _ = run_import("sugarcrepe", sugarcrepe(tmp_path / "sc", missing_image=False), tmp_path)
    proc = run_script(
        "run_all.py",
        f"--BENCHMARK_JSONL={out}",
        f"--MODELS={[OPENCLIP_TINY]!r}",
        "--DEVICE=cpu",
        "--NUM_WORKERS=0",
        "--SETTINGS={'BOOTSTRAP': 20}",
        "--VERBOSE=True",
    )
    assert "data: imported benchmark" in proc.stdout
    ran = re.findall(r"^\[\d+/(\d+)\] (\w+)  done", proc.stdout, re.M)
    assert [name for _, name in ran] == [
        "blind_audit",  # (is the benchmark blind-solvable? LGIP_SPEC.md 15)
        "run_lgip_multi",
        "run_lgip_by_fliptype",
        "run_lgip_retrieval",
        "explain_flips",
        "run_lgip_images",
        "report",
    ]
    stem = str(out)[: -len(".jsonl")]
    types = ["add_att", "replace_att", "swap_obj"]
    fliptypes = json.load(open(stem + "__LGIP_fliptypes.metrics.json"))[0]
    assert list(fliptypes["by_flip_type"]) == types
    assert list(json.load(open(stem + "__LGIP_retrieval.metrics.json"))[0]["by_flip_type"]) == types
    explain = json.load(open(stem + "__LGIP_explain.metrics.json"))[0]
    assert list(explain["by_flip_type"]) == ["replace_att"] and explain["num_flips"] == 3
    assert explain["skipped"]["not_one_word_replaced"] == 3  # the two add_att (a word added) and the swap
    assert os.path.isfile(stem + "__LGIP_report.html") and os.path.isfile(stem + "__LGIP_ALL.metrics.json")
    assert os.path.isfile(stem + "__LGIP_images.metrics.json")  # the image side, on the imported file itself
