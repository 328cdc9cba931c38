"""finetune_lgip.py and lgip/finetune.py (LGIP_SPEC.md 14): the split, the step's records and draws, each loss
term and the schedule restated by hand; a tiny open_clip model fine-tuned end to end (its log, its model that
loads back as a MODELS spec and is probed on the held-out file beside the start), a killed run resumed to what
an unbroken run gives, and bad input stopped before training."""

import hashlib
import json
import math
import os
import shutil

import numpy as np
import pytest
import torch

from conftest import FIXTURES, OPENCLIP_TINY, REFERENCE, ROOT, SIGLIP_TINY, eval_settings, run_here
from lgip import finetune
from lgip.errors import ConfigError, InputError


def test_the_split_by_image_by_hand():
    records = [(k + 1, {"image_path": p}) for k, p in enumerate(["a.jpg", "b.jpg", "a.jpg", "c.jpg", "d.jpg", "e.jpg"])]
    images = ["a.jpg", "b.jpg", "c.jpg", "d.jpg", "e.jpg"]
    order = sorted(images, key=lambda p: (hashlib.sha256(f"7:{p}".encode()).hexdigest(), p))
    held = finetune.split_records(records, 0.4, 7)  # h = floor(0.4 * 5 + 0.5) = 2
    assert {p for p, h in held.items() if h} == set(order[:2])
    assert not any(finetune.split_records(records, 0.05, 7).values())  # floor(0.25 + 0.5) = 0


def test_a_steps_records_and_draws_by_hand():
    assert finetune.step_positions(5, 10, 4, 3) == np.random.default_rng([3, 1, 2]).permutation(10)[4:8].tolist()
    rec = {
        "orig_captions": ["c0", "c1", "c2"],
        "same_caps": {"1": ["p10", "p11"], "2": []},
        "diff_caps": {"1": ["f10", "f11", "f12"], "2": ["f20"]},
    }
    g = np.random.default_rng([9, 2, 4, 6])
    i = [1, 2][g.integers(2)]
    para = rec["same_caps"][str(i)][g.integers(2)] if i == 1 else None
    flips = rec["diff_caps"][str(i)]
    chosen = [flips[k] for k in g.choice(len(flips), min(2, len(flips)), replace=False)]
    assert finetune.draw(rec, 9, 4, 6, 2) == (f"c{i}", para, chosen, i)
    assert finetune.draw({"orig_captions": ["x"], "diff_caps": {}}, 0, 0, 0, 3) == ("x", None, [], 0)
    assert finetune.mix_offset(10, 5) == 1 + __import__("random").Random(5).randrange(9)


