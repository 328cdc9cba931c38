"""lgip.classification.datasets: the image sets of run_lgip_classification.py's DATASETS (LGIP_SPEC.md 16), read
and checked before any model loads. A dataset is `{"name", "source", "role", ...}`; `load_sets` turns the list
into `ImageSet`s (images in the dataset's own order, labels, class names, templates, the temperature split's
keys), or ends with an InputError (exit status 2) naming the dataset, the file and line or field, and what to do.

Sources: "folder" (torchvision's ImageFolder layout), "jsonl" (a line per image), "shapes" (the shapes world:
its held-out images by object word, and images of glyphs no class has), and "clip_benchmark"
(lgip.classification.benchmark). An image is a file's path, or an item that makes its own image and cache key
(`make`, `cache_key`: a webdataset's member, a dataset's item by index; lgip.images and lgip.cache take both).

    >>> sets = load_sets([{"name": "pets", "source": "folder", "role": "id", "root": "pets/"}])
    >>> sets[0].classes, sets[0].images[:2], sets[0].labels[:2]
"""

import json
import os
from dataclasses import dataclass, field
from typing import Optional

from ..errors import InputError
from ..method import OBJECTS
from ..records import iter_json_lines, read_json

SOURCES = ("clip_benchmark", "folder", "jsonl", "shapes")
ROLES = ("id", "shift", "ood", "cue_conflict")
# the keys each source reads beside name, source and role ("categories": a cue_conflict set's)
KEYS = {
    "clip_benchmark": ("dataset", "root", "split", "classnames", "templates"),
    "folder": ("root", "classnames", "templates"),
    "jsonl": ("path", "classnames", "templates"),
    "shapes": ("root", "count", "heldout"),
}
SHAPES_TEMPLATES = ["a drawing of {c} icons.", "{c} icons on a plain background."]
# the shapes world's id set: the held-out records of its fine-tuning split, else all of its main part
SHAPES_HELDOUT = ("lgip_shapes__ft_heldout.jsonl", "lgip_shapes_with_fliptypes__ft_heldout.jsonl", "lgip_shapes.jsonl")
PRESETS = {
    "shapes": [
        {"name": "shapes", "source": "shapes", "role": "id"},
        {"name": "shapes_ood", "source": "shapes", "role": "ood"},
    ]
}


@dataclass
class ImageSet:
    """One dataset, read: its images in the dataset's own order (a file path, or an item making its image), what a
    JSONL line says of each (`shown`: a path relative to the root, a member's name, or None), the temperature split's
    key k of each (`split_keys`), labels (None on an "ood" set), class names and templates (an "ood" set: the id
    set's), and a cue_conflict set's shape and texture labels and category map."""

    name: str
    role: str
    source: str
    where: str  # the file or folder it was read from (what an error names)
    classes: list
    templates: list
    images: list
    shown: list
    split_keys: list
    labels: list
    shape_labels: Optional[list] = None
    texture_labels: Optional[list] = None
    categories: Optional[list] = None  # [(category name, [class index, ...])] in the map's order
    unreadable_as: str = "path"  # what `unreadable` lists of an image: its "path" (shown) or its "index"
    info: dict = field(default_factory=dict)  # what the row records of the source (the CLIP_benchmark name, ...)


class Where:
    """What an error about one dataset names: `DATASETS[i] ('name')`, then the file, line or field."""

    def __init__(self, i, spec):
        self.label = f"DATASETS[{i}] ({spec.get('name')!r})" if isinstance(spec, dict) else f"DATASETS[{i}]"

    def error(self, message):
        return InputError(f"{self.label}: {message}")


