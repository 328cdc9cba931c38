"""make_base_jsonl.py on a small COCO-format captions file built in tmp_path."""

import json
import os
import random

import pytest

from lgip.records import dump_jsonl_line, iter_records
from conftest import run_script

SCRIPT = "make_base_jsonl.py"
# image id -> annotation ids of its captions, in the order they appear in the file.
CAPTION_IDS = {
    8: [81, 82, 83, 84, 85],
    3: [31, 32, 33, 34],  # fewer than five captions: skipped
    1: [11, 12, 13, 14, 15],
    2: [26, 21, 25, 22, 24, 23],  # six, out of id order: 21..25 kept
    4: [41, 42, 43, 44, 45],  # its image file is missing: skipped when CHECK_IMAGES
    5: [51, 52, 53, 54, 55],
    6: [61, 62, 63, 64, 65],
    7: [77, 71, 76, 72, 75, 73, 74],  # seven, out of id order: 71..75 kept
}
UNKNOWN_IMAGE = (999, 500)  # (image id, annotation id) of an annotation with no image
MISSING_FILE = {4}
ELIGIBLE = [1, 2, 5, 6, 7, 8]  # with CHECK_IMAGES, in image-id order
VERBATIM = "  A dog asleep on a couch. \n"  # caption 11: kept exactly, whitespace included


def caption_text(ann_id):
    return VERBATIM if ann_id == 11 else f"Caption {ann_id} of a red bus."


def file_name(image_id):
    return f"{image_id:012d}.jpg"


def coco_dict():
    images = [{"id": i, "file_name": file_name(i), "height": 480, "width": 640} for i in CAPTION_IDS]
    annotations = [{"id": a, "image_id": i, "caption": caption_text(a)} for i, ids in CAPTION_IDS.items() for a in ids]
    annotations.append({"id": UNKNOWN_IMAGE[1], "image_id": UNKNOWN_IMAGE[0], "caption": "No such image."})
    random.Random(0).shuffle(annotations)  # captions of an image are interleaved with others
    return {"info": {}, "licenses": [], "images": images, "annotations": annotations}


class Coco:
    """Paths of a COCO-layout tree in tmp_path; run() calls the script on it."""

    def __init__(self, root, data):
        self.annotations = root / "coco" / "annotations" / "captions_train2017.json"
        self.image_dir = root / "coco" / "train2017" / "train2017"
        self.output = root / "out" / "base.jsonl"
        self.annotations.parent.mkdir(parents=True)
        self.image_dir.mkdir(parents=True)
        self.write(data)
        for image_id in CAPTION_IDS:
            if image_id not in MISSING_FILE:
                (self.image_dir / file_name(image_id)).write_bytes(b"\xff\xd8 not a real jpeg")

    def write(self, data):
        text = data if isinstance(data, str) else json.dumps(data)
        self.annotations.write_text(text, encoding="utf-8")

    def run(self, *args, check=True):
        return run_script(
            SCRIPT,
            f"--ANNOTATIONS_JSON={self.annotations}",
            f"--IMAGE_DIR={self.image_dir}",
            f"--OUTPUT_JSONL={self.output}",
            *args,
            check=check,
        )

    def records(self):
        return [rec for _, rec in iter_records(str(self.output))]


@pytest.fixture
def coco(tmp_path):
    return Coco(tmp_path, coco_dict())


def expected_captions(image_id):
    return [caption_text(a) for a in sorted(CAPTION_IDS[image_id])[:5]]


def test_records_are_first_five_captions_by_annotation_id(coco):
    coco.run("--N_IMAGES=None")
    recs = coco.records()  # readable by the generators' reader
    assert [r["image_id"] for r in recs] == ELIGIBLE
    for r in recs:
        assert list(r) == ["image_id", "image_path", "orig_captions"]
        assert r["orig_captions"] == expected_captions(r["image_id"])
    assert recs[0]["orig_captions"][0] == VERBATIM  # not stripped
    lines = coco.output.read_text(encoding="utf-8").splitlines(keepends=True)
    assert lines == [dump_jsonl_line(r) for r in recs]