def test_the_loss_terms_by_hand():
    g = torch.Generator().manual_seed(0)
    unit = lambda *shape: torch.nn.functional.normalize(torch.randn(*shape, generator=g), dim=-1)
    v, t, fl, mixed, p = unit(3, 4), unit(3, 4), unit(2, 4), unit(3, 4), unit(2, 4)
    s = torch.tensor(10.0)
    got = finetune.clip_style_losses(v, t, s, flips=fl, mixed=mixed)
    vt = (s * v @ t.T).double()
    lse = torch.logsumexp
    clip = (
        0.5 * (sum(lse(vt[q], 0) - vt[q, q] for q in range(3)) + sum(lse(vt[:, q], 0) - vt[q, q] for q in range(3))) / 3
    )
    sc = sum(lse(torch.cat([vt[q], (s * v[q] @ fl.T).double()]), 0) - lse(vt[q], 0) for q in range(3)) / 3
    tm = (s * t @ mixed.T).double()
    vc = sum(lse(torch.cat([vt[:, q], tm[q]]), 0) - lse(vt[:, q], 0) for q in range(3)) / 3
    assert float(got["clip"]) == pytest.approx(float(clip), abs=1e-5) and float(got["sc"]) == pytest.approx(
        float(sc), abs=1e-5
    )
    assert float(got["vc"]) == pytest.approx(float(vc), abs=1e-5) and float(got["sc"]) >= 0
    assert float(finetune.clip_style_losses(v, t, s, flips=fl[:0])["sc"]) == 0.0  # (no flip: 0)
    beta = torch.tensor(-2.0)
    sig = finetune.siglip_losses(v, t, s, beta, flips=fl, mixed=mixed)
    ls = torch.nn.functional.logsigmoid
    z = lambda a, b: 1.0 if a == b else -1.0
    want = -sum(ls(torch.tensor(z(a, b)) * (s * v[a] @ t[b] + beta)) for a in range(3) for b in range(3)) / 3
    assert float(sig["clip"]) == pytest.approx(float(want), abs=1e-5)
    want = -sum(ls(-(s * v[a] @ fl[f] + beta)) for a in range(3) for f in range(2)) / 3
    assert float(sig["sc"]) == pytest.approx(float(want), abs=1e-5)
    want = -sum(ls(-(s * t[b] @ mixed[a] + beta)) for a in range(3) for b in range(3)) / 3
    assert float(sig["vc"]) == pytest.approx(float(want), abs=1e-5)
    inv = finetune.invariance_loss(v, t, p, [0, 2])
    want = (abs(v[0] @ p[0] - v[0] @ t[0]) + abs(v[2] @ p[1] - v[2] @ t[2])) / 2
    assert float(inv) == pytest.approx(float(want), abs=1e-6) and float(finetune.invariance_loss(v, t, p[:0], [])) == 0


def test_the_schedule_and_the_weight_decay_groups():
    assert finetune.lr_at(0, 1.0, 4, 10) == 0.25 and finetune.lr_at(3, 1.0, 4, 10) == 1.0
    assert finetune.lr_at(4, 1.0, 4, 10) == 1.0 and finetune.lr_at(7, 1.0, 4, 10) == pytest.approx(0.5)
    model = torch.nn.Module()
    model.proj, model.ln_final, model.logit_scale = (
        torch.nn.Linear(3, 3),
        torch.nn.LayerNorm(3),
        torch.nn.Parameter(torch.ones([])),
    )
    plain, decayed = finetune.param_groups(model, 0.1)
    assert [p.shape for p in decayed["params"]] == [torch.Size([3, 3])] and decayed["weight_decay"] == 0.1
    assert len(plain["params"]) == 4 and plain["weight_decay"] == 0.0


def _settings(tmp_path, **extra):
    src = tmp_path / "fixture_with_fliptypes.jsonl"
    if not src.exists():
        shutil.copy(REFERENCE + "/fixture_with_fliptypes.jsonl", src)
        for name in os.listdir(os.path.join(FIXTURES, "images")):  # (the records' images, beside the copy)
            os.makedirs(tmp_path / "images", exist_ok=True)
            shutil.copy(os.path.join(FIXTURES, "images", name), tmp_path / "images" / name)
    base = dict(JSONL_PATH=str(src), MODEL=OPENCLIP_TINY, STEPS=4, BATCH_SIZE=4, WARMUP=1, SAVE_EVERY=2, LR=1e-3)
    return {**base, "HELDOUT_FRACTION": 0.25, "DEVICE": "cpu", "W_VC": 0.5, **extra}


