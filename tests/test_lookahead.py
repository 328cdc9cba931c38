"""The lookahead (lgip/lookahead.py): a later model's texts tokenized and images decoded while a
model runs, work a model has started left to it, close() and stuck or dying workers, pixels
decoded ahead never evicting, and a run with lookahead giving the same metrics."""

import multiprocessing
import os
import time

import torch

from lgip import lookahead
from lgip.images import ImageEncoding
from lgip.lookahead import Lookahead
from lgip.models import FAMILIES, load_model
from lgip.pixel_memory import PixelMemory
from lgip.texts import TextCalls
from lgip.memory import KEPT
from lgip.tokens import shared_token_table
from conftest import OPENCLIP_TINY, SIGLIP_TINY, TEXTS, image_paths


def _ahead_done(ahead):
    ahead._thread.join(120)
    assert not ahead._thread.is_alive()


def test_lookahead_tokenizes_and_decodes_for_a_later_model(enc, tmp_path):
    """While one model runs, a later model of another family gets its texts tokenized (the
    ids its own tokenizer gives) and its images decoded (the same embeddings as decoding them
    itself); a later model that tokenizes like the current one gets no job; close() ends it."""
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"not a jpeg")
    paths = image_paths() + [str(bad)]
    sig = load_model(SIGLIP_TINY, "corrected", "cpu")
    twin = dict(OPENCLIP_TINY, name="tiny_openclip_again")
    ahead = Lookahead([twin, SIGLIP_TINY], "corrected", num_workers=1, image_batch=5)  # several batches
    assert ahead.active
    ahead.start(enc, TextCalls(TEXTS + TEXTS[:2], [0, len(TEXTS)]), paths)
    _ahead_done(ahead)
    assert [(j["model"], j["kind"], j["state"]) for j in ahead.jobs] == [
        ("tiny_siglip", "tokens", "done"),
        ("tiny_siglip", "pixels", "done"),
    ]
    waited, report = ahead.settle(sig)
    assert waited >= 0 and [(j["kind"], j["items"]) for j in report] == [
        ("tokens", len(TEXTS)),
        ("pixels", len(paths) - 1),
    ]
    table = shared_token_table(sig.tokenizer_key)
    assert len(table) == len(TEXTS) and all(table.ids(t).tolist() == sig.tokenize([t])[0] for t in TEXTS)
    images = ImageEncoding(sig, paths, 3, num_workers=0)
    emb, failed = images.start().finish()
    assert (images.n_decoded, images.n_remembered) == (1, len(paths) - 1) and list(failed) == [len(paths) - 1]
    alone, _ = ImageEncoding(sig, paths, 3, num_workers=0, pixel_memory_gb=0).start().finish()
    assert torch.equal(emb[:-1], alone[:-1])
    ahead.close()


def test_lookahead_leaves_work_a_model_has_started_to_that_model(enc):
    """A model that starts before its job has begun does the work itself (the job is dropped,
    not run twice into one table); a later model that cannot be prepared is reported, and the
    other models' jobs still run; no workers, no lookahead."""
    sig = load_model(SIGLIP_TINY, "corrected", "cpu")
    broken = {"name": "broken_siglip", "type": "siglip", "model_id": "/nonexistent/siglip"}
    ahead = Lookahead([broken, SIGLIP_TINY], "corrected", num_workers=1)
    waited, report = ahead.settle(sig)  # before start: nothing to wait for
    assert report == []
    ahead.start(enc, TextCalls(TEXTS, [0]), image_paths())
    _ahead_done(ahead)
    states = [(j["model"], j["kind"], j["state"]) for j in ahead.jobs]
    assert states == [
        ("broken_siglip", "prepare", "failed"),
        ("tiny_siglip", "tokens", "dropped"),
        ("tiny_siglip", "pixels", "dropped"),
    ]
    assert "nonexistent" in ahead.jobs[0]["error"]
    assert (
        ahead.settle(type("E", (), {"tokenizer_key": None, "pixels": None, "name": "broken_siglip"})())[1][0]["state"]
        == "failed"
    )
    ahead.close()
    assert not Lookahead([SIGLIP_TINY], "corrected", num_workers=0).active


def test_lookahead_close_stops_a_running_job(enc):
    ahead = Lookahead([SIGLIP_TINY], "corrected", num_workers=1, chunk=8)
    texts = [f"{n} dogs on a red bus number {n}" for n in range(20000)]
    ahead.start(enc, TextCalls(texts, [0]), [])
    deadline = time.time() + 60
    while not ahead.jobs and time.time() < deadline:
        time.sleep(0.05)
    ahead.close()
    assert not ahead._thread.is_alive()
    job = ahead.jobs[0]
    assert job["state"] in ("stopped", "done") and bool(ahead._tables) == (job["state"] == "done")


