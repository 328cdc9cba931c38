"""The field's checkpoints loaded right and flagged where they saw the probe's images (issue 65).

QuickGELU (LGIP_SPEC.md 12): a tiny architecture registered with its `-quickgelu` twin gives different embeddings
with each activation, the spec's `quick_gelu` picks each (as the twin does), and the warning for a weights file
that does not say comes exactly when it should. The named fine-tunes (lgip.models.finetunes): never published,
each resolvable by name, each loading offline from a local file of its architecture (the real ViT-B-32 once,
every entry with its architecture shrunk), their cards cited. The overlap flag: an arm of finetune_lgip.py
counted from its split files, a COCO-trained entry flagged unknown on a COCO input, both on the page in Chromium.
"""

import json
import os
import re
import shutil

import numpy as np
import pytest
import torch

from conftest import FIXTURES, OPENCLIP_TINY, TEXTS, encode_texts, run_here
from lgip.errors import ModelError
from lgip.models import load_model
from lgip.models.cards import model_card
from lgip.models.finetunes import FINETUNES, card_lines
from lgip.models.registry import NAMED_MODELS, PUBLISHED_MODELS, expand_models

TINY_CFG = json.load(open(os.path.join(FIXTURES, "models", "openclip-tiny", "open_clip_config.json")))["model_cfg"]
# the twin's own width: the fixture model's config (OPENCLIP_TINY, a local-dir without quick_gelu) must match no
# architecture with a twin, or every later test of the process loading it would be warned
TWIN_CFG = dict(TINY_CFG, embed_dim=24)
WARNING = "a state dict does not record its activation"


def random_state(name, seed=0):
    """A random state dict of open_clip architecture `name`: its shapes (the model built on the meta device, no
    initialisation run), each tensor N(0, 0.02^2), in fp16 (half the file)."""
    import open_clip

    with torch.device("meta"):
        shapes = open_clip.create_model(name, device="meta").state_dict()
    g = torch.Generator().manual_seed(seed)
    return {k: (torch.randn(v.shape, generator=g) * 0.02).half() for k, v in shapes.items()}


def training_checkpoint(state, path, numpy1=True):
    """`state` as a training run saves it (open_clip's training loop, DDP): {"epoch", "state_dict" with "module."
    prefixes, numpy scalars}; numpy1: in torch's older format, the numpy scalar named as numpy 1 pickled it."""
    ckpt = {"epoch": 5, "name": "run", "state_dict": {"module." + k: v for k, v in state.items()}}
    ckpt.update(step=np.int64(1000), lr=np.float64(5e-6))
    torch.save(ckpt, path, _use_new_zipfile_serialization=not numpy1)
    if numpy1:
        data = open(path, "rb").read().replace(b"numpy._core.multiarray\nscalar", b"numpy.core.multiarray\nscalar")
        with open(path, "wb") as f:
            f.write(data)
    return str(path)


def hub_snapshot(cache, repo, files):
    """A Hugging Face cache (HF_HUB_CACHE `cache`) holding `files` {name: local file} of `repo`, as a download
    leaves it (each file a link into the snapshot)."""
    sha = "0" * 40
    root = os.path.join(cache, f"models--{repo.replace('/', '--')}")
    snapshot = os.path.join(root, "snapshots", sha)
    os.makedirs(snapshot, exist_ok=True)
    os.makedirs(os.path.join(root, "refs"), exist_ok=True)
    with open(os.path.join(root, "refs", "main"), "w") as f:
        f.write(sha)
    for name, src in files.items():
        if not os.path.exists(os.path.join(snapshot, name)):
            os.symlink(os.path.abspath(src), os.path.join(snapshot, name))


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """The Hub unreachable, the Hugging Face cache a fresh folder (returned): what a machine without network has."""
    import huggingface_hub.constants as constants

    from lgip.models import hub

    cache = tmp_path / "hf"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub._HUB["reachable"] = (False, "offline for the test")
    return str(cache)


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    """A tiny architecture `lgip-twin` registered in open_clip with its twin `lgip-twin-quickgelu`, and a random
    checkpoint file of it (a name that does not start with "openai")."""
    import open_clip

    folder = tmp_path_factory.mktemp("twin")
    for name, cfg in (("lgip-twin", TWIN_CFG), ("lgip-twin-quickgelu", dict(TWIN_CFG, quick_gelu=True))):
        (folder / f"{name}.json").write_text(json.dumps(cfg))
        open_clip.add_model_config(str(folder / f"{name}.json"))  # (named after its file)
    path = folder / "finetuned.pt"
    torch.manual_seed(1)  # (open_clip's own initialisation: activations large enough for GELU and QuickGELU to part)
    torch.save(open_clip.create_model("lgip-twin").state_dict(), path)
    return str(path)


