"""Images (lgip/images.py, lgip/models/pixels.py, lgip/pixel_memory.py): decoded in workers and encoded
beside the texts with the same embeddings as alone, a failing loader reaching the caller, close();
the preprocessing split between workers and device, bit for bit the model's own transform; pixels
remembered for the next model of a run within their budget; unreadable images skipped, counted
and listed; every image mode opened as RGB."""

import json
import multiprocessing
import os
import shutil
import time

import pytest
import torch

from lgip.models import prefix_packs
from lgip.images import ImageEncoding, embed_images, open_rgb
from lgip.models import load_model
from lgip.pixel_memory import pixel_memory, resolve_pixel_memory
from lgip.models.pixels import check_pixel_split, pixel_split_openclip
from lgip.errors import ModelError
from lgip.records import iter_records
from lgip.texts import TextBank
from conftest import FIXTURES, OPENCLIP_TINY, REFERENCE, SIGLIP_TINY, TEXTS, eval_settings, image_paths, run_here


def test_images_beside_texts_equal_images_alone(enc):
    alone, failed_alone = embed_images(enc, image_paths(), 2, 0)
    bank = TextBank(enc)
    slots = bank.add_call(TEXTS)
    job = ImageEncoding(enc, image_paths(), 2, num_workers=2)  # worker processes + hand-over thread
    txt, rows = bank.encode(batch_size=1, beside=job)  # 5 text batches, the images polled between them
    beside, failed = job.finish()
    assert failed == failed_alone == {}
    torch.testing.assert_close(beside, alone, atol=1e-6, rtol=0)
    bank2 = TextBank(enc)
    slots2 = bank2.add_call(TEXTS)
    txt2, rows2 = bank2.encode(batch_size=64)
    torch.testing.assert_close(txt[rows[slots]], txt2[rows2[slots2]], atol=1e-6, rtol=0)


def test_a_failing_loader_reaches_the_caller(enc, monkeypatch):
    """An error inside the decoding pipeline (here: batches that cannot be stacked) is raised to
    the caller by finish(), never lost in the hand-over thread."""
    sizes = iter(range(8, 100))
    odd = type(
        "E",
        (),
        {
            "image_transform": staticmethod(lambda img: torch.zeros(3, next(sizes), 8)),
            "name": "odd",
            "device": "cpu",
            "pixels": None,
            "storage_dtype": torch.float32,
        },
    )()
    job = ImageEncoding(odd, image_paths(), 4, num_workers=0)
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        job.start().finish()


def test_close_stops_the_hand_over_and_the_workers(enc):
    """A caller that fails mid-run closes the job: no thread or worker process is left waiting."""
    job = ImageEncoding(enc, image_paths(), 1, num_workers=2).start()
    job._queue.get()  # one batch taken, the rest left undecoded or queued
    job.close()
    assert not job._thread.is_alive()
    for _ in range(50):  # the loader's iterator is gone with the thread: its workers exit
        if not multiprocessing.active_children():
            break
        time.sleep(0.1)
    assert not multiprocessing.active_children()


# --- pixels: geometry in the workers, arithmetic on the device, shared between models ---------


@pytest.mark.parametrize("spec", [OPENCLIP_TINY, SIGLIP_TINY], ids=["openclip", "siglip"])
def test_pixel_split_is_bit_identical_to_the_cpu_transform(spec):
    """uint8 geometry + device arithmetic == the model's own CPU transform, bit for bit, on every
    fixture image (and on a grayscale and an RGBA one, through open_rgb)."""
    from PIL import Image

    enc = load_model(spec, "corrected", "cpu")
    assert enc.pixels is not None and enc.info["pixels_on_device"]
    imgs = [open_rgb(p) for p in image_paths()]
    imgs += [imgs[0].convert("L").convert("RGB"), Image.new("RGBA", (40, 90), (10, 250, 3, 7)).convert("RGB")]
    for img in imgs:
        u8 = enc.pixels.geometry(img)
        assert u8.dtype == torch.uint8 and u8.shape[0] == 3
        got = enc.pixels.to_input(u8[None], "cpu", torch.float32)[0]
        assert torch.equal(got, enc.image_transform(img))