def test_pixels_decoded_ahead_never_evict(enc):
    """evict=False (a Lookahead's pixels) keeps a batch only where it fits beside the others."""
    memory = PixelMemory(budget=2 * 3 * 4 * 4)
    u8 = torch.zeros((1, 3, 4, 4), dtype=torch.uint8)
    memory.add("a", ["x"], u8)
    memory.add("b", ["y"], u8, evict=False)
    memory.add("b", ["z"], u8, evict=False)  # no room left: not kept, "a" stays
    assert list(memory.geometries) == ["a", "b"] and set(memory.geometries["b"]["where"]) == {"y"}
    memory.add("c", ["w"], u8)  # an evicting add drops the least recently used ("a")
    assert list(memory.geometries) == ["b", "c"] and memory.bytes == 2 * u8.numel()


def test_a_run_with_lookahead_gives_the_same_metrics(tmp_path):
    """run_lgip_multi over open_clip then SigLIP, with and without LOOKAHEAD (1 worker): the
    same metrics; each model reports what was done ahead for it and how long it waited."""
    import json
    from conftest import REFERENCE, eval_settings, run_here

    src = open(os.path.join(REFERENCE, "fixture_with_perturb.jsonl")).read()
    got = {}
    for ahead in (True, False):
        folder = tmp_path / str(ahead)
        folder.mkdir()
        jsonl = folder / "fixture_with_perturb.jsonl"
        jsonl.write_text(src)
        run_here(
            "run_lgip_multi.py",
            **eval_settings(
                jsonl,
                "corrected",
                models=[OPENCLIP_TINY, SIGLIP_TINY],
                CACHE_DIR=None,
                LOOKAHEAD=ahead,
                BOOTSTRAP=0,
                NUM_WORKERS=1,
            ),
        )
        got[ahead] = json.load(open(folder / "fixture_with_perturb__LGIP_ALL.metrics.json"))
    keys = (
        "num_invariance_pairs",
        "num_sensitivity_pairs",
        "invariance_error_mean",
        "sensitivity_gap_mean",
        "sensitivity_pos_rate",
    )
    for a, b in zip(got[True], got[False]):
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}
        assert b["run"]["lookahead"] is None and "lookahead_wait" in a["run"]["seconds_by_phase"]
    assert got[True][0]["run"]["lookahead"] == []
    jobs = got[True][1]["run"]["lookahead"]
    assert [j["kind"] for j in jobs] == ["tokens", "pixels"] and {j["state"] for j in jobs} <= {"done", "dropped"}


def _prepare_with(monkeypatch, tokenize_hook):
    """SigLIP's preparer, its tokenize wrapped by tokenize_hook(texts) (runs in the workers)."""
    import dataclasses

    real = FAMILIES["siglip"].prepare

    def prepare(spec, protocol):
        prep = real(spec, protocol)
        inner = prep.tokenize
        prep.tokenize = lambda texts: (tokenize_hook(texts), inner(texts))[1]
        return prep

    monkeypatch.setitem(FAMILIES, "siglip", dataclasses.replace(FAMILIES["siglip"], prepare=prepare))


def test_a_dying_lookahead_worker_fails_its_job_only(enc, monkeypatch):
    """A worker killed mid-job (OOM killer, a crash in a tokenizer) fails that job, reported;
    the main process goes on, its own DataLoaders too, and the next job still runs."""
    import signal

    def die(texts):
        if any("poison" in t for t in texts):
            os.kill(os.getpid(), signal.SIGKILL)

    _prepare_with(monkeypatch, die)
    ahead = Lookahead([SIGLIP_TINY], "corrected", num_workers=1, chunk=2)
    ahead.start(enc, TextCalls(TEXTS + ["poison text"], [0]), image_paths())
    emb, failed = ImageEncoding(enc, image_paths(), 3, num_workers=1).start().finish()  # meanwhile
    _ahead_done(ahead)
    assert not failed and not torch.isnan(emb).any()
    tokens, pixels = ahead.jobs
    assert tokens["state"] == "failed" and "BrokenProcessPool" in tokens["error"] and not ahead._tables
    assert pixels["state"] == "done" and pixels["items"] == len(image_paths())
    assert not multiprocessing.active_children()


def test_a_stuck_lookahead_job_is_abandoned(enc, monkeypatch):
    """settle() stops waiting for a job that has done no batch for LOOKAHEAD_STALL_S (the model
    does the work itself); close() leaves no worker behind."""

    def stall(texts):
        if any("stall" in t for t in texts):
            time.sleep(60)

    _prepare_with(monkeypatch, stall)
    monkeypatch.setattr(lookahead, "LOOKAHEAD_STALL_S", 1.0)
    sig = load_model(SIGLIP_TINY, "corrected", "cpu")
    ahead = Lookahead([SIGLIP_TINY], "corrected", num_workers=1, chunk=2)
    ahead.start(enc, TextCalls(["stall here"] + TEXTS, [0]), [])
    deadline = time.time() + 60
    while not ahead.jobs and time.time() < deadline:
        time.sleep(0.05)
    waited, report = ahead.settle(sig)
    assert 0.5 < waited < 30 and report[0]["state"] == "abandoned"
    assert sig.tokenizer_key not in KEPT.token_tables  # nothing half-done is handed over
    t0 = time.time()
    ahead.close()
    assert time.time() - t0 < 10 and not ahead._thread.is_alive()
    time.sleep(0.5)
    assert not multiprocessing.active_children()