def test_a_tiny_model_fine_tuned_loads_back_and_is_probed_on_held_out_images(tmp_path):
    saved, out, _ = run_here("finetune_lgip.py", **_settings(tmp_path))
    folder = tmp_path / "fixture_with_fliptypes__ft_lgip"
    log = [json.loads(x) for x in open(folder / "train_log.jsonl", encoding="utf-8")]
    assert [x["step"] for x in log] == [0, 1, 2, 3] and all(
        x["loss_vc"] is not None and x["num_flips"] > 0 for x in log
    )
    assert log[0]["lr"] == 1e-3 and log[-1]["lr"] == pytest.approx(1e-3 * (1 + math.cos(math.pi * 2 / 3)) / 2)
    assert saved == json.load(open(folder / "model_spec.json")) and saved["model_name"].startswith("local-dir:")
    meta = json.load(open(folder / "finetune.meta.json"))
    assert meta["status"] == "done" and meta["steps_done"] == 4 and meta["split"]["records"]["heldout"] == 3
    held = tmp_path / "fixture_with_fliptypes__ft_heldout.jsonl"
    rows, _, _ = run_here(
        "run_lgip_by_fliptype.py", **eval_settings(held, "corrected", [OPENCLIP_TINY, saved], BOOTSTRAP=0)
    )
    assert [r["model_tag"] for r in rows] == ["tiny_openclip", "lgip"] and rows[0]["num_samples"] == 3
    assert rows[0]["invariance_error_mean"] != rows[1]["invariance_error_mean"]  # (the weights moved)


def test_a_killed_run_resumes_to_what_an_unbroken_run_gives(tmp_path, monkeypatch):
    whole, _, _ = run_here("finetune_lgip.py", **_settings(tmp_path, RUN_NAME="whole"))
    from lgip.trainer import Trainer

    real = Trainer.step

    def dies_at_3(self, s, *a, **k):
        if s == 3:
            raise KeyboardInterrupt
        return real(self, s, *a, **k)

    monkeypatch.setattr(Trainer, "step", dies_at_3)
    with pytest.raises(BaseException):
        run_here("finetune_lgip.py", **_settings(tmp_path, RUN_NAME="cut"))
    killed = json.load(open(tmp_path / "fixture_with_fliptypes__ft_cut" / "finetune.meta.json"))
    assert killed["status"] == "running" and killed["saved"] is None
    monkeypatch.setattr(Trainer, "step", real)
    cut, _, _ = run_here("finetune_lgip.py", **_settings(tmp_path, RUN_NAME="cut"))
    a = torch.load(whole["model_name"][len("local-dir:") :] + "/open_clip_pytorch_model.bin")
    b = torch.load(cut["model_name"][len("local-dir:") :] + "/open_clip_pytorch_model.bin")
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    logs = [
        [
            {k: v for k, v in json.loads(x).items() if k != "seconds"}
            for x in open(tmp_path / f"fixture_with_fliptypes__ft_{n}" / "train_log.jsonl")
        ]
        for n in ("whole", "cut")
    ]
    assert logs[0] == logs[1]
    # a done run keeps no resume.pt (unless KEEP_RESUME), and its model is never overwritten by other settings
    assert not (tmp_path / "fixture_with_fliptypes__ft_cut" / "resume.pt").exists()
    with pytest.raises(ConfigError, match="holds a done run of other settings .it differs in LR"):
        run_here("finetune_lgip.py", **_settings(tmp_path, RUN_NAME="cut", LR=2e-3, STEPS=4))
    run_here("finetune_lgip.py", **_settings(tmp_path, RUN_NAME="kept", KEEP_RESUME=True))
    assert (tmp_path / "fixture_with_fliptypes__ft_kept" / "resume.pt").is_file()


def test_steps_zero_saves_the_start_and_bad_input_stops_before_training(tmp_path):
    saved, _, _ = run_here("finetune_lgip.py", **_settings(tmp_path, STEPS=0, RUN_NAME="zero"))
    start = torch.load(os.path.join(FIXTURES, "models", "openclip-tiny", "open_clip_pytorch_model.bin"))
    got = torch.load(saved["model_name"][len("local-dir:") :] + "/open_clip_pytorch_model.bin")
    assert all(torch.equal(start[k].float(), got[k]) for k in start)
    for extra, error, words in (
        ({"MODEL": {"name": "g", "type": "generative", "model_id": "x"}}, ConfigError, "no embeddings to contrast"),
        ({"MODEL": {"name": "t", "type": "itm", "model_id": "x"}}, ConfigError, "no embeddings to contrast"),
        ({"MODEL": {"name": "p", "type": "python", "loader": "x:y"}}, ConfigError, "cannot be built for training"),
        ({"BATCH_SIZE": 64}, InputError, "fewer than BATCH_SIZE 64"),
        ({"HELDOUT_FRACTION": 0.99}, InputError, "leaves the train side"),
        ({"W_SC": -1}, ConfigError, "W_SC must be a number >= 0"),
    ):
        with pytest.raises(error, match=words):
            run_here("finetune_lgip.py", **_settings(tmp_path, RUN_NAME="bad", **extra))
    assert not (tmp_path / "fixture_with_fliptypes__ft_bad").exists()


