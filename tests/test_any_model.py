"""Any image-text model (lgip/models/dual_encoders.py, lgip/models/own_loader.py, lgip/entry.py):
transformers dual encoders through their own processors, a loader of one's own, and the
evaluations called from Python. No network: tiny checkpoints built by tests/tiny_hf.py.

- the same weights through two types give the same metrics (open_clip against transformers,
  open_clip against a python loader), from the command line;
- a tiny transformers CLIPModel and AltCLIPModel through all three evaluations equal a plain
  restatement that encodes one text at a time with the model's own processor;
- per family, a text's embedding does not depend on the texts that share its batch;
- errors: a model without the two methods, a user's loader that raises or returns the wrong kind;
- run() twice in one process with a model in memory: independent calls, the model handed back as given.
"""

import copy
import json
import math
import os
import re
import shutil
import threading

import pytest
import torch

import published_style
import tiny_hf
import user_loaders
from conftest import FIXTURES, OPENCLIP_TINY, REFERENCE, ROOT, SIGLIP_TINY, eval_args, run_script

TOL = 1e-5
INPUTS = {
    "run_lgip_multi.py": "fixture_with_perturb.jsonl",
    "run_lgip_by_fliptype.py": "fixture_with_fliptypes.jsonl",
    "rebuttal_enhanced_lgip_by_transformation.py": "rebuttal_enhanced_fixture_with_fliptypes.jsonl",
}
HEADLINE = {
    "run_lgip_multi.py": ("invariance_error_mean", "sensitivity_gap_mean", "sensitivity_pos_rate"),
    "run_lgip_by_fliptype.py": ("invariance_error_mean", "global_sensitivity", "by_flip_type"),
}


@pytest.fixture(scope="module")
def hf_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {
        "clip": tiny_hf.hf_clip_from_openclip(str(root / "clip")),
        "altclip": tiny_hf.hf_altclip(str(root / "altclip")),
    }


def spec(name, folder):
    return {"name": name, "type": "transformers", "model_id": folder}


def assert_close(ours, ref, tol=TOL, path="$"):
    """Every field of ref in ours, numbers within tol."""
    if isinstance(ref, dict):
        for k in ref:
            assert k in ours, f"{path}.{k} missing"
            assert_close(ours[k], ref[k], tol, f"{path}.{k}")
    elif isinstance(ref, list):
        assert len(ours) == len(ref), path
        for i, (a, b) in enumerate(zip(ours, ref)):
            assert_close(a, b, tol, f"{path}[{i}]")
    elif isinstance(ref, float):
        assert math.isclose(ours, ref, rel_tol=0, abs_tol=tol), f"{path}: {ours} != {ref}"
    else:
        assert ours == ref, f"{path}: {ours!r} != {ref!r}"


def copy_input(folder, script):
    dst = os.path.join(folder, INPUTS[script])
    shutil.copy(os.path.join(REFERENCE, INPUTS[script]), dst)
    return dst


def settings(jsonl, models, **extra):
    """run()'s keyword arguments for the fixture on the CPU."""
    return dict(
        JSONL_PATH=jsonl,
        IMAGE_ROOT=FIXTURES,
        MODELS=models,
        DEVICE="cpu",
        NUM_WORKERS=0,
        BOOTSTRAP=0,
        CACHE_DIR=None,
        WRITE_SCORES=False,
        **extra,
    )