def test_image_paths_are_relative_to_the_output(coco):
    coco.run("--N_IMAGES=None")
    for r in coco.records():
        assert r["image_path"] == f"../coco/train2017/train2017/{file_name(r['image_id'])}"
        assert os.path.isfile(os.path.join(coco.output.parent, r["image_path"]))


def test_reports_what_it_skipped_and_why(coco):
    proc = coco.run("--N_IMAGES=None")
    out = proc.stdout
    assert "8 images in file" in out and "6 eligible, 6 written" in out
    assert "skipped (fewer than 5 captions): 1 images; first image ids: 3" in out
    assert "skipped (image file missing, empty or a folder): 1 images; first image ids: 4" in out
    assert "unknown image id: 1; first annotation ids: 500" in out
    assert "records/s" in out
    meta = json.loads((coco.output.parent / "base.jsonl.meta.json").read_text())
    assert meta["counts"] == {
        "annotations": sum(map(len, CAPTION_IDS.values())) + 1,
        "annotations_unknown_image": 1,
        "annotations_blank_caption": 0,
        "annotations_repeated_id": 0,
        "images_in_file": 8,
        "eligible": 6,
        "skipped_too_few_captions": 1,
        "skipped_image_missing": 1,
        "written": 6,
    }
    assert meta["skipped_examples"]["image_missing"] == [4]
    assert meta["config"]["SEED"] == 42 and meta["script"] == SCRIPT and "python" in meta["versions"]


def test_without_image_check_missing_files_are_kept(coco):
    proc = coco.run("--N_IMAGES=None", "--CHECK_IMAGES=False")
    assert [r["image_id"] for r in coco.records()] == sorted(ELIGIBLE + [4])
    assert "not checked" in proc.stdout


def test_seeded_choice_is_reproducible_and_in_id_order(coco):
    coco.run("--N_IMAGES=3")
    first = coco.output.read_bytes()
    coco.run("--N_IMAGES=3")
    assert coco.output.read_bytes() == first
    chosen = [r["image_id"] for r in coco.records()]
    assert chosen == sorted(random.Random(42).sample(ELIGIBLE, 3))

    other = sorted(random.Random(7).sample(ELIGIBLE, 3))
    assert other != chosen  # the fixture's two seeds really pick different images
    coco.run("--N_IMAGES=3", "--SEED=7")
    assert [r["image_id"] for r in coco.records()] == other


def test_n_images_above_eligible_writes_all(coco):
    proc = coco.run("--N_IMAGES=100")
    assert [r["image_id"] for r in coco.records()] == ELIGIBLE
    assert "fewer than N_IMAGES=100" in proc.stdout


_DELETE = object()


def _drop(key):
    def edit(d):
        del d[key]

    return edit


def _edit_annotation(field, value):
    def edit(d):
        ann = d["annotations"][2]
        if value is _DELETE:
            del ann[field]
        else:
            ann[field] = value

    return edit


@pytest.mark.parametrize(
    "edit,expected",
    [
        ('{"images": [', "invalid JSON"),
        (_drop("images"), "missing field 'images'"),
        (_drop("annotations"), "missing field 'annotations'"),
        (_edit_annotation("image_id", _DELETE), "annotations[2] (id {id}): missing field 'image_id'"),
        (_edit_annotation("caption", _DELETE), "annotations[2] (id {id}): missing field 'caption'"),
        (_edit_annotation("caption", 7), "annotations[2] (id {id}): field 'caption' is int, expected a string"),
        (_edit_annotation("caption", ["A bus."]), "annotations[2] (id {id}): field 'caption' is list"),
        (_edit_annotation("caption", "A \ud800 bus."), "field 'annotations[2].caption' holds a lone UTF-16 surrogate"),
    ],
)
def test_malformed_annotations_stop_with_file_and_field(coco, edit, expected):
    data = coco_dict()
    if isinstance(edit, str):
        coco.write(edit)
    else:
        edit(data)
        coco.write(data)
    coco.output.parent.mkdir()
    coco.output.write_text("previous run\n")
    proc = coco.run("--N_IMAGES=None", check=False)
    assert proc.returncode == 2
    expected = expected.format(id=data["annotations"][2]["id"]) if "{id}" in expected else expected
    assert f"{coco.annotations}: {expected}" in proc.stderr
    assert coco.output.read_text() == "previous run\n"


