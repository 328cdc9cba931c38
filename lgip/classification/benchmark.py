"""lgip.classification.benchmark: the "clip_benchmark" source of DATASETS (LGIP_SPEC.md 16): a dataset by its
CLIP_benchmark name through CLIP_benchmark's own builder (`build_dataset(dataset, root=root, split=split,
download=False, transform=None)`: its classes and templates), the root checked first (the builder downloads the
ImageNet family by itself whatever `download` says: lgip downloads nothing), sets that are not single-label
classification refused. Its images: the files of a dataset that lists them (ImageFolder, ImageNet, ImageNetV2),
a webdataset's shards read member by member (`TarMember`: the same bytes webdataset's pipeline decodes, read by
offset in the loader's workers, keyed by the shard's path, size and mtime), else the dataset's items by index
(`IndexedImage`, keyed by a hash of their pixels).

    >>> read_clip_benchmark({"name": "c10", "source": "clip_benchmark", "role": "id", "dataset": "cifar10",
    ...                      "root": "data/cifar10"}, where)["classes"][:2]
    ['airplane', 'automobile']
"""

import hashlib
import io
import os
import re
from typing import NamedTuple

NOT_CLASSIFICATION = {
    "voc2007_multilabel": "a multi-label set",
    "imagenet-w": "its watermark is added inside a model's transform, which lgip's workers do not hand it",
    "dummy": "a placeholder of one blank image",
}
WDS_IMAGE_EXTS = ("webp", "png", "jpg", "jpeg")  # CLIP_benchmark's to_tuple order
WDS_LAYOUT = (
    "<root>/<split>/nshards.txt, <root>/<split>/0.tar, 1.tar, ..., <root>/classnames.txt, "
    "<root>/zeroshot_classification_templates.txt (CLIP_benchmark's webdataset layout)"
)
IMAGENETV2 = ("ImageNetV2-matched-frequency", 10000)  # the extracted folder CLIP_benchmark reads, and its images
LAYOUTS = {
    "imagenet1k": "torchvision's ImageNet: ILSVRC2012_devkit_t12.tar.gz and ILSVRC2012_img_val.tar in the root",
    "imagenetv2": f"<root>/{IMAGENETV2[0]}/<class index>/<image>.jpeg, its {IMAGENETV2[1]:,} images (the extracted "
    "imagenetv2-matched-frequency.tar.gz)",
    "objectnet": "<root>/objectnet-1.0/ (the extracted objectnet-1.0.zip) and its mappings/ files copied into the root",
}
FOLDER_LAYOUT = "the extracted archive: a folder per class (<root>/<wnid>/<image>)"
for _name in ("imagenet_sketch", "imagenet-a", "imagenet-r", "imagenet-o"):
    LAYOUTS[_name] = FOLDER_LAYOUT
OTHER_LAYOUT = (
    "the files its torchvision class reads under the root (fetch them once with CLIP_benchmark itself: "
    "clip_benchmark eval --dataset={name} --dataset_root=<root>)"
)

_OPEN = {}  # dataset id -> a built dataset whose items are made by index (the loader's workers inherit it by fork)


def layout(name):
    return WDS_LAYOUT if name.startswith("wds/") else LAYOUTS.get(name, OTHER_LAYOUT.format(name=name))


def known(name):
    """True when CLIP_benchmark's build_dataset knows the name: one of its `dataset_name == "..."` branches, or a
    prefix it takes (`wds/`, `tfds/`, `vtab/`, `sugar_crepe/`), read from the builder's own source."""
    import inspect

    from clip_benchmark.datasets import builder

    source = inspect.getsource(builder.build_dataset)
    names = set(re.findall(r"dataset_name\s*==\s*[\"']([^\"']+)[\"']", source))
    prefixes = re.findall(r"dataset_name\.startswith\(\s*[\"']([^\"']+)[\"']", source)
    return name in names or any(name.startswith(p) and len(name) > len(p) for p in prefixes), sorted(names)