def file_spec(path, **extra):
    return {"name": "ft", "type": "openclip", "model_name": "lgip-twin", "pretrained": path, **extra}


def test_the_two_activations_differ_and_the_field_picks_each(twin, capsys):
    quick = load_model(file_spec(twin, quick_gelu=True))
    gelu = load_model(file_spec(twin, quick_gelu=False))
    assert quick.info["quick_gelu"] is True and gelu.info["quick_gelu"] is False
    assert quick.info["quick_gelu_from"] == gelu.info["quick_gelu_from"] == "spec"
    a, b = encode_texts(quick, TEXTS), encode_texts(gelu, TEXTS)
    assert max(np.abs(a[t] - b[t]).max() for t in TEXTS) > 1e-3  # (the activation changes every embedding)
    # true builds what the QuickGELU twin builds from the same file; false what the architecture itself builds
    twin_enc = load_model({"name": "t", "type": "openclip", "model_name": "lgip-twin-quickgelu", "pretrained": twin})
    c = encode_texts(twin_enc, TEXTS)
    assert all(np.allclose(a[t], c[t], atol=1e-6) for t in TEXTS)
    # recorded in the card (where the spec says it) and in the run block
    assert model_card(file_spec(twin, quick_gelu=True), quick)["quick_gelu"] is True
    assert model_card(file_spec(twin, quick_gelu=False), gelu)["quick_gelu"] is False
    assert WARNING not in capsys.readouterr().err  # (said: never warned)
    with pytest.raises(ModelError, match="quick_gelu must be true"):
        load_model(file_spec(twin, quick_gelu="yes"))


def test_the_warning_comes_exactly_when_a_file_does_not_say(twin, tmp_path, capsys):
    from lgip.models import key_encoder
    from lgip.models.checkpoints import unknown_activation
    from lgip.models.trainable import openclip_save

    plain = load_model(file_spec(twin))  # a file, no quick_gelu: warned once, however often it loads
    load_model(file_spec(twin))
    key_encoder(file_spec(twin))
    err = capsys.readouterr().err
    assert err.count(WARNING) == 1 and "'ft'" in err and "lgip-twin-quickgelu" in err and '"quick_gelu": true' in err
    assert plain.info["quick_gelu"] is False and plain.info["quick_gelu_from"] == "unconfirmed"
    assert "quick_gelu" not in model_card(file_spec(twin), plain)  # (not said: the card as before)
    load_model(file_spec(twin, name="other"))  # another spec: its own warning
    assert capsys.readouterr().err.count(WARNING) == 1
    load_model(file_spec(twin, quick_gelu=True))  # said: no warning
    # a tag, and lgip's own saved model (its config always says), are never warned
    assert unknown_activation({"type": "openclip", "model_name": "ViT-B-32", "pretrained": "openai"}) is None
    openclip_save(plain.model, str(tmp_path / "saved"), TWIN_CFG, False)
    saved = json.load(open(tmp_path / "saved" / "open_clip_config.json"))
    assert saved["model_cfg"]["quick_gelu"] is False
    enc = load_model({"name": "saved", "type": "openclip", "model_name": f"local-dir:{tmp_path / 'saved'}"})
    assert "quick_gelu_from" not in enc.info
    # a local-dir of such an architecture whose config does not say is warned
    os.remove(tmp_path / "saved" / "open_clip_config.json")
    (tmp_path / "saved" / "open_clip_config.json").write_text(json.dumps({"model_cfg": TWIN_CFG}))
    load_model({"name": "bare", "type": "openclip", "model_name": f"local-dir:{tmp_path / 'saved'}"})
    assert capsys.readouterr().err.count(WARNING) == 1
    load_model(OPENCLIP_TINY)  # (a local-dir matching no architecture with a twin: nothing to say)
    assert WARNING not in capsys.readouterr().err