def test_a_done_run_exits_at_once(tmp_path):
    run_here("finetune_lgip.py", **_settings(tmp_path, STEPS=1, RUN_NAME="once"))
    again, out, _ = run_here("finetune_lgip.py", **_settings(tmp_path, STEPS=1, RUN_NAME="once"))
    assert "once: already done (1 steps)" in out and again["name"] == "once"


def test_run_all_fine_tunes_each_arm_and_probes_them_with_the_start_on_held_out_images(tmp_path):
    import re

    from conftest import run_script
    from lgip.demo import demo_inputs

    folder = tmp_path / "demo"
    demo_inputs(folder)
    ft = {"model": OPENCLIP_TINY, "STEPS": 2, "BATCH_SIZE": 4, "WARMUP": 1, "SAVE_EVERY": 1, "LR": 1e-3}
    args = [f"--DEMO_JSONL={folder / 'lgip_demo.jsonl'}", "--DATA=demo", "--MODELS=demo", "--DEVICE=cpu"]
    ft["wise"] = []  # (no WiSE-FT point: test_wise.py's and the shapes demo's)
    out = run_script("run_all.py", *args, f"--FINETUNE={ft!r}", "--NUM_WORKERS=0").stdout
    assert len(re.findall(r"^\[\d+/17\] finetune\b", out, re.M)) == 2
    rows = json.load(open(folder / "lgip_demo_with_fliptypes__ft_heldout__LGIP_fliptypes.metrics.json"))
    assert [r["model_tag"] for r in rows] == ["tiny_openclip", "tiny_openclip__ft_plain", "tiny_openclip__ft_lgip"]
    plain = [
        json.loads(x) for x in open(folder / "lgip_demo_with_fliptypes__ft_tiny_openclip__ft_plain" / "train_log.jsonl")
    ]
    assert [x["loss_sc"] for x in plain] == [None, None] and all(x["num_flips"] > 0 for x in plain)  # (drawn, not used)
    assert (folder / "lgip_demo_with_fliptypes__ft_heldout__LGIP_report.md").is_file()
    comparisons = json.load(open(folder / "lgip_demo_with_fliptypes__ft_heldout__LGIP_comparisons.metrics.json"))
    assert {(c["a"], c["b"]) for c in comparisons} >= {("tiny_openclip", "tiny_openclip__ft_lgip")}
    again = run_script("run_all.py", *args, f"--FINETUNE={ft!r}", "--NUM_WORKERS=0").stdout
    assert "run_all: ran 0 of 17 steps (17 up to date)" in again


def _tiny_transformers_clip(folder):
    """A tiny transformers CLIPModel (random init) with the fixture SigLIP's tokenizer and a CLIP image processor."""
    from transformers import AutoTokenizer, CLIPConfig, CLIPImageProcessor, CLIPModel

    torch.manual_seed(0)
    text = dict(vocab_size=400, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    text.update(max_position_embeddings=64, eos_token_id=1, pad_token_id=0, bos_token_id=None)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=64)
    vision.update(patch_size=16)
    CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=32)).save_pretrained(folder)
    AutoTokenizer.from_pretrained(SIGLIP_TINY["model_id"]).save_pretrained(folder)
    CLIPImageProcessor(size={"shortest_edge": 64}, crop_size={"height": 64, "width": 64}).save_pretrained(folder)
    return {"name": "tiny_hf_clip", "type": "transformers", "model_id": str(folder)}


