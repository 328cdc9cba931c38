"""TRACKERS, offline and read back: an evaluation's figures (and W&B's per-sample table with thumbnails) and a
fine-tuning's loss terms a step at a time, in W&B's offline run file, MLflow's file store and TensorBoard's event
files; a tracker named but not installed stopped before any work; none imported unless named."""

import glob
import json
import os
import struct
import subprocess
import sys

import pytest

from conftest import OPENCLIP_TINY, REFERENCE, ROOT, eval_settings, run_here

TRACKERS = [t for t in ("wandb", "mlflow", "tensorboard") if __import__("importlib").util.find_spec(t) is not None]


def _offline(mp, root):
    """Every tracker's files under `root`, nothing sent anywhere."""
    for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
        os.makedirs(root / name.lower(), exist_ok=True)
        mp.setenv(name, str(root / name.lower()))
    mp.setenv("WANDB_MODE", "offline")
    mp.setenv("WANDB_SILENT", "true")
    mp.setenv("MLFLOW_TRACKING_URI", (root / "mlruns").as_uri())
    mp.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # (MLflow's file store, read back below)


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """run_lgip_multi (6 records) and finetune_lgip (3 steps) with every tracker installed here."""
    if not TRACKERS:
        pytest.skip("no tracker installed (pip install -r requirements-test.txt: wandb, mlflow, tensorboard)")
    import shutil

    root = tmp_path_factory.mktemp("trackers")
    with pytest.MonkeyPatch.context() as mp:
        _offline(mp, root)
        lines = open(os.path.join(REFERENCE, "fixture_with_perturb.jsonl"), encoding="utf-8").read().splitlines()
        (root / "in_with_perturb.jsonl").write_text("\n".join(lines[:6]) + "\n")
        settings = eval_settings(root / "in_with_perturb.jsonl", "corrected", models=[OPENCLIP_TINY], BOOTSTRAP=20)
        rows, _, _ = run_here("run_lgip_multi.py", **settings, TRACKERS=TRACKERS, OUTPUT_DIR=str(root / "out"))
        src = root / "ft" / "fixture_with_fliptypes.jsonl"
        shutil.copytree(os.path.join(REFERENCE, "..", "images"), root / "ft" / "images")
        shutil.copy(os.path.join(REFERENCE, "fixture_with_fliptypes.jsonl"), src)
        ft = dict(JSONL_PATH=str(src), MODEL=OPENCLIP_TINY, STEPS=3, BATCH_SIZE=4, WARMUP=1, SAVE_EVERY=3, LR=1e-3)
        run_here("finetune_lgip.py", **ft, HELDOUT_FRACTION=0.25, DEVICE="cpu", TRACKERS=TRACKERS, RUN_NAME="tracked")
    folder = root / "ft" / "fixture_with_fliptypes__ft_tracked"
    log = [json.loads(x) for x in open(folder / "train_log.jsonl", encoding="utf-8")]
    return root, rows[0], folder, log