def test_the_cache_identity_covers_quick_gelu(twin, tmp_path):
    from lgip.cache import ModelCache
    from lgip.models import key_encoder

    dirs = {
        said: ModelCache(
            str(tmp_path),
            key_encoder(file_spec(twin, **({} if said is None else {"quick_gelu": said}))),
            file_spec(twin, **({} if said is None else {"quick_gelu": said})),
        ).dir
        for said in (None, True, False)
    }
    assert len(set(dirs.values())) == 3


def test_the_fine_tunes_are_named_models_never_published():
    assert len(PUBLISHED_MODELS) == 9 and not set(FINETUNES) & {m["name"] for m in PUBLISHED_MODELS}
    for name, entry in FINETUNES.items():
        assert NAMED_MODELS[name] is entry.spec
        card = entry.spec["card"]
        assert set(card["card_sources"]) == set(card) - {"card_sources"}  # every fact cited, no other
        assert all(card["card_sources"].values()) and None not in card.values()
        start = card.get("fine_tuned_from", "")
        assert entry.spec.get("quick_gelu") is (True if "OpenAI" in start else False if start else None), name
        if entry.needs_file:
            with pytest.raises(ModelError, match=re.escape(f'{{"name": "{name}", "pretrained": "/path/to/the/file"}}')):
                expand_models([name])
        else:
            assert expand_models([name]) == [entry.spec]
        assert card_lines(name)[0].startswith(f"{name}: ")
    spec = expand_models([{"name": "negclip", "pretrained": "/data/negclip.pth"}])[0]
    assert spec == dict(FINETUNES["negclip"].spec, pretrained="/data/negclip.pth")


def test_lgip_list_prints_its_commands_then_each_named_model_with_its_card(capsys):
    from lgip.command import listing, main

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(listing() + "\n\nnamed models")
    for name in NAMED_MODELS:
        assert f"\n{name}: " in out
    assert "images seen: COCO 2014 train images (train2014)" in out and "Google Drive" in out
    assert main(["list", "models"]) == 0
    assert capsys.readouterr().out.startswith("named models") and main(["list", "x"]) == 2


@pytest.fixture(scope="module")
def b32(tmp_path_factory):
    """A random checkpoint of the real ViT-B-32 (~150M parameters), saved as a training run saves one."""
    return training_checkpoint(random_state("ViT-B-32"), tmp_path_factory.mktemp("b32") / "epoch_5.pt", numpy1=False)


def test_real_vit_b_32_loads_through_each_kind_of_release(b32, offline_hub, tmp_path):
    """NegCLIP's file given in MODELS, FSC-CLIP's file in a Hub repository, CLIC's open_clip Hub folder: each
    loads offline by its entry's spec with the random checkpoint in place of its weights."""
    import open_clip

    fsc = FINETUNES["fsc_clip_coco_vit_b_32"].spec
    hub_snapshot(offline_hub, "ytaek-oh/fsc-clip", {fsc["pretrained"].rsplit("/", 1)[1]: b32})
    config = tmp_path / "open_clip_config.json"
    config.write_text(json.dumps({"model_cfg": open_clip.get_model_config("ViT-B-32")}))
    repo = FINETUNES["clic_vit_b_32_cogvlm"].spec["model_name"][len("hf-hub:") :]
    hub_snapshot(offline_hub, repo, {"open_clip_config.json": config, "open_clip_pytorch_model.bin": b32})
    weights = {k[len("module.") :]: v for k, v in torch.load(b32, weights_only=False, mmap=True)["state_dict"].items()}
    for given in ({"name": "negclip", "pretrained": b32}, "fsc_clip_coco_vit_b_32", "clic_vit_b_32_cogvlm"):
        (spec,) = expand_models([given])
        enc = load_model(spec)
        assert enc.info["quick_gelu"] is (spec.get("quick_gelu") is True), spec["name"]
        state = enc.model.state_dict()
        assert torch.equal(state["visual.proj"], weights["visual.proj"].float())
        assert model_card(spec, enc)["params_total"] > 140e6