def test_same_weights_through_three_types_give_the_same_metrics_from_the_command_line(hf_folders, tmp_path):
    """The tiny open_clip CLIP as open_clip, as a transformers CLIPModel (its state dict mapped) and
    through a python loader: one command line (the lookahead on: the transformers model's texts
    are tokenized ahead), the same metrics at 1e-5."""
    loader = {
        "name": "as_python",
        "type": "python",
        "loader": os.path.join(os.path.dirname(__file__), "user_loaders.py") + ":openclip_tiny",
    }
    models = [OPENCLIP_TINY, spec("as_transformers", hf_folders["clip"]), loader]
    script = "run_lgip_multi.py"
    args = eval_args(copy_input(str(tmp_path), script), "corrected", models=models, BOOTSTRAP=0, CACHE_DIR=None)
    run_script(script, *[a for a in args if a != "--NUM_WORKERS=0"], "--NUM_WORKERS=1")
    results = json.load(open(tmp_path / "fixture_with_perturb__LGIP_ALL.metrics.json"))
    ref = {k: results[0][k] for k in HEADLINE[script]}
    for other in results[1:]:
        assert_close({k: other[k] for k in HEADLINE[script]}, ref)
    assert results[1]["run"]["model"]["family"] == "clip" and results[1]["run"]["model"]["text_attention_mask"]
    assert [j["kind"] for j in results[1]["run"]["lookahead"]][:1] == ["tokens"]
    assert results[2]["run"]["model"]["loader"].endswith("user_loaders.py:openclip_tiny")


class OneTextAtATime(published_style.PublishedVLM):
    """The plain restatement: each text alone through the model's own processor and
    get_text_features, each image through its processor and get_image_features."""

    def __init__(self, model_id):
        from transformers import AutoModel, AutoProcessor

        self.calls, self.model, self.processor = (
            [],
            AutoModel.from_pretrained(model_id).eval(),
            AutoProcessor.from_pretrained(model_id),
        )
        self.seen = {}  # text -> its embedding (each computed alone, once)

    @torch.no_grad()
    def encode_images(self, paths):
        from PIL import Image

        imgs = [Image.open(p).convert("RGB") for p in paths]
        feats = published_style._features(
            self.model.get_image_features(**self.processor(images=imgs, return_tensors="pt"))
        )
        return feats / feats.norm(dim=-1, keepdim=True)

    @torch.no_grad()
    def encode_text(self, texts, batch=None):
        if not texts:
            return torch.empty(0, 0)
        for t in texts:
            if t not in self.seen:
                feats = published_style._features(
                    self.model.get_text_features(**self.processor(text=[t], return_tensors="pt"))
                )
                self.seen[t] = feats / feats.norm(dim=-1, keepdim=True)
        return torch.cat([self.seen[t] for t in texts])


@pytest.mark.parametrize("family", ["clip", "altclip"])
def test_transformers_families_equal_one_text_at_a_time_in_all_three_evaluations(hf_folders, tmp_path, family):
    import rebuttal_enhanced_lgip_by_transformation as rebuttal
    import run_lgip_by_fliptype
    import run_lgip_multi
    from lgip.records import load_records

    vlm = OneTextAtATime(hf_folders[family])
    for module in (run_lgip_multi, run_lgip_by_fliptype, rebuttal):
        script = os.path.basename(module.__file__)
        jsonl = copy_input(str(tmp_path), script)
        ours = module.run(**settings(jsonl, [spec(family, hf_folders[family])]))[0]
        records = [r for _, r in load_records(jsonl)]
        theirs = published_style.EVALUATIONS[script][0](vlm, records, FIXTURES, family)
        assert len(theirs) > 4 and ours["model_tag"] == family
        assert_close(ours, theirs)  # every figure of the restatement