@pytest.mark.parametrize("kind", ["openclip", "transformers", "siglip"])
def test_a_fine_tuned_model_saved_gives_the_embeddings_it_had_in_memory(tmp_path, kind):
    """open_clip (a local-dir), CLIP-style transformers (CLIPModel: no logit bias) and SigLIP (a logit bias,
    save_pretrained): the run's model in memory and the one saved, loaded back as an evaluation loads a MODELS
    spec of the start's type, give the same image and text embeddings."""
    from lgip import trainer as trainer_mod
    from lgip.models.registry import load_model

    start = {"openclip": OPENCLIP_TINY, "siglip": SIGLIP_TINY}.get(kind) or _tiny_transformers_clip(tmp_path / "hf")
    kept = {}
    real = trainer_mod.Trainer.save

    def keep(self, folder, name):
        kept["model"] = self.towers
        return real(self, folder, name)

    import unittest.mock

    with unittest.mock.patch.object(trainer_mod.Trainer, "save", keep):
        saved, _, _ = run_here("finetune_lgip.py", **_settings(tmp_path, MODEL=start, RUN_NAME=kind, W_VC=0.5))
    where = saved["model_name"][len("local-dir:") :] if kind == "openclip" else saved["model_id"]
    assert saved["type"] == start["type"] and os.path.isdir(where)
    log = [json.loads(x) for x in open(tmp_path / f"fixture_with_fliptypes__ft_{kind}" / "train_log.jsonl")]
    assert len(log) == 4 and all(x["loss_sc"] is not None and x["loss_inv"] is not None for x in log)
    assert (log[0]["logit_bias"] is None) == (kind != "siglip")
    from PIL import Image

    img = Image.open(os.path.join(FIXTURES, "images", sorted(os.listdir(os.path.join(FIXTURES, "images")))[0]))
    texts = ["a red bus on the street", "two cats"]
    towers = kept["model"]
    towers.model.eval()
    with torch.no_grad():
        mine_v = torch.nn.functional.normalize(towers.encode_images([img.convert("RGB")]).float(), dim=-1)
        mine_t = torch.nn.functional.normalize(towers.encode_texts(texts).float(), dim=-1)
    enc = load_model(saved, "corrected", "cpu")
    from lgip.images import open_rgb

    path = os.path.join(FIXTURES, "images", sorted(os.listdir(os.path.join(FIXTURES, "images")))[0])
    pixels = enc.image_transform(open_rgb(path))
    v = enc.encode_images(pixels.unsqueeze(0) if not isinstance(pixels, dict) else pixels)
    assert torch.allclose(v.float().cpu(), mine_v, atol=1e-5)
    from conftest import encode_texts

    got = encode_texts(enc, texts)
    assert torch.allclose(torch.tensor(np.stack([got[x] for x in texts])), mine_t, atol=1e-5)


def test_two_ranks_with_half_the_batch_each_equal_one_process(tmp_path):
    """torchrun, 2 ranks x B/2 on gloo (CPU) = 1 process x B: the logged losses to 1e-5, the weights to 1e-4."""
    import subprocess
    import sys

    from conftest import ROOT

    one, _, _ = run_here("finetune_lgip.py", **_settings(tmp_path, RUN_NAME="one", W_VC=0.5, STEPS=2))
    args = {**_settings(tmp_path, RUN_NAME="two", W_VC=0.5, STEPS=2)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29517"]
    cmd += [os.path.join(ROOT, "finetune_lgip.py")] + _cli(args)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, LGIP_GLOO="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    logs = [
        [json.loads(x) for x in open(tmp_path / f"fixture_with_fliptypes__ft_{n}" / "train_log.jsonl")]
        for n in ("one", "two")
    ]
    assert len(logs[0]) == len(logs[1]) == 2
    for a, b in zip(*logs):
        for k in ("loss", "loss_clip", "loss_sc", "loss_inv", "loss_vc"):
            assert a[k] == pytest.approx(b[k], abs=1e-5), k
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)  # (a norm of ~100: its float rounding)
        assert (a["num_flips"], a["num_paraphrases"]) == (b["num_flips"], b["num_paraphrases"])
    meta = json.load(open(tmp_path / "fixture_with_fliptypes__ft_two" / "finetune.meta.json"))
    assert meta["world_size"] == 2 and meta["status"] == "done"
    x = torch.load(one["model_name"][len("local-dir:") :] + "/open_clip_pytorch_model.bin")
    y = torch.load(str(tmp_path / "fixture_with_fliptypes__ft_two" / "model" / "open_clip_pytorch_model.bin"))
    assert all(torch.allclose(x[k], y[k], atol=1e-4) for k in x)


