"""The published evaluation loops, written from LGIP_SPEC.md section 4 as plainly as the published
scripts run them: one record at a time, one model call per text list, Python lists of floats.

It is the tests' second opinion on data the fixture does not exercise (records without flips,
captions with one flip type, empty lists, a flip equal to its caption, unreadable images,
captions over a text batch): the project's reference protocol must give its numbers there too.
`tests/test_published_calls.py` first checks it against the published outputs and calls on the
fixture. CPU, fp32, the tiny fixture models only.
    >>> vlm = PublishedVLM(spec, text_batch=64)
    >>> multi(vlm, records, image_root)["invariance_error_mean"]
"""

import os
from collections import defaultdict

import torch
from PIL import Image

PRIORS = {"color": 0.25, "number": 0.55, "object": 1.0, "spatial": 0.80, "all": 0.60}
SIMPLE_MARKERS = ["a photo of", "an image of", "a picture of", "in this image", "in the picture", "this image shows"]


def _features(out):
    return out if isinstance(out, torch.Tensor) else out.pooler_output  # transformers 5: a ModelOutput


class PublishedVLM:
    """encode_image / encode_text as the published wrappers: open_clip's tokenizer (77 tokens),
    or the SigLIP processor with padding=True per batch of `text_batch` texts. `calls` lists the
    texts of every encode_text call, in order. A call repeated whole (the same texts in the same
    order, as records copied from one another make) is computed once and its result given again:
    the model is deterministic, so this changes no number, only the time; so is an images call."""

    def __init__(self, spec, text_batch=64):
        self.text_batch, self.calls, self.siglip = text_batch, [], spec["type"] == "siglip"
        self._done = {}  # (kind, inputs, batch) -> the embeddings that call gave
        if self.siglip:
            from transformers import AutoModel, AutoProcessor

            self.model, self.processor = (
                AutoModel.from_pretrained(spec["model_id"]),
                AutoProcessor.from_pretrained(spec["model_id"]),
            )
        else:
            import open_clip

            self.model, _, self.preprocess = open_clip.create_model_and_transforms(
                spec["model_name"], pretrained=spec.get("pretrained")
            )
            self.tokenizer = open_clip.get_tokenizer(spec["model_name"])
        self.model.eval()

    def encode_images(self, paths):
        key = ("images", tuple(paths), None)
        if key not in self._done:
            self._done[key] = self._encode_images(paths)
        return self._done[key]

    @torch.no_grad()
    def _encode_images(self, paths):
        imgs = [Image.open(p).convert("RGB") for p in paths]  # raises for a missing or broken file
        if self.siglip:
            feats = _features(self.model.get_image_features(**self.processor(images=imgs, return_tensors="pt")))
        else:
            feats = self.model.encode_image(torch.stack([self.preprocess(i) for i in imgs]))
        return feats / feats.norm(dim=-1, keepdim=True)

    def encode_image(self, path):
        return self.encode_images([path])[0]

    def encode_text(self, texts, batch=None):
        if not texts:
            return torch.empty(0, 0)
        self.calls.append(list(texts))
        key = ("texts", tuple(texts), batch or self.text_batch)
        if key not in self._done:
            self._done[key] = self._encode_text(texts, batch or self.text_batch)
        return self._done[key]

    @torch.no_grad()
    def _encode_text(self, texts, step):
        out = []
        for b in range(0, len(texts), step):
            chunk = texts[b : b + step]
            if self.siglip:
                inputs = self.processor(text=chunk, padding=True, truncation=True, return_tensors="pt")
                feats = _features(self.model.get_text_features(**inputs))
            else:
                feats = self.model.encode_text(self.tokenizer(chunk))
            out.append(feats / feats.norm(dim=-1, keepdim=True))
        return torch.cat(out)


def _mean(xs):
    return float(sum(xs) / len(xs)) if xs else None


def _scores(img, feats):
    return (feats @ img).tolist()