@pytest.mark.parametrize("family", ["clip", "altclip", "siglip"])
def test_a_texts_embedding_does_not_depend_on_its_batch(hf_folders, family):
    """CLIP (causal, pooled at EOT) and AltCLIP (bidirectional, first token) mask their padding;
    SigLIP pads every text to 64. Our embedding of a text equals the processor's for the text
    alone and inside a padded batch of longer texts."""
    from transformers import AutoModel, AutoProcessor
    from lgip.models import load_model
    from lgip.texts import TextBank

    folder = hf_folders.get(family, SIGLIP_TINY["model_id"])
    model, processor = AutoModel.from_pretrained(folder).eval(), AutoProcessor.from_pretrained(folder)
    texts = ["dog", "a red bus waiting at a stop near the station", "two white dogs and a person on the beach at dusk"]
    kw = {"padding": "max_length", "max_length": 64} if family == "siglip" else {"padding": True}
    with torch.no_grad():
        alone = published_style._features(
            model.get_text_features(**processor(text=texts[:1], return_tensors="pt", **kw))
        )
        batch = published_style._features(model.get_text_features(**processor(text=texts, return_tensors="pt", **kw)))
    alone, batch = (torch.nn.functional.normalize(x, dim=-1) for x in (alone, batch))
    assert (alone[0] - batch[0]).abs().max() < 1e-5
    enc = load_model(spec(family, folder), "corrected", "cpu")
    bank = TextBank(enc, num_workers=0)
    slots = bank.add_call(texts)
    emb, rows = bank.encode(batch_size=2)
    assert (emb[rows[slots]] - batch).abs().max() < 1e-5


def test_a_model_without_the_two_methods_is_named(hf_folders, tmp_path):
    from transformers import AutoConfig, CLIPTextModel
    from lgip.errors import ModelError
    from lgip.models import load_model

    folder = tmp_path / "text_only"
    shutil.copytree(hf_folders["clip"], folder)
    CLIPTextModel(AutoConfig.from_pretrained(hf_folders["clip"]).text_config).save_pretrained(folder)
    with pytest.raises(ModelError) as e:
        load_model(spec("text_only", str(folder)), "corrected", "cpu")
    message = str(e.value)
    assert "CLIPTextModel" in message and "no get_text_features and no get_image_features" in message
    assert "Valid types: openclip, transformers, siglip, python" in message


def test_a_saved_clip_model_is_not_read_as_siglip(hf_folders):
    """The published specs' "siglip" type is the same loader: a CLIPModel given so is a CLIP model
    (its mask, no SigLIP padding), and the fixture SigLIP keeps its rules under both names."""
    from lgip.models import load_model

    clip = load_model({"name": "c", "type": "siglip", "model_id": hf_folders["clip"]}, "corrected", "cpu")
    assert clip.info["family"] == "clip" and clip.pad_length([3, 9]) is None and clip.info["text_attention_mask"]
    for type_ in ("siglip", "transformers"):
        for protocol, padded in (("corrected", [64, 64]), ("reference", [9, 12])):
            s = load_model(dict(SIGLIP_TINY, type=type_), protocol, "cpu")
            assert [s.pad_length([3, 9]), s.pad_length([12, 1])] == padded and not s.info["text_attention_mask"]


def test_errors_in_a_users_code_are_reported_as_theirs(tmp_path):
    """From the command line: their traceback, exit status 2, nothing written."""
    jsonl = copy_input(str(tmp_path), "run_lgip_multi.py")
    models = [{"name": "mine", "type": "python", "loader": f"{os.path.dirname(__file__)}/user_loaders.py:broken"}]
    proc = run_script("run_lgip_multi.py", *eval_args(jsonl, "corrected", models=models), check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: model 'mine': the loader raised FileNotFoundError in your code (loader ")
    assert all(
        s in proc.stderr
        for s in ('user_loaders.py", line', "in _read_checkpoint", "FileNotFoundError: no checkpoint at epoch3.pt")
    ), proc.stderr
    frames = re.findall(r'^  File "(.+?)", line \d+', proc.stderr, re.M)
    package = os.path.join(ROOT, "lgip") + os.sep  # the project's package (wherever the checkout is, whatever its name)
    assert frames and not [f for f in frames if f.startswith(package)], proc.stderr  # their frames, not ours
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".json")]


