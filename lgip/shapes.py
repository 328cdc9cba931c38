"""lgip.shapes: the shapes world, a place where a tiny model can learn (issue 51; LGIP_SPEC.md 14's demo). Each
image holds one to five glyphs of one colour on a slate ground; the colour, the count and the glyph are section
2's COLORS, NUMBER_WORDS and OBJECTS (each object word its own glyph: the "dog" is a disc, the "bus" a star), and
its five captions, in COCO's style, use those words, so that make_perturb_with_fliptypes.py flips them as it
flips COCO's. The images are synthetic (records marked `synthetic_image`): a figure made on them says how a
model learns this world, never how it sees photographs.

Three parts, by image: `lgip_shapes_pretrain.jsonl` (a tiny open_clip CLIP learns the world there with L_clip
alone: `start_model` writes its random-init start), and `lgip_shapes.jsonl` (fine-tuned on one part, probed on
the images held out: finetune_lgip.py's split). Everything is a function of the seed (one
`numpy.random.default_rng([seed, part, i])` per image).

    >>> paths = make_world("shapes", n_pretrain=1600, n_main=1200, seed=0)   # {"pretrain", "main", "images"}
    >>> spec = start_model("shapes/start_model", seed=0)                     # a MODELS spec (random init)
"""

import json
import os

from .method import COLORS, NUMBER_WORDS, OBJECTS

SIZE = 64  # pixels a side
GROUND = (70, 100, 112)  # slate: none of the eleven colours
RGB = {
    "red": (215, 35, 35),
    "blue": (35, 70, 225),
    "green": (35, 165, 60),
    "yellow": (240, 215, 35),
    "black": (15, 15, 15),
    "white": (245, 245, 245),
    "brown": (125, 75, 30),
    "gray": (150, 150, 150),
    "orange": (250, 135, 20),
    "pink": (250, 150, 205),
    "purple": (135, 40, 175),
}
# each object word its own glyph (a drawing in a box of side d at (x, y))
GLYPHS = {
    "dog": "disc",
    "cat": "square",
    "horse": "triangle",
    "car": "plus",
    "bus": "star",
    "train": "diamond",
    "person": "ring",
    "bird": "bar",
    "boat": "cross",
    "bicycle": "hexagon",
    "truck": "wedge",
}
PARTS = {"pretrain": 1, "main": 2}  # (the rng's second key: the parts never share an image)
OOD_PART = 3  # the rng's second key of the out-of-distribution images (LGIP_SPEC.md 16): no part shares one
# glyphs that no object word is (the world's own no-class glyphs: LGIP_SPEC.md 16's "ood" set draws them)
OOD_GLYPHS = ["arrow", "tee", "ell", "hourglass", "crescent"]
# the tiny model the world is learnt by: a CLIP of width 64, 2 layers, 64 px with 8 px patches, texts of 32 tokens
TINY_CFG = {
    "embed_dim": 64,
    "vision_cfg": {"image_size": SIZE, "layers": 2, "width": 64, "patch_size": 8, "head_width": 32},
    "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2},
}


def _polygon(draw, fill, points):
    draw.polygon(points, fill=fill)