def test_tensorboard_event_files_hold_the_figures_and_each_steps_losses(logged):
    pytest.importorskip("tensorboard", reason="pip install tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    root, row, folder, log = logged
    events = EventAccumulator(str(root / "out" / "in_with_perturb__LGIP_tensorboard" / "multi")).Reload()
    assert events.Scalars("multi/sensitivity_pos_rate")[0].value == pytest.approx(row["sensitivity_pos_rate"])
    assert events.Scalars("multi/invariance_error_mean")[0].value == pytest.approx(row["invariance_error_mean"])
    steps = EventAccumulator(str(folder / "tensorboard")).Reload()
    assert [(e.step, e.value) for e in steps.Scalars("loss")] == [(x["step"], pytest.approx(x["loss"])) for x in log]
    assert len(steps.Scalars("loss_sc")) == 3 and "loss_vc" not in steps.Tags()["scalars"]  # (W_VC 0: not logged)


def test_mlflow_file_store_holds_the_figures_and_each_steps_losses(logged):
    pytest.importorskip("mlflow", reason="pip install mlflow")
    from mlflow.tracking import MlflowClient

    root, row, folder, log = logged
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    try:
        client = MlflowClient(tracking_uri=(root / "mlruns").as_uri())
        experiment = client.get_experiment_by_name("lgip")
        found = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    finally:
        os.environ.pop("MLFLOW_ALLOW_FILE_STORE")
    evaluation = found["multi in_with_perturb"]
    assert evaluation.data.metrics["multi/sensitivity_pos_rate"] == pytest.approx(row["sensitivity_pos_rate"])
    assert evaluation.data.params["BOOTSTRAP"] == "20" and evaluation.data.tags["lgip.kind"] == "eval"
    history = client.get_metric_history(found["tracked"].info.run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(x["step"], pytest.approx(x["loss"])) for x in log]


def _wandb_records(run_file):
    """The records of a W&B run file (its leveldb log of protobuf records: 7-byte header, 32 KiB blocks)."""
    from wandb.proto import wandb_internal_pb2

    data, records, pos, part = open(run_file, "rb").read(), [], 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        part = chunk if kind in (1, 2) else part + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(part)
            records.append(record)
    return records


def test_wandb_offline_runs_hold_the_figures_the_losses_and_a_table_with_thumbnails(logged):
    pytest.importorskip("wandb", reason="pip install wandb")
    root, row, folder, log = logged
    runs = {}
    for run_file in glob.glob(str(root / "**" / "offline-run-*" / "run-*.wandb"), recursive=True):
        records = _wandb_records(run_file)
        name = next(r.run.display_name for r in records if r.WhichOneof("record_type") == "run")
        runs[name] = records
    assert set(runs) == {"multi in_with_perturb", "tracked"}
    summary = {
        i.key or "/".join(i.nested_key): json.loads(i.value_json)
        for r in runs["multi in_with_perturb"]
        if r.WhichOneof("record_type") == "summary"
        for i in r.summary.update
    }
    assert summary["multi/sensitivity_pos_rate"] == pytest.approx(row["sensitivity_pos_rate"])
    assert summary["multi/tiny_openclip/pairs/nrows"] > 0  # (the per-sample table)
    table = next(r.artifact for r in runs["multi in_with_perturb"] if r.WhichOneof("record_type") == "artifact")
    files = {c.path: c.local_path for c in table.manifest.contents}
    images = [p for p in files if p.startswith("media/images/") and p.endswith(".png")]
    body = json.load(open(next(files[p] for p in files if p.endswith(".table.json"))))
    assert (
        body["columns"][:3] == ["image", "image_path", "caption"]
        and len(body["data"]) == summary["multi/tiny_openclip/pairs/nrows"]
    )
    assert images and {d[1] for d in body["data"]} <= {
        json.loads(x)["image_path"] for x in open(glob.glob(str(root / "out" / "*.scores.jsonl"))[0])
    }
    history = [
        (r.history.step.num, {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item})
        for r in runs["tracked"]
        if r.WhichOneof("record_type") == "history"
    ]
    assert [(step, pytest.approx(h["loss"])) for step, h in history] == [(x["step"], x["loss"]) for x in log]


def test_a_tracker_named_but_not_installed_or_unknown_stops_before_any_work(monkeypatch):
    from lgip import settings
    from lgip.errors import ConfigError

    monkeypatch.setattr(settings, "_installed", lambda module: module != "wandb")
    with pytest.raises(ConfigError, match=r"TRACKERS names wandb, not installed here: pip install wandb"):
        settings.check_settings({"TRACKERS": ["wandb", "tensorboard"]})
    with pytest.raises(ConfigError, match=r"TRACKERS must be a list of \"wandb\", \"mlflow\", \"tensorboard\""):
        settings.check_settings({"TRACKERS": ["neptune"]})
    settings.check_settings({"TRACKERS": ["tensorboard"]})


def test_no_tracker_library_is_imported_unless_named():
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import common, lgip.trackers, lgip.export, lgip.compare; "
        "lgip.trackers.log_evaluation('run_lgip_multi.py', {'TRACKERS': []}, [{'model_tag': 'm'}], '.'); "
        "print(sorted({'wandb', 'mlflow', 'tensorboard', 'pyarrow'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code, ROOT], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