@pytest.mark.parametrize(
    "loader,message",
    [
        (
            "wrong_text_shape",
            "model 'mine': model.encode_text(token_ids) gave a tensor (2,) of torch.float32; expected a "
            "float tensor of 2 dimensions (loader user_loaders:wrong_text_shape)",
        ),
        (
            "two_things",
            "model 'mine': loader user_loaders:two_things must return (model, preprocess, tokenizer), got tuple of 2",
        ),
        ("nothing", "model 'mine': user_loaders has no function 'nothing' (loader 'user_loaders:nothing')"),
    ],
)
def test_a_loaders_result_of_the_wrong_kind_is_named(loader, message):
    from lgip.errors import ModelError
    from lgip.models import load_model

    with pytest.raises(ModelError) as e:
        load_model({"name": "mine", "type": "python", "loader": f"user_loaders:{loader}"}, "corrected", "cpu")
    assert str(e.value) == message


def _state_of(model):
    return (
        model.training,
        [(p.device, p.dtype, p.requires_grad) for p in model.parameters()],
        [p.detach().clone() for p in model.parameters()],
    )


def test_run_twice_in_one_process_with_a_model_in_memory(tmp_path):
    """A training loop's calls: the first call leaves no state behind (token tables, pixels, calls,
    layouts, lookahead threads), the constants and the caller's model come back as they were, and
    the second call (another model, other settings) equals the same call made alone."""
    import run_lgip_multi
    from lgip.memory import KEPT, Kept

    jsonl = copy_input(str(tmp_path), "run_lgip_multi.py")
    first = user_loaders.openclip_tiny()
    first[0].train()
    first[0].visual.requires_grad_(False)
    before = _state_of(first[0])
    second = user_loaders.openclip_tiny()
    with torch.no_grad():
        for p in second[0].parameters():
            p.mul_(1.5)
    defaults = dict(run_lgip_multi.CONFIG)
    threads = threading.active_count()

    def call(model, **extra):
        return run_lgip_multi.run(**settings(jsonl, [{"name": "epoch", "type": "python", "loader": model}], **extra))

    a = call(first, PIXEL_MEMORY_GB=1.0)
    after = _state_of(first[0])
    assert before[:2] == after[:2] and all(torch.equal(x, y) for x, y in zip(before[2], after[2]))
    assert KEPT == Kept()  # (lgip.memory: what the call kept, gone with it)
    assert {k: getattr(run_lgip_multi, k) for k in defaults} == defaults and threading.active_count() == threads
    assert a[0]["run"]["cache"]["dir"] is None and a[0]["run"]["model"]["in_memory"]
    assert a[0]["run"]["config"]["MODELS"][0]["loader"] == [
        "<open_clip.model.CLIP object>",
        "<torchvision.transforms.transforms.Compose object>",
        "<open_clip.tokenizer.SimpleTokenizer object>",
    ]
    b = call(second, PROTOCOL="reference", TEXT_BATCH_SIZE=5)
    b_alone = call(second, PROTOCOL="reference", TEXT_BATCH_SIZE=5)
    keys = HEADLINE["run_lgip_multi.py"]
    assert {k: b[0][k] for k in keys} == {k: b_alone[0][k] for k in keys}
    assert {k: a[0][k] for k in keys} != {k: b[0][k] for k in keys}
    with pytest.raises(
        Exception,
        match=r"unknown setting TEXT_BATCH \(did you mean TEXT_BATCH_SIZE\?\); valid settings: JSONL_PATH, IMAGE_ROOT",
    ):
        call(second, TEXT_BATCH=5)


def test_cached_reruns_need_no_weights_for_the_new_types(hf_folders, tmp_path):
    """transformers and python (string loader) models: a re-run whose embeddings are all cached
    does not load the model (nor run the user's loader), and gives the same numbers."""
    import run_lgip_multi

    jsonl = copy_input(str(tmp_path), "run_lgip_multi.py")
    here = os.path.dirname(os.path.abspath(__file__))
    models = [
        spec("clip", hf_folders["clip"]),
        {"name": "mine", "type": "python", "loader": f"{here}/user_loaders.py:openclip_tiny"},
    ]
    runs = [run_lgip_multi.run(**dict(settings(jsonl, models), CACHE_DIR=str(tmp_path / "cache"))) for _ in range(2)]
    for first, again in zip(*runs):
        assert first["run"]["model"]["weights_loaded"] and not again["run"]["model"]["weights_loaded"]
        assert {k: first[k] for k in HEADLINE["run_lgip_multi.py"]} == {
            k: again[k] for k in HEADLINE["run_lgip_multi.py"]
        }