def test_a_pixel_split_that_differs_is_refused(enc):
    """check_pixel_split keeps the CPU transform when the device arithmetic would differ."""
    split = pixel_split_openclip(enc.image_transform)
    assert check_pixel_split(enc, split) is split
    split.std = [s + 1e-7 for s in split.std]
    assert check_pixel_split(enc, split) is None
    divisor = pixel_split_openclip(enc.image_transform)
    divisor.rescale = ("div32", 254.99)
    assert check_pixel_split(enc, divisor) is None
    # Why no reciprocal: float32 x * float32(1/255) differs from x / 255 for 126 of the 256 values.
    x = torch.arange(256, dtype=torch.float32)
    assert (x * torch.tensor(1 / 255, dtype=torch.float32) != x / torch.tensor(255.0)).sum() == 126
    assert pixel_split_openclip(lambda img: img) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("spec", [OPENCLIP_TINY, SIGLIP_TINY], ids=["openclip", "siglip"])
def test_pixel_split_is_bit_identical_on_the_gpu(spec):
    """On CUDA the device arithmetic must still equal the CPU transform bit for bit (no reciprocal
    division, no fused ops): the load-time check accepts the split, and real images agree."""
    enc = load_model(spec, "corrected", "cuda", "fp32")
    assert enc.pixels is not None
    for path in image_paths():
        img = open_rgb(path)
        got = enc.pixels.to_input(enc.pixels.geometry(img)[None], "cuda", torch.float32)[0].cpu()
        assert torch.equal(got, enc.image_transform(img))


def test_pixels_are_decoded_once_per_geometry(enc, tmp_path):
    """A second model with the same geometry encodes the first one's remembered pixels: only
    the unreadable file is tried again (its error may have been passing) and reported alike;
    the same embeddings; another geometry decodes again; PIXEL_MEMORY_GB=0 turns it off."""
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"not a jpeg")
    paths = image_paths() + [str(bad)]
    first = ImageEncoding(enc, paths, 3, num_workers=2)
    emb1, failed1 = first.start().finish()
    assert (first.n_decoded, first.n_remembered) == (len(paths), 0) and list(failed1) == [len(paths) - 1]
    again = ImageEncoding(enc, paths, 3, num_workers=2)
    emb2, failed2 = again.start().finish()
    assert (again.n_decoded, again.n_remembered, again.n_cached) == (1, len(paths) - 1, 0)
    assert failed2 == failed1
    assert torch.equal(emb1[:-1], emb2[:-1]) and torch.isnan(emb2[-1]).all()
    off = ImageEncoding(enc, paths, 3, num_workers=0, pixel_memory_gb=0)
    emb3, _ = off.start().finish()
    assert off.n_decoded == len(paths) and torch.equal(emb1[:-1], emb3[:-1])
    sig = load_model(SIGLIP_TINY, "corrected", "cpu")
    assert sig.pixels.key != enc.pixels.key
    other = ImageEncoding(sig, paths, 3, num_workers=0)
    other.start().finish()
    assert other.n_decoded == len(paths)
    after = ImageEncoding(enc, paths, 3, num_workers=0)  # both geometries fit: ours is still there
    after.start().finish()
    assert (after.n_decoded, after.n_remembered) == (1, len(paths) - 1)
    pixel_memory(0)  # a smaller budget evicts at once
    assert pixel_memory(0).bytes == 0 and not pixel_memory(0).geometries


