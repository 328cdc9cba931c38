"""Embedding tables on the model's device (lgip/device.py): fp16 storage below fp32 scoring as
float32, a table without room on its device kept on the host, and on a GPU the tables and cosines
staying there with the CPU's metrics."""

import os

import numpy as np
import pytest
import torch

from lgip.device import _Rows, cosines
from lgip.evaluation import ModelRun
from lgip.images import embed_images
from lgip.models import load_model
from lgip.records import load_records
from lgip.texts import TextBank
from conftest import FIXTURES, OPENCLIP_TINY, TEXTS, image_paths


def test_reduced_precision_tables_hold_fp16_and_score_as_float32(tmp_path):
    """A model below fp32 keeps its embeddings as fp16 values (storage_dtype) on its device; the
    similarities are float32 products of them: the same as from a float32 copy of the table."""
    enc = load_model(OPENCLIP_TINY, "corrected", "cpu", "bf16")
    assert enc.storage_dtype == torch.float16
    img, _ = embed_images(enc, image_paths(), 4, 0)
    bank = TextBank(enc)
    slots = bank.add_call(TEXTS)
    txt, rows = bank.encode(batch_size=2)
    assert img.dtype == txt.dtype == torch.float16
    ia, ib = [0, 1, 2, 3, 4], rows[slots]
    assert np.array_equal(cosines(img, txt, ia, ib), cosines(img.float(), txt.float(), ia, ib))


def test_a_table_without_room_on_its_device_stays_on_the_host(monkeypatch, capsys):
    real = torch.full

    def no_room(size, fill, dtype=None, device=None):
        if device is not None and torch.device(device).type != "cpu":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return real(size, fill, dtype=dtype, device=device)

    monkeypatch.setattr(torch, "full", no_room)
    rows = _Rows(3, 0.0, "meta", torch.float16)
    rows.put([2, 0], torch.ones(2, 4))
    assert rows.tensor().device.type == "cpu" and rows.tensor()[:, 0].tolist() == [1.0, 0.0, 1.0]
    assert "kept on the host" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_embeddings_stay_on_the_gpu_and_score_as_on_the_cpu(tmp_path):
    """On CUDA the embedding tables and the similarities stay on the device: the metrics equal
    the CPU run's (fp32, to float rounding), and a cached re-run gives the same numbers."""
    import shutil
    import run_lgip_multi
    from conftest import REFERENCE, SIGLIP_TINY

    jsonl = tmp_path / "fixture_with_perturb.jsonl"
    shutil.copy(os.path.join(REFERENCE, "fixture_with_perturb.jsonl"), jsonl)
    records = load_records(str(jsonl), ("same_caps", "diff_caps"))
    run_lgip_multi.JSONL_PATH = str(jsonl)
    out = {}
    for device, cache in (("cpu", None), ("cuda", str(tmp_path / "cache")), ("cuda", str(tmp_path / "cache"))):
        for spec in (OPENCLIP_TINY, SIGLIP_TINY):
            config = {
                "JSONL_PATH": str(jsonl),
                "IMAGE_ROOT": FIXTURES,
                "PROTOCOL": "corrected",
                "DEVICE": device,
                "DTYPE": "fp32",
                "IMAGE_BATCH_SIZE": 4,
                "TEXT_BATCH_SIZE": 16,
                "NUM_WORKERS": 0,
                "CACHE_DIR": cache,
            }
            run = ModelRun(spec, records, config)
            m = run_lgip_multi.evaluate(run)
            assert run.scored.image_embeddings.device.type == device
            out.setdefault(spec["name"], []).append(m)
    for cpu, gpu, cached in out.values():
        for key in ("invariance_error_mean", "sensitivity_gap_mean"):
            assert gpu[key] == pytest.approx(cpu[key], abs=1e-5)
            assert cached[key] == gpu[key]