def test_a_loader_function_from_python_is_called_with_the_runs_device_and_dtype(tmp_path):
    import run_lgip_multi

    jsonl = copy_input(str(tmp_path), "run_lgip_multi.py")
    calls = []

    def build(device, dtype, scale):
        calls.append((device, dtype, scale))
        return user_loaders.openclip_tiny(device, dtype)

    spec_ = {"name": "fn", "type": "python", "loader": build, "kwargs": {"scale": 2}}
    m = run_lgip_multi.run(**dict(settings(jsonl, [spec_]), CACHE_DIR="auto"))[0]
    assert calls == [("cpu", torch.float32, 2)]
    assert (
        m["run"]["model"]["in_memory"] and m["run"]["cache"]["dir"] is None
    )  # (nothing on disk names a function's weights)
    assert m["run"]["config"]["MODELS"][0]["loader"].startswith("<function test_any_model.")
    assert not os.path.exists(tmp_path / ".lgip_cache")


def test_hub_check_knows_the_transformers_type():
    from lgip.models.hub import hub_files

    files = hub_files({"name": "m", "type": "transformers", "model_id": "facebook/metaclip-b32-400m"})
    assert files[0] == ("facebook/metaclip-b32-400m", ["config.json"]) and "model.safetensors.index.json" in files[1][1]
    assert hub_files({"name": "m", "type": "python", "loader": "x:y"}) == []


def test_the_published_models_files_table_is_open_clips_catalogue(monkeypatch):
    """lgip.models.hub.CATALOGUE (a plan's check without importing open_clip) gives what open_clip's own
    catalogue gives for every published open_clip model, at the version it names; another version asks open_clip."""
    from lgip.models import PUBLISHED_MODELS, hub

    specs = [m for m in PUBLISHED_MODELS if m["type"] == "openclip"]
    assert {(m["model_name"], m["pretrained"]) for m in specs} == set(hub.CATALOGUE)
    assert hub._open_clip_version() == hub.CATALOGUE_VERSION  # (requirements.txt pins it)
    tabled = [hub.hub_files(m) for m in specs]
    monkeypatch.setattr(hub, "CATALOGUE", {})
    assert tabled == [hub.hub_files(m) for m in specs]  # (open_clip's catalogue, asked)
    monkeypatch.undo()
    monkeypatch.setattr(hub, "_open_clip_version", lambda: "9.9.9")
    import open_clip

    monkeypatch.setattr(open_clip, "get_pretrained_cfg", lambda name, tag: {"hf_hub": "elsewhere/repo/"})
    assert hub.hub_files(specs[0])[0][0] == "elsewhere/repo"