def test_run_all_plans_a_siglip_start_and_its_arms_as_specs_of_its_own_type(tmp_path):
    """FINETUNE with a transformers start: the probe's MODELS name each arm's saved folder as the start's type."""
    from conftest import run_script
    from lgip.demo import demo_inputs

    folder = tmp_path / "demo"
    demo_inputs(folder)
    ft = {"model": SIGLIP_TINY, "STEPS": 2, "BATCH_SIZE": 4}
    args = [f"--DEMO_JSONL={folder / 'lgip_demo.jsonl'}", "--DATA=demo", "--MODELS=demo", "--DRY_RUN=True"]
    out = run_script("run_all.py", *args, f"--FINETUNE={ft!r}", "--STEPS=finetune,finetune_by_fliptype").stdout
    arm = os.path.join(str(folder), "lgip_demo_with_fliptypes__ft_tiny_siglip__ft_lgip", "model")
    assert f"'name': 'tiny_siglip__ft_lgip', 'type': 'siglip', 'model_id': '{arm}'" in out


def _cli(settings):
    return [f"--{k}={v!r}" if isinstance(v, (dict, str)) else f"--{k}={v}" for k, v in settings.items()]


def test_a_weight_of_zero_encodes_nothing_for_its_term(tmp_path, monkeypatch):
    from lgip.trainer import Trainer

    seen = []
    texts, images = Trainer._texts, Trainer._images
    monkeypatch.setattr(Trainer, "_texts", lambda self, x: seen.append(("texts", len(x))) or texts(self, x))
    monkeypatch.setattr(Trainer, "_images", lambda self, x: seen.append(("images", len(x))) or images(self, x))
    run_here("finetune_lgip.py", **_settings(tmp_path, RUN_NAME="zero_w", STEPS=1, W_SC=0, W_INV=0, W_VC=0))
    assert seen == [("images", 4), ("texts", 4)]  # (the batch's images and captions: no flip, paraphrase, mix)
    seen.clear()
    run_here("finetune_lgip.py", **_settings(tmp_path, RUN_NAME="all_w", STEPS=1))
    assert [k for k, _ in seen] == ["images", "texts", "texts", "texts", "images"]  # (+ paraphrases, flips, mixed)