def draw_glyph(draw, kind, x, y, d, fill):
    """One glyph of `kind` in the box (x, y, x + d, y + d)."""
    import math

    c, r, w = (x + d / 2, y + d / 2), d / 2, max(2, d // 4)
    if kind == "disc":
        draw.ellipse((x, y, x + d, y + d), fill=fill)
    elif kind == "square":
        draw.rectangle((x + 1, y + 1, x + d - 1, y + d - 1), fill=fill)
    elif kind == "triangle":
        _polygon(draw, fill, [(x, y + d), (x + d, y + d), (c[0], y)])
    elif kind == "wedge":
        _polygon(draw, fill, [(x, y), (x + d, y), (c[0], y + d)])
    elif kind == "diamond":
        _polygon(draw, fill, [(c[0], y), (x + d, c[1]), (c[0], y + d), (x, c[1])])
    elif kind == "plus":
        draw.rectangle((c[0] - w / 2, y, c[0] + w / 2, y + d), fill=fill)
        draw.rectangle((x, c[1] - w / 2, x + d, c[1] + w / 2), fill=fill)
    elif kind == "cross":
        draw.line((x, y, x + d, y + d), fill=fill, width=w)
        draw.line((x, y + d, x + d, y), fill=fill, width=w)
    elif kind == "ring":
        draw.ellipse((x, y, x + d, y + d), outline=fill, width=w)
    elif kind == "bar":
        draw.rectangle((x, c[1] - w / 2, x + d, c[1] + w / 2), fill=fill)
    elif kind == "star":
        pts = [
            (c[0] + (r if k % 2 == 0 else r * 0.45) * math.sin(math.pi * k / 5),
             c[1] - (r if k % 2 == 0 else r * 0.45) * math.cos(math.pi * k / 5))
            for k in range(10)
        ]  # fmt: skip
        _polygon(draw, fill, pts)
    elif kind == "hexagon":
        _polygon(
            draw, fill, [(c[0] + r * math.cos(math.pi * k / 3), c[1] + r * math.sin(math.pi * k / 3)) for k in range(6)]
        )
    elif kind in OOD_GLYPHS:
        _draw_ood_glyph(draw, kind, x, y, d, w, fill)
    else:
        raise ValueError(f"no glyph {kind!r}; one of {sorted(set(GLYPHS.values()) | set(OOD_GLYPHS))}")


def _draw_ood_glyph(draw, kind, x, y, d, w, fill):
    """The glyphs of no class (OOD_GLYPHS): an arrow, a T, an L, an hourglass, a crescent."""
    c = x + d / 2
    if kind == "arrow":
        _polygon(draw, fill, [(x, y + d / 2), (c, y), (c, y + d / 3), (x + d, y + d / 3), (x + d, y + 2 * d / 3),
                              (c, y + 2 * d / 3), (c, y + d)])  # fmt: skip
    elif kind == "tee":
        draw.rectangle((x, y, x + d, y + w), fill=fill)
        draw.rectangle((c - w / 2, y, c + w / 2, y + d), fill=fill)
    elif kind == "ell":
        draw.rectangle((x, y, x + w, y + d), fill=fill)
        draw.rectangle((x, y + d - w, x + d, y + d), fill=fill)
    elif kind == "hourglass":
        _polygon(draw, fill, [(x, y), (x + d, y), (x, y + d), (x + d, y + d)])
    else:  # crescent: a thick arc open on one side
        draw.arc((x, y, x + d, y + d), 60, 300, fill=fill, width=max(2, d // 3))


BACKGROUNDS = ["plain", "striped", "dotted", "checkered"]  # (words no flip list holds: a flip keeps them)
SIZES = {"small": (8, 11), "large": (12, 15)}  # glyph sides in pixels, [low, high)


def draw_ground(draw, kind, shade):
    """The slate ground's texture: plain, striped (a light line every 4 px), dotted, checkered (8 px)."""
    light = tuple(min(255, v + 28) for v in shade)
    if kind == "striped":
        for y in range(0, SIZE, 4):
            draw.line((0, y, SIZE, y), fill=light, width=1)
    elif kind == "dotted":
        for y in range(2, SIZE, 6):
            for x in range(2, SIZE, 6):
                draw.rectangle((x, y, x + 1, y + 1), fill=light)
    elif kind == "checkered":
        for y in range(0, SIZE, 8):
            for x in range((y // 8) % 2 * 8, SIZE, 16):
                draw.rectangle((x, y, x + 7, y + 7), fill=light)
    elif kind != "plain":
        raise ValueError(f"no background {kind!r}; one of {BACKGROUNDS}")


def draw_image(scene, rng):
    """The picture of a scene {color, number, object, size, background} (a PIL RGB image, SIZE a side): the
    glyphs in distinct cells of a 4 x 4 grid with a jitter, colours and ground shaded a little per image."""
    from PIL import Image, ImageDraw

    shade = lambda rgb, k: tuple(int(min(255, max(0, v + k))) for v in rgb)
    ground = shade(GROUND, rng.integers(-12, 13))
    img = Image.new("RGB", (SIZE, SIZE), ground)
    draw = ImageDraw.Draw(img)
    draw_ground(draw, scene["background"], ground)
    fill = shade(RGB[scene["color"]], rng.integers(-15, 16))
    cells = rng.choice(16, NUMBER_WORDS.index(scene["number"]) + 1, replace=False)
    low, high = SIZES[scene["size"]]
    for cell in cells:
        d = int(rng.integers(low, high))
        x = int(cell % 4) * 16 + int(rng.integers(0, 16 - d + 1))
        y = int(cell // 4) * 16 + int(rng.integers(0, 16 - d + 1))
        draw_glyph(draw, scene["glyph"] if "glyph" in scene else GLYPHS[scene["object"]], x, y, d, fill)
    return img


def captions(scene):
    """Five captions in COCO's style, each naming the colour, the count and the object with section 2's words
    (lower case where the flips' case-sensitive match must find them), most the size or the ground too."""
    n, c, o, size, bg = (scene[k] for k in ("number", "color", "object", "size", "background"))
    s, be = ("", "is") if n == "one" else ("s", "are")
    return [
        f"There {be} {n} {size} {c} {o} shape{s} on a {bg} background.",
        f"A picture with {n} {c} {o} shape{s} on a {bg} ground.",
        f"An image of {n} {size} {c} {o} icon{s}.",
        f"{n} {c} {o} symbol{s} drawn on a {bg} board",
        f"a flat drawing showing {n} {size} {c} {o} glyph{s}",
    ]


def scene_of(rng):
    """A scene's words, drawn in this order: colour, count, object, size, ground."""
    scene = {"color": COLORS[rng.integers(len(COLORS))], "number": NUMBER_WORDS[rng.integers(len(NUMBER_WORDS))]}
    scene.update(object=OBJECTS[rng.integers(len(OBJECTS))], size=list(SIZES)[rng.integers(len(SIZES))])
    scene.update(background=BACKGROUNDS[rng.integers(len(BACKGROUNDS))])
    return scene


def ood_scene(rng):
    """An out-of-distribution scene: scene_of's colour, count, size and ground around a glyph of no class
    (OOD_GLYPHS), drawn in this order: colour, count, glyph, size, ground."""
    scene = {"color": COLORS[rng.integers(len(COLORS))], "number": NUMBER_WORDS[rng.integers(len(NUMBER_WORDS))]}
    scene.update(glyph=OOD_GLYPHS[rng.integers(len(OOD_GLYPHS))], size=list(SIZES)[rng.integers(len(SIZES))])
    scene.update(background=BACKGROUNDS[rng.integers(len(BACKGROUNDS))])
    return scene


def make_ood(folder, count=200, seed=0):
    """The world's out-of-distribution images (LGIP_SPEC.md 16's "shapes" set of role "ood"): image i drawn from
    default_rng([seed, OOD_PART, i]) (ood_scene, then draw_image), saved as `images/ood_<i>.png` in `folder`.
    A file that already holds the same bytes is left as it is (its mtime, so the embedding cache's key, unchanged).
    Returns the paths relative to `folder`, in order."""
    import io

    import numpy as np

    from .outputs import atomic_open

    os.makedirs(os.path.join(folder, "images"), exist_ok=True)
    rels = []
    for i in range(count):
        rng = np.random.default_rng([seed, OOD_PART, i])
        buf = io.BytesIO()
        draw_image(ood_scene(rng), rng).save(buf, format="PNG")
        rel, data = f"images/ood_{i}.png", buf.getvalue()
        path = os.path.join(folder, rel)
        try:
            with open(path, "rb") as f:
                same = f.read() == data
        except OSError:
            same = False
        if not same:
            with atomic_open(path, "wb", output=False) as f:
                f.write(data)
        rels.append(rel)
    return rels


def make_world(folder, n_pretrain=1600, n_main=1200, seed=0):
    """The world's images (`images/<part>_<i>.png`) and base JSONL files in `folder`: {"pretrain": path,
    "main": path, "images": n}. Image i of a part draws its colour, count and object, then its picture, from
    default_rng([seed, PARTS[part], i]); existing files of the same name are rewritten with the same bytes."""
    import numpy as np

    from .outputs import OutputSet

    os.makedirs(os.path.join(folder, "images"), exist_ok=True)
    paths = {
        part: os.path.join(folder, f"lgip_shapes{'_pretrain' if part == 'pretrain' else ''}.jsonl") for part in PARTS
    }
    with OutputSet() as files:
        for part, n in (("pretrain", n_pretrain), ("main", n_main)):
            with files.open(paths[part]) as out:
                for i in range(n):
                    rng = np.random.default_rng([seed, PARTS[part], i])
                    scene = scene_of(rng)
                    rel = f"images/{part}_{i:05d}.png"
                    draw_image(scene, rng).save(os.path.join(folder, rel))
                    rec = {"image_id": PARTS[part] * 100000 + i, "image_path": rel}
                    rec.update(orig_captions=captions(scene), synthetic_image=True, shapes=scene)
                    if part == "pretrain":  # (L_clip alone: no perturbation is drawn)
                        rec.update(same_caps={}, diff_caps={})
                    out.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return dict(paths, images=n_pretrain + n_main)


def start_model(folder, seed=0):
    """The random-init tiny CLIP (TINY_CFG, torch.manual_seed(seed)) saved as an open_clip local-dir; its MODELS
    spec. The shapes world's pretraining starts from it."""
    import open_clip
    import torch

    from .models.trainable import openclip_save

    torch.manual_seed(seed)
    model = open_clip.CLIP(**TINY_CFG)
    openclip_save(model, folder, TINY_CFG, False)
    return start_spec(folder, "shapes_random_init")


def start_spec(folder, name):
    """The MODELS spec of a shapes model saved in `folder` (its card says it is the shapes world's)."""
    card = {
        "architecture": "tiny CLIP (width 64, 2 layers, 64 px, patch 8)",
        "family": "shapes",
        "training_data": "the shapes world (synthetic)",
    }
    path = "local-dir:" + os.path.abspath(folder)
    return {"name": name, "type": "openclip", "model_name": path, "pretrained": None, "card": card}