def load_sets(datasets, templates="dataset", shapes_root=None):
    """DATASETS (a list of dicts, or a preset's name: "shapes") read and checked, with TEMPLATES ("dataset": each
    set's own; a list, or a CLIP_benchmark template key: every set's) applied: [ImageSet] in DATASETS order, an
    "ood" set given the id set's classes and templates. InputError for the first bad dataset (module docstring)."""
    if isinstance(datasets, str):
        if datasets not in PRESETS:
            raise InputError(f"DATASETS: unknown preset {datasets!r}; give {', '.join(PRESETS)} or a list of datasets")
        datasets = PRESETS[datasets]
    if not isinstance(datasets, (list, tuple)) or not datasets:
        raise InputError(
            f'DATASETS: give a non-empty list of datasets {{"name", "source", "role", ...}}, got {datasets!r}'
        )
    specs = [_check_spec(i, spec) for i, spec in enumerate(datasets)]
    ids = [s for s in specs if s["role"] == "id"]
    if len(ids) > 1:
        raise InputError(
            f"DATASETS: two sets have role 'id' ({ids[0]['name']!r}, {ids[1]['name']!r}): at most one is the "
            f"in-distribution set (the others: 'shift', 'ood' or 'cue_conflict')"
        )
    if any(s["role"] == "ood" for s in specs) and not ids:
        name = next(s["name"] for s in specs if s["role"] == "ood")
        raise InputError(
            f"DATASETS: the 'ood' set {name!r} needs an 'id' set (its images are scored with the id set's classes and "
            f"templates, and told apart from its images): give one with role 'id'"
        )
    given = _templates_setting(templates)
    sets = []
    for i, spec in enumerate(specs):
        where = Where(i, spec)
        read = _READERS[spec["source"]](spec, where, shapes_root)
        if spec["role"] != "ood":
            if given is not None:
                read.templates = list(given)
            _check_classes(read, where)
        if not read.images:
            raise where.error(f"{read.where}: no image: the dataset is empty (give one that holds images)")
        sets.append(read)
    idset = next((s for s in sets if s.role == "id"), None)
    if idset is not None and len(idset.images) < 2:
        raise InputError(
            f"DATASETS: the 'id' set {idset.name!r} holds {len(idset.images)} image: its temperature is fitted on one "
            f"half and judged on the other, so it needs at least 2"
        )
    for s in sets:
        if s.role == "ood":
            s.classes, s.templates = idset.classes, idset.templates
    return sets


def _check_spec(i, spec):
    where = Where(i, spec)
    if not isinstance(spec, dict):
        raise where.error(f'expected a dict {{"name", "source", "role", ...}}, got {type(spec).__name__}')
    name = spec.get("name")
    if not isinstance(name, str) or not name.strip():
        raise where.error(f'field "name": give each dataset a non-empty name (it keys the outputs), got {name!r}')
    if spec.get("source") not in SOURCES:
        raise where.error(f'field "source": unknown source {spec.get("source")!r}; one of {", ".join(SOURCES)}')
    if spec.get("role") not in ROLES:
        raise where.error(f'field "role": unknown role {spec.get("role")!r}; one of {", ".join(ROLES)}')
    valid = (
        ("name", "source", "role") + KEYS[spec["source"]] + (("categories",) if spec["role"] == "cue_conflict" else ())
    )
    for key in spec:
        if key not in valid:
            raise where.error(
                f"unknown key {key!r} for a {spec['source']} set of role {spec['role']!r}; valid: {', '.join(valid)}"
            )
    if spec["role"] == "cue_conflict" and spec["source"] != "jsonl":
        raise where.error("field \"source\": a cue_conflict set's shape and texture labels are a jsonl set's lines")
    if spec["source"] == "shapes" and spec["role"] not in ("id", "ood"):
        raise where.error('field "role": the shapes world gives an "id" set (its held-out images) and an "ood" set')
    if spec["role"] == "ood":
        for key in ("classnames", "templates"):
            if key in spec:
                raise where.error(
                    f'field "{key}": an "ood" set is scored with the id set\'s classes and templates: remove it'
                )
    return spec


def _templates_setting(value):
    """TEMPLATES: None for "dataset" (each set's own), else the list every set takes."""
    if value == "dataset":
        return None
    return read_templates(value, "TEMPLATES")