def test_kill_9_then_resume_equals_an_unbroken_run(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from conftest import ROOT

    args = dict(STEPS=60, SAVE_EVERY=5, W_VC=0)
    whole, _, _ = run_here("finetune_lgip.py", **_settings(tmp_path, RUN_NAME="whole9", **args))
    cmd = [sys.executable, os.path.join(ROOT, "finetune_lgip.py")] + _cli(_settings(tmp_path, RUN_NAME="cut9", **args))
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    folder = tmp_path / "fixture_with_fliptypes__ft_cut9"
    while proc.poll() is None:
        if (folder / "train_log.jsonl").exists() and len(open(folder / "train_log.jsonl").readlines()) >= 8:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    proc.wait()
    assert json.load(open(folder / "finetune.meta.json"))["status"] == "running"  # (killed mid-run)
    cut, _, _ = run_here("finetune_lgip.py", **_settings(tmp_path, RUN_NAME="cut9", **args))
    a = torch.load(whole["model_name"][len("local-dir:") :] + "/open_clip_pytorch_model.bin")
    b = torch.load(cut["model_name"][len("local-dir:") :] + "/open_clip_pytorch_model.bin")
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    drop = lambda x: {k: v for k, v in json.loads(x).items() if k != "seconds"}
    logs = [
        [drop(x) for x in open(tmp_path / f"fixture_with_fliptypes__ft_{n}" / "train_log.jsonl")]
        for n in ("whole9", "cut9")
    ]
    assert logs[0] == logs[1] and len(logs[0]) == 60


def test_negclips_loss_is_l_clip_plus_half_l_sc(tmp_path):
    """NegCLIP (image to captions and hard captions, text to images) = L_clip + 0.5 L_sc: with W_SC = 0.5 alone,
    every step's logged loss is its L_clip plus half its L_sc."""
    run_here("finetune_lgip.py", **_settings(tmp_path, RUN_NAME="negclip", W_SC=0.5, W_INV=0, W_VC=0))
    log = [json.loads(x) for x in open(tmp_path / "fixture_with_fliptypes__ft_negclip" / "train_log.jsonl")]
    assert len(log) == 4 and all(x["loss_inv"] is None and x["loss_vc"] is None for x in log)
    for x in log:
        assert x["loss"] == pytest.approx(x["loss_clip"] + 0.5 * x["loss_sc"], abs=1e-6) and x["loss_sc"] > 0


@pytest.mark.parametrize("start", ["openclip", "siglip"])
def test_a_training_loop_of_ones_own_gets_finetune_lgips_loss_from_probe_loss(start):
    """docs/finetune.md's loop of one's own (draw, the towers, probe_loss) computes the loss finetune_lgip.py's
    step computes on the same batch, CLIP's form and SigLIP's, to float rounding, and it backpropagates."""
    import torch.nn.functional as F

    from lgip.alterations import alter
    from lgip.finetune import draw, mix_offset, probe_loss, step_positions
    from lgip.images import open_rgb
    from lgip.records import load_records
    from lgip.trainer import Trainer

    jsonl = REFERENCE + "/fixture_with_fliptypes.jsonl"
    records = [rec for _, rec in load_records(jsonl)]
    paths = [os.path.join(FIXTURES, rec["image_path"]) for rec in records]
    cfg = {"BATCH_SIZE": 4, "SEED": 3, "N_FLIPS": 2, "W_SC": 1.0, "W_INV": 2.0, "W_VC": 0.5}
    trainer = Trainer(OPENCLIP_TINY if start == "openclip" else SIGLIP_TINY, "cpu", "fp32")
    n, k = len(records), mix_offset(len(records), cfg["SEED"])
    settings = finetune.TrainSettings(**{name.lower(): value for name, value in cfg.items()})
    want = trainer.step(0, records, paths, settings, k)
    # the loop of one's own: the batch's draws, its images and texts through the model's towers, probe_loss
    model, towers = trainer.model, trainer.towers
    pos = step_positions(0, n, cfg["BATCH_SIZE"], cfg["SEED"])
    draws = [draw(records[r], cfg["SEED"], 0, r, cfg["N_FLIPS"]) for r in pos]  # (caption, paraphrase, flips, i)
    images = [open_rgb(paths[r]) for r in pos]
    embed_images = lambda x: F.normalize(towers.encode_images(x).float(), dim=-1)
    embed_texts = lambda x: F.normalize(towers.encode_texts(x).float(), dim=-1)
    q = [j for j, d in enumerate(draws) if d[1] is not None]
    mixed = [alter(images[j], "mix", open_rgb(paths[(r + k) % n]), cfg["SEED"], r) for j, r in enumerate(pos)]
    loss, terms = probe_loss(
        embed_images(images),
        embed_texts([d[0] for d in draws]),
        model.logit_scale.exp(),
        getattr(model, "logit_bias", None),
        flips=embed_texts([f for d in draws for f in d[2]]),
        paraphrases=embed_texts([draws[j][1] for j in q]),
        with_paraphrase=q,
        mixed=embed_images(mixed),
        w_sc=cfg["W_SC"],
        w_inv=cfg["W_INV"],
        w_vc=cfg["W_VC"],
    )
    assert q and all(terms[t] is not None for t in ("clip", "sc", "inv", "vc"))
    for key in ("clip", "sc", "inv", "vc"):
        assert terms[key].item() == pytest.approx(want[key].item(), rel=1e-6, abs=1e-7), key
    assert loss.item() == pytest.approx(want["loss"].item(), rel=1e-6)
    assert loss.item() == pytest.approx((terms["clip"] + terms["sc"] + 2 * terms["inv"] + 0.5 * terms["vc"]).item())
    loss.backward()
    assert model.logit_scale.grad is not None and torch.isfinite(model.logit_scale.grad).all()
    _, none = probe_loss(embed_images(images), embed_texts([d[0] for d in draws]), model.logit_scale.exp(), w_sc=0)
    assert none["sc"] is None and none["inv"] is None and none["vc"] is None  # (a term without its inputs: None)


def test_the_front_door_takes_any_models_form_and_stops_one_that_cannot_be_had_before_any_work(tmp_path):
    """Issue 64: MODEL by name ("demo", a published model's), as any MODELS entry; a start that cannot be had (a
    local path that is not there) stops finetune_lgip.py with exit status 2 and one line before any work, nothing
    left behind, and run_all's FINETUNE before its first step, its dry run too; --help says what it trains and
    lists no internal as a setting."""
    from conftest import run_script

    settings = _settings(tmp_path, STEPS=1, RUN_NAME="named")
    settings.pop("MODEL")
    args = [f"--{k}={v}" for k, v in settings.items()]
    proc = run_script("finetune_lgip.py", *args, "--MODEL=demo")
    assert "named: 1 steps" in proc.stdout
    spec = json.load(open(tmp_path / "fixture_with_fliptypes__ft_named" / "finetune.meta.json"))["start"]
    assert spec["name"] == "demo_tiny_random"
    missing = {"name": "gone", "type": "openclip", "model_name": f"local-dir:{tmp_path / 'not_there'}"}
    before = sorted(os.listdir(tmp_path))
    bad = run_script("finetune_lgip.py", *args, f"--MODEL={missing!r}", "--RUN_NAME=gone", check=False)
    assert bad.returncode == 2 and "model 'gone': its model_name" in bad.stderr and "Traceback" not in bad.stderr
    assert sorted(os.listdir(tmp_path)) == before  # (no split file, no run folder)
    helped = run_script("finetune_lgip.py", "--help").stdout
    assert "SAFE_NAME" not in helped and "torchrun" in helped and "transformers" in helped
    assert "--KEEP_RESUME=False" in helped and "causal_lm {" in helped  # (the types, from their records)
    demo = tmp_path / "demo"
    demo.mkdir()
    shutil.copy(os.path.join(ROOT, "demo", "lgip_demo.jsonl"), demo / "lgip_demo.jsonl")
    for dry in ("False", "True"):
        ran = run_script(
            "run_all.py",
            "--DATA=demo",
            f"--DEMO_JSONL={demo / 'lgip_demo.jsonl'}",
            "--MODELS=demo",
            f"--FINETUNE={ {'model': missing}!r}",
            f"--DRY_RUN={dry}",
            check=False,
        )
        assert ran.returncode == 2 and "model 'gone': its model_name" in ran.stderr, (dry, ran.stderr)
        assert "[1/" not in ran.stdout or dry == "True"
    assert sorted(os.listdir(demo)) == ["lgip_demo.jsonl"]