def test_pixel_memory_keeps_to_its_budget(enc):
    """Past PIXEL_MEMORY_GB the rest is decoded again by the next model, never dropped; a
    geometry being decoded evicts the least recently used other one."""
    paths = image_paths()
    per_image = 3 * 64 * 64  # the tiny model's 64 px input
    budget_gb = 4.5 * per_image / 2**30  # room for 4 images: one batch of 3, not the next
    ImageEncoding(enc, paths, 3, num_workers=0, pixel_memory_gb=budget_gb).start().finish()
    again = ImageEncoding(enc, paths, 3, num_workers=0, pixel_memory_gb=budget_gb)
    emb, failed = again.start().finish()
    assert (again.n_remembered, again.n_decoded) == (3, len(paths) - 3) and not failed
    torch.testing.assert_close(emb, embed_images(enc, paths, 3, 0)[0], atol=0, rtol=0)
    # Another geometry needing the room evicts ours (least recently used), not its own.
    sig = load_model(SIGLIP_TINY, "corrected", "cpu")
    ImageEncoding(sig, paths, 3, num_workers=0, pixel_memory_gb=budget_gb).start().finish()
    memory = pixel_memory(int(budget_gb * 2**30))
    assert list(memory.geometries) == [sig.pixels.key] and memory.bytes == 3 * per_image
    with pytest.raises(ModelError, match="PIXEL_MEMORY_GB"):
        resolve_pixel_memory(-1)


def test_a_remembered_batch_holds_each_images_own_pixels_whatever_its_chunk():
    """PixelMemory.batch gathers images from the chunks they were kept in, in the order asked, into one
    uint8 batch (numpy's copy per image: no torch op split over threads), the bytes each was added with;
    a kept batch is a copy, not a view of the decoder's (pinned) buffer."""
    from lgip.pixel_memory import PixelMemory

    memory = PixelMemory(2**20)
    gen = torch.Generator().manual_seed(0)
    chunks = [torch.randint(0, 256, (n, 3, 4, 5), dtype=torch.uint8, generator=gen) for n in (3, 2, 4)]
    start = 0
    for chunk in chunks:
        memory.add("g", [f"k{start + i}" for i in range(len(chunk))], chunk)
        start += len(chunk)
    chunks[0].zero_()  # (the decoder reuses its buffer: the memory kept its own copy)
    every = torch.cat([torch.randint(0, 256, (0, 3, 4, 5), dtype=torch.uint8)] + [c for c in chunks])
    g = memory.geometries["g"]
    order = ["k8", "k0", "k4", "k3", "k2", "k7"]
    got = PixelMemory.batch(g, order)
    assert got.dtype == torch.uint8 and got.shape == (6, 3, 4, 5)
    kept = torch.cat(g["chunks"])
    assert torch.equal(got, kept[[8, 0, 4, 3, 2, 7]])
    assert torch.equal(kept[3:], every[3:]) and not torch.equal(kept[:3], every[:3])


def test_two_models_of_one_run_share_pixels(tmp_path):
    """run_evaluation with the same model twice: the second decodes no image, same metrics."""
    import json
    from conftest import REFERENCE

    src = os.path.join(REFERENCE, "fixture_with_perturb.jsonl")
    jsonl = tmp_path / "fixture_with_perturb.jsonl"
    jsonl.write_text(open(src).read())
    twin = dict(OPENCLIP_TINY, name="tiny_openclip_again")
    run_here(
        "run_lgip_multi.py", **eval_settings(jsonl, models=[OPENCLIP_TINY, twin], image_root=FIXTURES, CACHE_DIR=None)
    )
    a, b = (
        json.load(open(tmp_path / f"fixture_with_perturb__LGIP_{m['name']}.metrics.json"))
        for m in (OPENCLIP_TINY, twin)
    )
    assert a["run"]["image_sources"]["decoded"] > 0 and a["run"]["image_sources"]["from_pixel_memory"] == 0
    assert b["run"]["image_sources"] == {
        "decoded": 0,
        "from_pixel_memory": a["run"]["image_sources"]["decoded"],
        "from_cache": 0,
    }
    for key in ("invariance_error_mean", "sensitivity_gap_mean", "sensitivity_pos_rate"):
        assert a[key] == b[key] is not None
    # open_clip texts share their prefixes' positions: fewer computed than held, both reported
    positions = a["run"]["text_positions"]
    assert 0 < positions["computed"] < positions["tokens"] and a["run"]["model"]["text_prefix_sharing"]
    assert positions["pack_nodes"] == prefix_packs.PACK_NODES