def _captions(vlm, records, root):
    """(record, image embedding, caption i, base similarity, caption embedding) per caption of the
    records the published loop counts: its image reads and it has a caption."""
    for rec in records:
        try:
            img = vlm.encode_image(os.path.join(root, rec["image_path"]))
        except Exception:
            continue
        orig = vlm.encode_text(rec["orig_captions"])
        for i, base_feat in enumerate(orig if orig.numel() else []):
            yield rec, img, i, float(base_feat @ img), base_feat


def _similarities(vlm, rec, field, i, img):
    texts = rec.get(field, {}).get(str(i), [])
    return _scores(img, vlm.encode_text(texts)) if texts else []


def multi(vlm, records, root, tag):
    inv, gaps, seen = [], [], set()
    for rec, img, i, base, _ in _captions(vlm, records, root):
        seen.add(id(rec))
        inv.extend(abs(base - s) for s in _similarities(vlm, rec, "same_caps", i, img))
        gaps.extend(base - s for s in _similarities(vlm, rec, "diff_caps", i, img))
    return {
        "model_tag": tag,
        "num_samples": len(seen),
        "num_invariance_pairs": len(inv),
        "num_sensitivity_pairs": len(gaps),
        "invariance_error_mean": _mean(inv),
        "sensitivity_gap_mean": _mean(gaps),
        "sensitivity_pos_rate": _mean([g > 0 for g in gaps]),
    }


def _gap_block(gaps):
    return {"gap_mean": _mean(gaps), "pos_rate": _mean([g > 0 for g in gaps]), "count": len(gaps)}


def by_fliptype(vlm, records, root, tag):
    inv, gaps, typed, seen = [], [], {t: [] for t in ("color", "number", "object")}, set()
    for rec, img, i, base, _ in _captions(vlm, records, root):
        seen.add(id(rec))
        inv.extend(abs(base - s) for s in _similarities(vlm, rec, "same_caps", i, img))
        for field, out in [("diff_caps", gaps)] + [(f"diff_caps_{t}", typed[t]) for t in typed]:
            out.extend(base - s for s in _similarities(vlm, rec, field, i, img))
    return {
        "model_tag": tag,
        "num_samples": len(seen),
        "invariance_error_mean": _mean(inv),
        "global_sensitivity": _gap_block(gaps),
        "by_flip_type": {t: _gap_block(g) for t, g in typed.items()},
    }


def _flip_type(field):
    return field.lower().strip().replace("flip_", "").replace("diff_caps_", "")


def _std(xs):
    return None if not xs else 0.0 if len(xs) == 1 else float(torch.std(torch.tensor(xs)))


# A gap below float32's noise is an equal text's (the edge case of a flip equal to its caption): the published
# loop encodes the caption and the flip in calls of different sizes, and on some machines (BLAS blocking by batch
# size) the same text's two vectors differ by ~1e-7, so the sign of that gap is the machine's noise. It is scored
# as on a machine where a text's vector does not depend on its batch: 0, not positive (ours encodes it once).
NOISE = 1e-6


def _positive(g):
    return g > NOISE


def _bin_block(items):
    gaps, weights = [g for g, _ in items], [w for _, w in items]
    wsum = sum(weights)
    return {
        "count": len(gaps),
        "gap_mean": _mean(gaps),
        "gap_std": _std(gaps),
        "pos_rate": _mean([_positive(g) for g in gaps]),
        "w_gap_mean": sum(g * w for g, w in items) / wsum if items else None,
        "w_pos_rate": sum(w for g, w in items if _positive(g)) / wsum if items else None,
    }