def read_templates(value, what):
    """A list of templates (each with {c}; a {} read as {c}), or a CLIP_benchmark template key (its templates)."""
    if isinstance(value, str):
        known = clip_benchmark_templates()
        if value not in known:
            import difflib

            close = difflib.get_close_matches(value, list(known), n=3)
            raise InputError(
                f"{what}: {value!r} is no CLIP_benchmark template key"
                + (f" (did you mean {', '.join(close)}?)" if close else "")
                + ': give a list of templates with {c}, or a key such as "imagenet1k" (OpenAI\'s 80) or "cifar10"'
            )
        value = known[value]
    if not isinstance(value, (list, tuple)) or not value:
        raise InputError(f"{what}: give a non-empty list of templates holding {{c}}, or a template key, got {value!r}")
    out = []
    for j, t in enumerate(value):
        if not isinstance(t, str) or ("{c}" not in t and "{}" not in t):
            raise InputError(f"{what}[{j}]: template {t!r} has no {{c}} (or {{}}) where the class name goes: add one")
        t = t.replace("{}", "{c}")
        try:
            t.format(c="x")
        except (KeyError, IndexError, ValueError) as e:
            raise InputError(
                f"{what}[{j}]: template {t!r} holds braces other than {{c}} ({type(e).__name__}: {e}): "
                f"double a brace that is text ({{{{ }}}})"
            ) from None
        out.append(t)
    return out


def clip_benchmark_templates():
    """CLIP_benchmark's zero-shot templates by key (its en_zeroshot_classification_templates.json)."""
    import clip_benchmark.datasets as cbd

    with open(os.path.join(os.path.dirname(cbd.__file__), "en_zeroshot_classification_templates.json")) as f:
        return {k: v for k, v in json.load(f).items() if isinstance(v, list)}


def read_classnames(value, where, field_name="classnames"):
    """A list of class names, or a file of one name a line (blank lines ignored)."""
    if isinstance(value, str):
        if not os.path.isfile(value):
            raise where.error(f'field "{field_name}": {value}: no such file (a list of names, or a file of one a line)')
        with open(value, encoding="utf-8-sig") as f:
            value = [line.strip() for line in f if line.strip()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(c, str) and c.strip() for c in value) or not value:
        raise where.error(
            f'field "{field_name}": give a non-empty list of class names (or a file of them), got {value!r}'
        )
    return list(value)


def _check_classes(s, where):
    """Labels within the classes, templates checked, a category map read."""
    s.templates = read_templates(s.templates, f'{where.label}: field "templates"')
    n = len(s.classes)
    for j, y in enumerate(s.labels):
        if y is not None and not 0 <= y < n:
            raise where.error(
                f"{s.where}: image {s.shown[j] or j}: label {y} out of range: the dataset has {n} classes (0..{n - 1})"
            )


def _dataset_templates(spec, default):
    return spec["templates"] if "templates" in spec else default


def read_folder(spec, where, shapes_root=None):
    """torchvision's ImageFolder layout: classes the sorted sub-folder names, images as ImageFolder lists them."""
    from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

    root = _root(spec, where)
    try:
        folders, index = find_classes(root)
        samples = make_dataset(root, index, extensions=IMG_EXTENSIONS, allow_empty=True)
    except (FileNotFoundError, OSError) as e:
        raise where.error(f"{root}: not an ImageFolder (a sub-folder per class, images in them): {e}") from None
    classes = [f.replace("_", " ") for f in folders]
    if "classnames" in spec:
        classes = read_classnames(spec["classnames"], where)
        if len(classes) != len(folders):
            raise where.error(
                f'field "classnames": {len(classes)} names for the {len(folders)} class folders of {root} '
                f"(one name per folder, in their sorted order)"
            )
    rel = [os.path.relpath(p, root).replace(os.sep, "/") for p, _ in samples]
    return ImageSet(
        spec["name"],
        spec["role"],
        "folder",
        root,
        classes,
        _dataset_templates(spec, "imagenet1k"),
        [p for p, _ in samples],
        rel,
        rel,
        [y for _, y in samples] if spec["role"] != "ood" else [None] * len(rel),
    )