def test_auto_pixel_memory_is_shared_by_torchrun_processes(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    one = resolve_pixel_memory("auto")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert 0 < resolve_pixel_memory("auto") <= one // 4 + 1
    assert one <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
    assert resolve_pixel_memory(0) == 0 and resolve_pixel_memory(1.5) == int(1.5 * 2**30)


def make_bad_images(folder):
    """One image per case, referenced by the 12 fixture records in this order."""
    from PIL import Image

    src = os.path.join(FIXTURES, "images", "000000000001.jpg")
    rgb = Image.open(src).convert("RGB")
    os.makedirs(folder / "images")
    cases = {}

    def path(k):
        return folder / "images" / f"{k:012d}.jpg"

    cases[1] = "ok"
    shutil.copy(src, path(1))
    cases[2] = "missing"
    cases[3] = "empty"
    path(3).write_bytes(b"")
    data = open(src, "rb").read()
    cases[4] = "truncated"
    path(4).write_bytes(data[: len(data) // 2])
    cases[5] = "not an image"
    path(5).write_text("this is not a jpeg")
    cases[6] = "grayscale"
    rgb.convert("L").save(path(6), "JPEG")
    cases[7] = "cmyk"
    rgb.convert("CMYK").save(path(7), "JPEG")
    cases[8] = "palette+transparency"
    p = rgb.convert("P")
    p.info["transparency"] = 0
    p.save(path(8), "PNG")
    cases[9] = "rgba"
    rgb.convert("RGBA").save(path(9), "PNG")
    for k in (10, 11, 12):
        shutil.copy(os.path.join(FIXTURES, "images", f"{k:012d}.jpg"), path(k))
    return cases


def test_bad_images_are_skipped_counted_and_listed(tmp_path):
    make_bad_images(tmp_path)
    src = tmp_path / "in.jsonl"
    shutil.copy(os.path.join(REFERENCE, "fixture_with_perturb.jsonl"), src)
    _, stdout, stderr = run_here(
        "run_lgip_multi.py", **eval_settings(src, "corrected", [OPENCLIP_TINY], image_root=tmp_path)
    )
    m = json.load(open(tmp_path / "in__LGIP_tiny_openclip.metrics.json"))
    assert m["num_samples"] == 8 and m["run"]["num_failed_images"] == 4
    good = [rec for _, rec in iter_records(str(src)) if rec["image_id"] not in (2, 3, 4, 5)]
    assert m["num_invariance_pairs"] == sum(len(v) for rec in good for v in rec["same_caps"].values())
    assert m["num_sensitivity_pairs"] == sum(len(v) for rec in good for v in rec["diff_caps"].values())
    failed = {os.path.basename(f["path"]): f["error"] for f in m["run"]["failed_images"]}
    assert set(failed) == {f"{k:012d}.jpg" for k in (2, 3, 4, 5)}
    assert "empty" in failed["000000000003.jpg"] and "truncated" in failed["000000000004.jpg"]
    assert "skipping unreadable image" in stderr and "4 unreadable images" in stdout


@pytest.mark.parametrize("mode", ["L", "CMYK", "P", "RGBA", "LA", "I;16"])
def test_open_rgb_converts_every_mode(tmp_path, mode):
    from PIL import Image

    img = Image.new("RGB", (8, 8), (200, 30, 40)).convert(mode)
    path = tmp_path / ("x.png" if mode not in ("CMYK",) else "x.jpg")
    if mode == "P":
        img.info["transparency"] = 0
    img.save(path)
    assert open_rgb(path).mode == "RGB"