def enhanced(vlm, records, root, tag, image_batch=32):
    inv, inv_simple, inv_adv, gaps, weights, strengths, n_batches = [], [], [], [], [], [], 0
    per_type = defaultdict(list)  # type -> [(gap, weight, strength)], types in order of first appearance
    for start in range(0, len(records), image_batch):
        batch = records[start : start + image_batch]
        try:  # one unreadable image drops the whole batch
            imgs = vlm.encode_images([os.path.join(root, r["image_path"]) for r in batch])
        except Exception:
            continue
        for rec, img in zip(batch, imgs):
            orig = vlm.encode_text(rec["orig_captions"])
            if orig.numel() == 0:
                continue
            for i, base_feat in enumerate(orig):
                key, base = str(i), float(base_feat @ img)
                same = rec.get("same_caps", {}).get(key, [])
                simple = [p for p in same if any(m in p.lower() for m in SIMPLE_MARKERS)]
                advanced = [p for p in same if not any(m in p.lower() for m in SIMPLE_MARKERS)]
                for texts, out in ((simple, inv_simple), (advanced, inv_adv)):
                    if texts:
                        errs = [abs(base - s) for s in _scores(img, vlm.encode_text(texts))]
                        out.extend(errs)
                        inv.extend(errs)
                items = [(t, "all") for t in rec.get("diff_caps", {}).get(key, [])]
                for field, block in rec.items():
                    if field.startswith("diff_caps_") and isinstance(block, dict) and key in block:
                        items += [(t, _flip_type(field)) for t in block[key]]
                if not items:
                    continue
                feats = vlm.encode_text([t for t, _ in items])
                text_cos = (feats @ base_feat).tolist()
                for (_, ftype), s_img, c in zip(items, _scores(img, feats), text_cos):
                    s = min(1.0, max(0.0, 0.5 * PRIORS.get(ftype, PRIORS["all"]) + 0.5 * min(1.0, max(0.0, 1.0 - c))))
                    gaps.append(base - s_img)
                    weights.append(max(1e-4, s))
                    strengths.append(s)
                    per_type[ftype].append((base - s_img, max(1e-4, s), s))
        n_batches += 1
    q = torch.quantile(torch.tensor(strengths), torch.tensor([0.25, 0.75])).tolist() if strengths else [0.0, 1.0]
    stats = {}
    for ftype, rows in per_type.items():
        bins = {"weak": [], "medium": [], "strong": []}
        for g, w, s in rows:
            bins["weak" if s <= q[0] else "medium" if s <= q[1] else "strong"].append((g, w))
        stats[ftype] = {
            "overall": _bin_block([(g, w) for g, w, _ in rows]),
            **{b: _bin_block(v) for b, v in bins.items()},
        }
    both = list(zip(gaps, weights))
    return {
        "model_tag": tag,
        "num_samples": n_batches,
        "global_invariance_error_mean": _mean(inv),
        "paraphrase_simple_inv_error_mean": _mean(inv_simple),
        "paraphrase_advanced_inv_error_mean": _mean(inv_adv),
        "paraphrase_simple_count": len(inv_simple),
        "paraphrase_advanced_count": len(inv_adv),
        "global_sensitivity": {
            "count": len(gaps),
            "gap_mean": _mean(gaps),
            "gap_std": _std(gaps),
            "pos_rate": _mean([_positive(g) for g in gaps]),
        },
        "global_strength": {"count": len(strengths), "strength_mean": _mean(strengths), "q_low": q[0], "q_high": q[1]},
        "global_weighted_sensitivity": {
            "count": len(gaps),
            "w_gap_mean": _bin_block(both)["w_gap_mean"],
            "w_pos_rate": _bin_block(both)["w_pos_rate"],
        },
        "error_type_stats": stats,
    }


EVALUATIONS = {
    "run_lgip_multi.py": (multi, 64),
    "run_lgip_by_fliptype.py": (by_fliptype, 64),
    "rebuttal_enhanced_lgip_by_transformation.py": (enhanced, 512),
}


def evaluate(script, specs, records, root):
    """[metrics per model] and the text calls (the same for every model) of the published script."""
    fn, text_batch = EVALUATIONS[script]
    results = []
    for spec in specs:
        vlm = PublishedVLM(spec, text_batch)
        results.append(fn(vlm, [r for _, r in records], root, spec["name"]))
    return results, vlm.calls