def read_jsonl(spec, where, shapes_root=None):
    """A line per image: image_path (relative to the file), label (an int; absent or null on an "ood" set), a
    cue_conflict set's shape_label and texture_label."""
    path = spec.get("path")
    if not isinstance(path, str) or not os.path.isfile(path):
        raise where.error(f'field "path": {path!r}: no such file (a JSONL file, a line per image)')
    role, folder = spec["role"], os.path.dirname(os.path.abspath(path))
    need = ["label"] if role != "ood" else []
    need += ["shape_label", "texture_label"] if role == "cue_conflict" else []
    images, shown, labels, at_line, marks = [], [], [], [], {k: [] for k in ("shape_label", "texture_label")}
    for line, rec in iter_json_lines(path):
        at = f"{path}:{line}"
        if not isinstance(rec, dict) or not isinstance(rec.get("image_path"), str) or not rec["image_path"]:
            raise where.error(f'{at}: field "image_path": each line needs the image\'s path (relative to the file)')
        for key in need:
            v = rec.get(key)
            if not isinstance(v, int) or isinstance(v, bool):
                what = "missing" if v is None else f"{v!r} is not an int"
                raise where.error(f'{at}: field "{key}" {what}: give the class index (0 = the first class name)')
        images.append(os.path.join(folder, rec["image_path"]))
        shown.append(rec["image_path"])
        labels.append(rec["label"] if role != "ood" else None)
        at_line.append(line)
        for key in marks:
            marks[key].append(rec.get(key) if role == "cue_conflict" else None)
    if role != "ood" and "classnames" not in spec:
        raise where.error('field "classnames": a jsonl set names its classes (a list, or a file of one name a line)')
    classes = read_classnames(spec["classnames"], where) if role != "ood" else []
    for j, y in enumerate(labels):
        if y is not None and not 0 <= y < len(classes):
            raise where.error(
                f'{path}:{at_line[j]}: field "label": {y} out of range: the dataset has {len(classes)} classes '
                f"(0..{len(classes) - 1}, in the order of its classnames)"
            )
    out = ImageSet(
        spec["name"],
        role,
        "jsonl",
        path,
        classes,
        _dataset_templates(spec, "imagenet1k"),
        images,
        shown,
        list(shown),
        labels,
    )
    if role == "cue_conflict":
        out.shape_labels, out.texture_labels = marks["shape_label"], marks["texture_label"]
        out.categories = read_categories(spec, where, len(classes))
        limit = len(out.categories) if out.categories is not None else len(classes)
        for key, values in (("shape_label", out.shape_labels), ("texture_label", out.texture_labels)):
            for j, v in enumerate(values):
                if not 0 <= v < limit:
                    what = "categories" if out.categories is not None else "classes"
                    raise where.error(
                        f'{path}:{at_line[j]}: field "{key}": {v} out of range: {limit} {what} (0..{limit - 1})'
                    )
    return out


def read_categories(spec, where, n_classes):
    """A cue_conflict set's `categories` {category name: [class indices]} in the map's order, or None."""
    cats = spec.get("categories")
    if cats is None:
        return None
    if not isinstance(cats, dict) or not cats:
        raise where.error('field "categories": give {category name: [class index, ...]} (e.g. Geirhos et al.\'s 16)')
    out = []
    for name, members in cats.items():
        ok = isinstance(members, (list, tuple)) and members
        if not ok or not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c < n_classes for c in members):
            raise where.error(
                f'field "categories", {name!r}: give a non-empty list of class indices in 0..{n_classes - 1}, '
                f"got {members!r}"
            )
        out.append((name, list(members)))
    return out