def read_clip_benchmark(spec, where):
    """A CLIP_benchmark dataset read (module docstring): {where, classes, templates, images, shown, split_keys,
    labels, unreadable_as, info}, which lgip.classification.datasets makes an ImageSet of; an InputError
    (where.error) naming the dataset, the root and its layout for a root that is missing or incomplete, a name
    CLIP_benchmark does not know, a set that is not single-label classification."""
    from clip_benchmark.datasets.builder import build_dataset, get_dataset_default_task

    name, split, root = spec.get("dataset"), spec.get("split", "test"), spec.get("root")
    if not isinstance(name, str) or not name:
        raise where.error('field "dataset": give a CLIP_benchmark dataset name, e.g. "imagenet1k" or "wds/<name>"')
    ok, names = known(name)
    if not ok:
        import difflib

        close = difflib.get_close_matches(name, names, n=3)
        raise where.error(
            f'field "dataset": CLIP_benchmark does not know {name!r}'
            + (f" (did you mean {', '.join(close)}?)" if close else "")
            + '; give one of its names ("imagenet1k", "imagenetv2", "imagenet-r", "cifar10", ...) or "wds/<name>"'
        )
    task = get_dataset_default_task(name)
    if name in NOT_CLASSIFICATION or task != "zeroshot_classification":
        why = NOT_CLASSIFICATION.get(name, f"CLIP_benchmark's task for it is {task}")
        raise where.error(f'field "dataset": {name!r} is no single-label classification set ({why}): give one that is')
    if not isinstance(split, str) or not split:
        raise where.error(f'field "split": give the split\'s name ("test"), got {split!r}')
    if not isinstance(root, str) or not os.path.isdir(root):
        raise where.error(
            f'field "root": {root!r} does not exist; {name} needs {layout(name)}. lgip downloads nothing '
            f"(CLIP_benchmark would fetch the ImageNet family by itself): give the folder that holds it"
        )
    root = os.path.abspath(root)
    if name.startswith("wds/"):
        _check_wds(root, split, name, where)
    if name == "imagenetv2":
        folder = os.path.join(root, IMAGENETV2[0])
        n = sum(f.endswith(".jpeg") for _, _, fs in os.walk(folder) for f in fs) if os.path.isdir(folder) else 0
        if n != IMAGENETV2[1]:
            raise where.error(
                f'field "root": {root} lacks {IMAGENETV2[0]}/ with its {IMAGENETV2[1]:,} images ({n:,} found; '
                f"CLIP_benchmark would download it): imagenetv2 needs {layout(name)}"
            )
    try:
        ds = build_dataset(name, root=root, split=split, download=False, transform=None)
    except Exception as e:  # (any failure of the builder: the root's files are not what it reads)
        raise where.error(
            f'field "root": CLIP_benchmark could not read {name} ({split}) from {root} ({type(e).__name__}: '
            f"{str(e).splitlines()[0] if str(e) else ''}); {name} needs {layout(name)}"
        ) from None
    classes, templates = getattr(ds, "classes", None), getattr(ds, "templates", None)
    if spec["role"] != "ood" and not classes:
        raise where.error(
            f"{root}: CLIP_benchmark gives no class names for {name}: add classnames.txt ({layout(name)})"
        )
    if spec["role"] != "ood" and not templates and "templates" not in spec:
        raise where.error(f'{root}: CLIP_benchmark gives no templates for {name}: give "templates" ({layout(name)})')
    images, shown, keys, labels, unreadable_as = _images(ds, name, root, split, where)
    return {
        "where": root,
        "classes": list(classes or []),
        "templates": list(templates or []),
        "images": images,
        "shown": shown,
        "split_keys": keys,
        "labels": labels,
        "unreadable_as": unreadable_as,
        "info": {"dataset": name, "split": split},
    }


def _check_wds(root, split, name, where):
    nshards = os.path.join(root, split, "nshards.txt")
    if not os.path.isfile(nshards):
        raise where.error(f'field "root": {root} has no {split}/nshards.txt; {name} needs {WDS_LAYOUT}')
    kind = os.path.join(root, "dataset_type.txt")
    kind = open(kind, encoding="utf-8").read().strip().lower() if os.path.isfile(kind) else "classification"
    if kind != "classification":
        raise where.error(
            f'field "dataset": {name} is a webdataset of type {kind!r} (dataset_type.txt): not a single-label '
            f"classification set"
        )


def _images(ds, name, root, split, where):
    """(images, shown, split keys, labels, unreadable_as) of a built dataset, in its own order."""
    if name.startswith("wds/"):
        items, shown, labels = wds_members(root, split, where)
        return items, shown, [str(i) for i in range(len(items))], labels, "index"
    samples = getattr(ds, "samples", None)
    if samples is None and getattr(ds, "fnames", None) is not None:  # (ImageNetV2: the label is the folder's name)
        samples = [(str(p), int(os.path.basename(os.path.dirname(str(p))))) for p in ds.fnames]
    if samples is not None:
        paths = [os.path.abspath(str(p)) for p, _ in samples]
        shown = [os.path.relpath(p, root).replace(os.sep, "/") for p in paths]
        return paths, shown, [str(i) for i in range(len(paths))], [int(y) for _, y in samples], "path"
    return (*indexed_items(ds, name, root, split), "index")