def test_missing_annotations_file_says_where_it_goes(coco, tmp_path):
    missing = tmp_path / "nowhere" / "captions_train2017.json"
    proc = run_script(SCRIPT, f"--ANNOTATIONS_JSON={missing}", f"--OUTPUT_JSONL={coco.output}", check=False)
    assert proc.returncode == 2
    assert f"{missing}: no such file" in proc.stderr
    assert os.path.join("annotations", "") in proc.stderr and "captions_train2017.json" in proc.stderr
    assert not coco.output.exists()


def test_missing_image_folder_is_an_error_when_checking(coco, tmp_path):
    missing = tmp_path / "no_images"
    proc = run_script(
        SCRIPT,
        f"--ANNOTATIONS_JSON={coco.annotations}",
        f"--IMAGE_DIR={missing}",
        f"--OUTPUT_JSONL={coco.output}",
        check=False,
    )
    assert proc.returncode == 2
    assert f"{missing}: image folder not found" in proc.stderr and "--CHECK_IMAGES=False" in proc.stderr


def test_empty_images_blank_captions_and_repeated_ids_are_skipped_and_counted(tmp_path):
    data = coco_dict()
    for ann in data["annotations"]:
        if ann["id"] == 62:
            ann["caption"] = "  \n"  # image 6 is left with 4 captions
    data["annotations"].append({"id": 81, "image_id": 1, "caption": "A repeat of annotation 81's id."})  # after it
    coco = Coco(tmp_path, data)
    (coco.image_dir / file_name(5)).write_bytes(b"")  # a zero-byte file
    (coco.image_dir / file_name(7)).unlink()
    (coco.image_dir / file_name(7)).mkdir()  # a folder with the image's name
    out = coco.run("--N_IMAGES=None").stdout
    recs = coco.records()
    assert [r["image_id"] for r in recs] == [1, 2, 8]
    assert recs[0]["orig_captions"] == expected_captions(1)  # the repeat was not taken as image 1's caption
    assert "skipped (image file missing, empty or a folder): 3 images; first image ids: 4, 5, 7" in out
    assert "skipped annotations with an empty or blank caption: 1; first annotation ids: 62" in out
    assert "the id of an earlier annotation (the first one is kept): 1; first annotation ids: 81" in out
    counts = json.loads((coco.output.parent / "base.jsonl.meta.json").read_text())["counts"]
    assert counts["annotations_blank_caption"] == counts["annotations_repeated_id"] == 1
    assert counts["skipped_too_few_captions"] == 2 and counts["skipped_image_missing"] == 3


def test_output_equal_to_the_annotations_file_is_refused(coco, tmp_path):
    before = coco.annotations.read_bytes()
    link = tmp_path / "link.json"
    link.symlink_to(coco.annotations)
    for output in (coco.annotations, link):
        proc = run_script(
            SCRIPT,
            f"--ANNOTATIONS_JSON={coco.annotations}",
            f"--IMAGE_DIR={coco.image_dir}",
            f"--OUTPUT_JSONL={output}",
            check=False,
        )
        assert proc.returncode == 2 and "is the input file" in proc.stderr and "Traceback" not in proc.stderr
        assert coco.annotations.read_bytes() == before


def test_annotations_path_that_is_a_folder_is_said(coco):
    proc = coco.run(f"--ANNOTATIONS_JSON={coco.annotations.parent}", check=False)
    assert proc.returncode == 2 and f"{coco.annotations.parent}: is a directory, expected a JSON file" in proc.stderr


def test_no_image_to_write_is_an_error_and_writes_nothing(coco, tmp_path):
    """Every image missing from IMAGE_DIR: an empty base would pass for one (it was written, exit 0)."""
    empty = tmp_path / "empty_images"
    empty.mkdir()
    proc = run_script(
        SCRIPT,
        f"--ANNOTATIONS_JSON={coco.annotations}",
        f"--IMAGE_DIR={empty}",
        f"--OUTPUT_JSONL={coco.output}",
        check=False,
    )
    assert proc.returncode == 2 and "no image of" in proc.stderr and "not found in IMAGE_DIR" in proc.stderr, (
        proc.stderr
    )
    assert "nothing was written" in proc.stderr and not coco.output.exists()