@pytest.fixture
def shrunk(monkeypatch):
    """Every architecture of the fine-tunes (and its QuickGELU twin) made tiny in open_clip's registry."""
    from open_clip import factory

    for arch in {e.spec["model_name"] for e in FINETUNES.values()} | {"ViT-B-32", "ViT-B-16", "ViT-L-14"}:
        if not arch.startswith("hf-hub:"):
            monkeypatch.setitem(factory._MODEL_CONFIGS, arch, dict(TINY_CFG))
            monkeypatch.setitem(factory._MODEL_CONFIGS, arch + "-quickgelu", dict(TINY_CFG, quick_gelu=True))


def test_every_entry_loads_by_its_spec_from_a_file_of_its_architecture(shrunk, offline_hub, tmp_path):
    import open_clip

    files = {}
    for name, entry in FINETUNES.items():
        spec = entry.spec
        arch = spec["card"].get("architecture") or spec["model_name"]
        if arch not in files:
            files[arch] = training_checkpoint(random_state(arch), tmp_path / f"{arch}.pt")
        given = name
        if entry.needs_file:
            given = {"name": name, "pretrained": files[arch]}
        elif spec["model_name"].startswith("hf-hub:"):
            config = tmp_path / f"{name}.json"
            config.write_text(json.dumps({"model_cfg": open_clip.get_model_config(arch)}))
            hub_snapshot(
                offline_hub,
                spec["model_name"][len("hf-hub:") :],
                {"open_clip_config.json": config, "open_clip_pytorch_model.bin": files[arch]},
            )
        else:
            repo, file = spec["pretrained"][len("hf-hub:") :].rsplit("/", 1)
            hub_snapshot(offline_hub, repo, {file: files[arch]})
        (resolved,) = expand_models([given])
        enc = load_model(resolved)
        assert enc.info["quick_gelu"] is (resolved.get("quick_gelu") is True), name
        card = model_card(resolved, enc)
        for field in ("fine_tuned_from", "fine_tuned_on", "images_seen"):
            assert card.get(field) == spec["card"].get(field), (name, field)


# --- the overlap flag ---