def test_word_attribution_of_the_same_weights_through_three_types(hf_folders, tmp_path):
    """explain_flips.py on the same weights as open_clip, as a transformers CLIPModel and through a
    python loader (whose tokenizer's 77-id rows are cut at the text's end for the word alignment):
    the same token scores, words and blamed words. A family it cannot explain (AltCLIP) stops the
    script, or with UNSUPPORTED="skip" is left out and listed."""
    import explain_flips
    from lgip.errors import ModelError

    jsonl = copy_input(str(tmp_path), "run_lgip_by_fliptype.py")
    triple = user_loaders.openclip_tiny()
    triple[0].train()
    python = {"name": "as_python", "type": "python", "loader": triple}
    settings_ = dict(
        JSONL_PATH=jsonl, IMAGE_ROOT=FIXTURES, DEVICE="cpu", NUM_WORKERS=0, N_FLIPS=12, TOP_K=0, BOOTSTRAP=0
    )
    results = explain_flips.run(
        **settings_,
        UNSUPPORTED="skip",
        MODELS=[
            OPENCLIP_TINY,
            spec("as_transformers", hf_folders["clip"]),
            python,
            spec("altclip", hf_folders["altclip"]),
        ],
    )
    assert results[0]["run"]["family"] == "open_clip" and results[1]["run"]["family"] != "open_clip"
    assert results[3]["model_tag"] == "altclip" and "AltCLIPModel" in results[3]["unsupported"]
    assert triple[0].training and results[2]["run"]["model"]["dtype"] == "float32"  # handed back in its mode
    lines = [
        [json.loads(x) for x in open(tmp_path / f"fixture_with_fliptypes__LGIP_explain_{m['model_tag']}.jsonl")]
        for m in results[:3]
    ]
    assert [len(x) for x in lines] == [12, 12, 12]
    for a, *others in zip(*lines):
        for b in others:
            assert (a["flip"], a["words"], a["changed"], a["blamed"]) == (
                b["flip"],
                b["words"],
                b["changed"],
                b["blamed"],
            )
            assert max(abs(x - y) for x, y in zip(a["token_scores"], b["token_scores"])) < 1e-6
    with pytest.raises(
        ModelError, match="word attribution does not support this model .*AltCLIPModel.*supported: open_clip"
    ):
        explain_flips.run(**settings_, MODELS=[spec("altclip", hf_folders["altclip"])])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_word_attribution_of_a_model_in_memory_below_fp32_runs_in_fp32(tmp_path, dtype):
    """Section 8 attributes through the text tower in fp32: a caller's bf16 or fp16 model in memory is
    explained in fp32 (the same lines as a float32 copy of its weights gives) and comes back as it
    was, the very tensors in its dtype and mode."""
    import explain_flips

    jsonl = copy_input(str(tmp_path), "run_lgip_by_fliptype.py")
    model, preprocess, tokenizer = user_loaders.openclip_tiny()
    model.to(getattr(torch, dtype)).train()
    copy32 = copy.deepcopy(model).float()
    before = {n: (p.data_ptr(), p.dtype) for n, p in model.named_parameters()}
    settings_ = dict(
        JSONL_PATH=jsonl, IMAGE_ROOT=FIXTURES, DEVICE="cpu", NUM_WORKERS=0, N_FLIPS=12, TOP_K=0, BOOTSTRAP=0
    )
    results = explain_flips.run(
        **settings_,
        MODELS=[
            {"name": "low", "type": "python", "loader": (model, preprocess, tokenizer)},
            {"name": "fp32", "type": "python", "loader": (copy32, preprocess, tokenizer)},
        ],
    )
    assert results[0]["run"]["model"]["attribution_in_fp32_from"] == [f"torch.{dtype}"]
    assert "attribution_in_fp32_from" not in results[1]["run"]["model"]
    assert results[0]["run"]["model"]["attribution_embedding_diff"] < 1e-5
    low, high = (
        [json.loads(x) for x in open(tmp_path / f"fixture_with_fliptypes__LGIP_explain_{m}.jsonl")]
        for m in ("low", "fp32")
    )
    assert len(low) == 12 and low == high
    assert {n: (p.data_ptr(), p.dtype) for n, p in model.named_parameters()} == before and model.training