def _root(spec, where, key="root"):
    root = spec.get(key)
    if not isinstance(root, str) or not os.path.isdir(root):
        raise where.error(f'field "{key}": {root!r} is no folder (give the dataset\'s folder)')
    return os.path.abspath(root)


def read_shapes(spec, where, shapes_root=None):
    """The shapes world (lgip.shapes, LGIP_SPEC.md 16): role "id": the held-out records (SHAPES_HELDOUT, or the
    file "heldout" names), each labelled by its object word, classes OBJECTS; role "ood": `count` images of
    glyphs no class has, made here from the world's SEED (image i from default_rng([SEED, 3, i]))."""
    from .. import shapes

    spec = dict(spec)
    spec.setdefault("root", shapes_root)
    root = _root(spec, where)
    if spec["role"] == "ood":
        count = spec.get("count", 200)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise where.error(f'field "count": images to make, an int >= 1, got {count!r}')
        meta = os.path.join(root, "lgip_shapes__shapes.meta.json")
        seed = read_json(meta).get("config", {}).get("SEED", 0) if os.path.isfile(meta) else 0
        rels = shapes.make_ood(root, count, seed)
        return ImageSet(
            spec["name"],
            "ood",
            "shapes",
            root,
            [],
            [],
            [os.path.join(root, r) for r in rels],
            rels,
            [str(i) for i in range(count)],
            [None] * count,
            info={"seed": seed},
        )
    if "count" in spec:
        raise where.error('field "count": only a shapes set of role "ood" makes images: remove it')
    path = spec.get("heldout") or next(
        (os.path.join(root, n) for n in SHAPES_HELDOUT if os.path.isfile(os.path.join(root, n))), None
    )
    if path is None or not os.path.isfile(path):
        raise where.error(
            f"{root}: no {', '.join(SHAPES_HELDOUT)}: make the shapes world first (python make_shapes_jsonl.py, or "
            f'python run_all.py --DATA=shapes), or name the records with "heldout"'
        )
    images, shown, labels = [], [], []
    for line, rec in iter_json_lines(path):
        obj = (
            rec.get("shapes", {}).get("object")
            if isinstance(rec, dict) and isinstance(rec.get("shapes"), dict)
            else None
        )
        if obj not in OBJECTS or not isinstance(rec.get("image_path"), str):
            raise where.error(
                f'{path}:{line}: field "shapes.object": a shapes world record names its object word ({obj!r} is '
                f"none of {', '.join(OBJECTS)}) and its image_path: give the world's own records"
            )
        images.append(os.path.join(os.path.dirname(os.path.abspath(path)), rec["image_path"]))
        shown.append(rec["image_path"])
        labels.append(OBJECTS.index(obj))
    return ImageSet(
        spec["name"],
        spec["role"],
        "shapes",
        path,
        list(OBJECTS),
        list(SHAPES_TEMPLATES),
        images,
        shown,
        [str(i) for i in range(len(images))],
        labels if spec["role"] != "ood" else [None] * len(images),
    )


def read_benchmark(spec, where, shapes_root=None):
    """A CLIP_benchmark dataset (lgip.classification.benchmark), its class names replaced by "classnames" if given."""
    from .benchmark import read_clip_benchmark

    got = read_clip_benchmark(spec, where)
    info = got.pop("info")
    out = ImageSet(spec["name"], spec["role"], "clip_benchmark", **got)
    out.info = info
    if "templates" in spec:
        out.templates = spec["templates"]
    if "classnames" in spec:
        given = read_classnames(spec["classnames"], where)
        if len(given) != len(out.classes):
            raise where.error(
                f'field "classnames": {len(given)} names for the {len(out.classes)} classes of {info["dataset"]}: '
                f"one per class, in CLIP_benchmark's order"
            )
        out.classes = given
    if spec["role"] == "ood":
        out.labels = [None] * len(out.images)
    return out


_READERS = {"folder": read_folder, "jsonl": read_jsonl, "shapes": read_shapes, "clip_benchmark": read_benchmark}