class TarMember(NamedTuple):
    """A webdataset sample's image: its bytes at `offset` in the shard (size < 0: the sample has none)."""

    shard: str
    offset: int
    size: int
    name: str

    def make(self, open_file):
        from PIL import Image

        from ..images import rgb_of

        if self.size < 0:
            raise OSError(f"sample {self.name} of {self.shard} holds no image ({', '.join(WDS_IMAGE_EXTS)})")
        with open(self.shard, "rb") as f:
            f.seek(self.offset)
            data = f.read(self.size)
        with Image.open(io.BytesIO(data)) as img:
            return rgb_of(img)

    def cache_key(self, key_of):
        return f"{key_of(self.shard)}#{self.name}@{self.offset}"


def wds_members(root, split, where):
    """Every sample of a webdataset split in its shards' order, grouped as webdataset groups them (the name up to
    the first dot of its base name is the key; extensions lower-cased; `__*__` members skipped): (TarMember per
    sample, its `<split>/<shard>.tar:<key>`, its `cls` label as an int or None)."""
    import tarfile

    with open(os.path.join(root, split, "nshards.txt"), encoding="utf-8") as f:
        text = f.read().strip()
    if not text.isdigit():
        raise where.error(f"{root}/{split}/nshards.txt: {text!r} is not a number of shards")
    items, shown, labels = [], [], []
    for s in range(int(text)):
        shard = os.path.join(root, split, f"{s}.tar")
        try:
            samples = _samples(tarfile.open(shard, "r:"))
        except (OSError, tarfile.TarError) as e:
            raise where.error(f"{shard}: not a readable tar shard ({type(e).__name__}: {e}); {WDS_LAYOUT}") from None
        for key, members, cls in samples:
            img = next((members[e] for e in WDS_IMAGE_EXTS if e in members), None)
            items.append(TarMember(shard, img.offset_data if img else 0, img.size if img else -1, key))
            shown.append(f"{split}/{s}.tar:{key}")
            try:
                labels.append(int(cls) if cls is not None else None)
            except ValueError:
                raise where.error(f"{shard}: sample {key}: its .cls holds {cls!r}, not a class index") from None
    return items, shown, labels


def _samples(tar):
    """[(key, {extension: TarInfo}, the .cls member's text or None)] of one shard, in order."""
    out = []
    with tar:
        for info in tar:
            name = info.name
            if not info.isreg() or ("/" not in name and name.startswith("__") and name.endswith("__")):
                continue
            if re.match(r"__[^/]*__($|/)", name):
                continue
            m = re.match(r"^((?:.*/|)[^.]+)[.]([^/]*)$", name)
            if not m:
                continue
            key, ext = m.group(1), m.group(2).lower()
            if not out or out[-1][0] != key:
                out.append((key, {}, None))
            out[-1][1][ext] = info
            if ext == "cls":
                out[-1] = (key, out[-1][1], tar.extractfile(info).read().decode("utf-8").strip())
    return out


class IndexedImage(NamedTuple):
    """A dataset's image by index (a dataset of no files, e.g. CIFAR's arrays), made in the loader's workers;
    `key`: the dataset, the index and a hash of the pixels."""

    dataset: str
    index: int
    key: str

    def make(self, open_file):
        from ..images import rgb_of

        return rgb_of(_OPEN[self.dataset][self.index][0])

    def cache_key(self, key_of):
        return self.key


def indexed_items(ds, name, root, split):
    """(IndexedImage per item, shown None, split keys, labels) of a dataset of no files; each item read once here
    for its label and its pixels' hash (an item that cannot be read: made again, and reported, by the loader)."""
    ident = f"{name}|{root}|{split}"
    _OPEN[ident] = ds
    items, labels = [], []
    for i in range(len(ds)):
        try:
            img, y = ds[i]
            digest = hashlib.sha256(f"{img.mode}|{img.size}|".encode() + img.tobytes()).hexdigest()
        except Exception as e:  # (reported by the loader when it makes it)
            img, y, digest = None, None, f"unread:{type(e).__name__}"
        items.append(IndexedImage(ident, i, f"{ident}|{i}|{digest}"))
        labels.append(int(y) if y is not None else None)
    return items, [None] * len(items), [str(i) for i in range(len(items))], labels