@pytest.fixture(scope="module")
def coco_demo(tmp_path_factory):
    """The demo's records as a COCO input (int image ids, no synthetic_image), their flips and paraphrases made,
    and a tiny finetune_lgip.py arm of the demo model trained on half of its images."""
    from lgip.demo import DEMO_DIR, demo_inputs

    folder = tmp_path_factory.mktemp("coco_demo")
    shutil.copytree(os.path.join(DEMO_DIR, "images"), folder / "images")
    with open(os.path.join(DEMO_DIR, "lgip_demo.jsonl"), encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    for i, rec in enumerate(records):
        rec.pop("synthetic_image", None)
        assert type(rec["image_id"]) is int, i
    (folder / "lgip_demo.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    inputs = demo_inputs(str(folder))
    run_here(
        "finetune_lgip.py",
        JSONL_PATH=inputs["fliptypes"],
        MODEL="demo",  # (a named model as the start)
        RUN_NAME="arm",
        HELDOUT_FRACTION=0.5,
        STEPS=1,
        BATCH_SIZE=2,
        WARMUP=0,
        DEVICE="cpu",
    )
    arm = json.load(open(folder / "lgip_demo_with_fliptypes__ft_arm" / "model_spec.json"))
    return folder, inputs, arm


def test_an_arm_is_counted_from_its_split_files(coco_demo):
    from lgip.overlap import is_coco_input, overlap_of
    from lgip.records import load_records

    folder, inputs, arm = coco_demo
    for side, count in (("heldout", 0), ("train", 6)):
        records = load_records(str(folder / f"lgip_demo_with_fliptypes__ft_{side}.jsonl"), ())
        assert is_coco_input(records)
        flag = overlap_of(arm, {}, records, str(folder))
        assert flag["status"] == "counted" and (flag["count"], flag["probed_images"]) == (count, 6), flag
    demo = load_records(os.path.join(FIXTURES, "..", "..", "demo", "lgip_demo.jsonl"), ())
    assert not is_coco_input(demo)  # (the demo's records are marked synthetic)
    coco = {"images_seen": "COCO 2014 train images (train2014)"}
    assert overlap_of({"name": "x"}, coco, demo, str(folder)) is None  # (not a COCO input: no question)
    for text in ("LAION-COCO 100K subset (LAION images)", "1M LAION images", None):
        assert overlap_of({"name": "x"}, {"images_seen": text}, records, str(folder)) is None, text
    # a WiSE-FT point of the arm (wise_ft.py) saw what its arm saw: counted from the arm's split files
    from lgip.wise import save_wise

    point = folder / "wise"
    spec, _ = save_wise(
        json.load(open(folder / "lgip_demo_with_fliptypes__ft_arm" / "finetune.meta.json"))["start"],
        arm,
        0.5,
        str(point),
        "arm__wise0.5",
    )
    json.dump({"start": None, "arm": arm, "alpha": 0.5}, open(point / "wise.meta.json", "w"))
    flag = overlap_of(spec, {}, records, str(folder))
    assert flag["status"] == "counted" and flag["count"] == 6, flag


def test_both_flags_in_the_rows_the_console_and_on_the_page(coco_demo, b32, request, tmp_path):
    folder, inputs, arm = coco_demo
    negclip = {"name": "negclip", "pretrained": b32}
    rows, stdout, _ = run_here(
        "run_lgip_by_fliptype.py",
        JSONL_PATH=inputs["fliptypes"],
        MODELS=[arm, negclip],
        DEVICE="cpu",
        NUM_WORKERS=0,
        BOOTSTRAP=20,
        CACHE_DIR=None,
    )
    flags = {r["model_tag"]: r["images_seen_overlap"] for r in rows}
    assert flags["arm"]["status"] == "counted" and (flags["arm"]["count"], flags["arm"]["probed_images"]) == (6, 12)
    assert flags["arm"]["fraction"] == 0.5 and flags["arm"]["train_file"].endswith("__ft_train.jsonl")
    assert flags["negclip"] == {
        "status": "unknown",
        "images_seen": FINETUNES["negclip"].spec["card"]["images_seen"],
        "input": "COCO",
    }
    assert "arm: " in stdout and "images seen in training: 6 of 12 probed images (50.0%) in its train side" in stdout
    assert "images seen in training: unknown: it saw COCO 2014 images" in stdout
    run_here("report.py", JSONL_PATH=inputs["base"], TOP_K=0)
    md = open(folder / "lgip_demo__LGIP_report.md", encoding="utf-8").read()
    assert "| arm (seen 6/12)" in md and "| negclip (seen?)" in md
    assert "- `arm` (seen 6/12): images seen in training: 6 of 12" in md
    seen = page_flags(request, folder / "lgip_demo__LGIP_report.html", tmp_path)
    assert seen["marks"] == {"arm": "seen 6/12", "negclip": "seen?"}, seen
    assert len(seen["lines"]) == 2 and "6 of 12 probed images (50.0%)" in seen["lines"][0], seen
    assert "unknown: it saw COCO 2014 images" in seen["lines"][1] and seen["visible"], seen


def page_flags(request, page, tmp_path):
    """In a headless Chromium: each results row's mark by its name, the note's lines, and whether it shows."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed")
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        pytest.skip("no Chromium installed (apt-get install -y chromium)")
    from test_report_page import _launch

    with sync_api.sync_playwright() as p:
        browser = _launch(p, tmp_path / "profile")
        try:
            tab = browser.new_page()
            tab.goto(page.as_uri(), wait_until="load")
            return tab.evaluate(
                """() => ({
                marks: Object.fromEntries([...document.querySelectorAll('#results tbody tr')].map(r =>
                    [r.dataset.model, (r.querySelector('th .seen') || {}).textContent || null])),
                lines: [...document.querySelectorAll('#images-seen li')].map(li => li.textContent),
                visible: !!document.querySelector('#images-seen') &&
                    document.querySelector('#images-seen').getBoundingClientRect().height > 0})"""
            )
        finally:
            browser.close()