def test_embeddings_that_are_not_finite_stop_the_model_with_what_and_where(tmp_path):
    """A model whose embeddings are NaN or inf (fp16 overflow, NaN weights) makes no figure: every
    figure it enters would be NaN and a NaN gap would count as not positive. The run names the model,
    how many, the first text or image, and what to try; nothing is written for it. With
    ON_MODEL_ERROR="skip" the other models' rows are written whole and the failure is recorded."""
    import run_lgip_multi
    from lgip.errors import ModelError

    jsonl = copy_input(str(tmp_path), "run_lgip_multi.py")
    loader = f"{os.path.dirname(__file__)}/user_loaders.py:non_finite"
    texts = {"name": "nan_texts", "type": "python", "loader": loader}
    images = {"name": "inf_images", "type": "python", "loader": loader, "kwargs": {"word": "zzzzqx", "images": True}}
    with pytest.raises(ModelError) as e:
        run_lgip_multi.run(**settings(jsonl, [texts]))
    said = str(e.value)
    assert (
        said.startswith("model 'nan_texts': 0 image and ") and " text embeddings are not finite (NaN or inf; " in said
    )
    first = re.search(r"first text: '([^']*)'", said).group(1)
    assert "dog" in first.lower().split() or "dog" in first.lower(), said
    assert "In float32 it is the model's own: NaN in its weights, or its code." in said
    assert said.endswith("No metrics were written for it.")
    fp16 = {"name": "half", "type": "python", "loader": loader}
    with pytest.raises(ModelError, match=r'Run in bfloat16, a model can overflow: run it with DTYPE="float32"\.'):
        run_lgip_multi.run(**settings(jsonl, [fp16], DTYPE="bfloat16"))
    with pytest.raises(
        ModelError,
        match=r"model 'inf_images': 12 image and 0 text embeddings are not finite "
        r"\(NaN or inf; first image: line 1, ",
    ):
        run_lgip_multi.run(**settings(jsonl, [images]))
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".json")]
    good = {"name": "good", "type": "python", "loader": f"{os.path.dirname(__file__)}/user_loaders.py:openclip_tiny"}
    rows = run_lgip_multi.run(**settings(jsonl, [texts, good], ON_MODEL_ERROR="skip"))
    assert [r["model_tag"] for r in rows] == ["good"]
    skipped = rows[0]["run"]["skipped_models"]
    assert [s["name"] for s in skipped] == ["nan_texts"] and "not finite" in skipped[0]["error"]


def test_an_open_clip_model_in_memory_gets_its_spec_twins_accelerations(tmp_path):
    """A training loop's open_clip model (the objects open_clip built) runs the accelerations of the
    same model named by a spec (trimmed texts, prefix packs, the pooled last block, the fast tokenizer):
    the same numbers as the plain path of a model of one's own (a wrapper open_clip does not know), and
    rows that say what ran; the wrapper's row says which switches did not run for it, and why."""
    from lgip import accelerations
    import run_lgip_multi

    jsonl = copy_input(str(tmp_path), "run_lgip_multi.py")
    model, preprocess, tokenizer = user_loaders.openclip_tiny()

    rows = run_lgip_multi.run(
        **settings(
            jsonl,
            [
                {"name": "epoch", "type": "python", "loader": (model, preprocess, tokenizer)},
                {"name": "wrapped", "type": "python", "loader": (user_loaders.Wrapped(model), preprocess, tokenizer)},
            ],
        )
    )
    fast, plain = rows
    for key in HEADLINE["run_lgip_multi.py"]:
        assert fast[key] == pytest.approx(plain[key], abs=1e-6)
    info = fast["run"]["model"]
    assert info["open_clip_model"] and info["text_trimmed"] and info["text_prefix_sharing"] and info["in_memory"]
    assert info["image_last_block_class_token_only"]
    assert all(
        fast["run"]["accelerations"][n]
        for n in ("PREFIX_PACKS", "POOLED_LAST_BLOCK", "TRIMMED_TEXT", "FAST_CLIP_TOKENIZER", "PIXELS_ON_DEVICE")
    )
    assert fast["run"]["accelerations_not_applied"] == {
        "BUILD_ON_DEVICE": "the model runs on the CPU",
        **{
            n: "for a model that scores a pair jointly (types generative and itm, LGIP_SPEC.md 13)"
            for n in accelerations.JOINT_ONLY
        },
    }
    assert "text_trimmed" not in plain["run"]["model"] and not plain["run"]["accelerations"]["PREFIX_PACKS"]
    assert plain["run"]["accelerations_not_applied"]["TRIMMED_TEXT"] == (
        "a model of one's own: its encode_text and encode_image run as given"
    )
    assert fast["run"]["text_positions"]["computed"] < plain["run"]["text_positions"]["computed"]
