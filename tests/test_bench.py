"""bench.py smoke tests: it runs, prints its ratios, and both paths give the same metrics.

Tiny fixture models, 4 images, CPU. No timing is asserted: speed targets are measured by
bench.py itself (benchmarks/BENCHMARKS.md), never by tests.
"""

import glob
import importlib
import json
import os
import sys

from lgip.cli import configure
from lgip.models.encoder import SIGLIP_TEXT_LENGTH
from lgip.models import load_model
from lgip.records import load_records
from lgip.memory import KEPT
from lgip.tokens import shared_token_table

from conftest import OPENCLIP_TINY, ROOT, SIGLIP_TINY, run_script

TOL = 1e-4
KEYS = ("invariance_error_mean", "sensitivity_gap_mean", "sensitivity_pos_rate")


def test_bench_runs_and_paths_agree(tmp_path):
    results = tmp_path / "bench_results.json"
    # SigLIP compared under the reference protocol: the published padding (longest text per call).
    proc = run_script(
        "benchmarks/bench.py",
        f"--MODEL={OPENCLIP_TINY!r}",
        f"--ARCHS={[SIGLIP_TINY]!r}",
        "--N_IMAGES=4",
        "--SCALE_IMAGES=3",
        "--PROTOCOL=reference",
        "--DEVICE=cpu",
        "--NUM_WORKERS=0",
        f"--WORK_DIR={str(tmp_path / 'work')!r}",
        f"--RESULTS_JSON={str(results)!r}",
        "--PROFILE='tiny_siglip'",
    )
    out = proc.stdout
    assert out.count("speed-up project vs published-style:") == 2
    assert "cache speed-up warm vs cold:" in out
    assert out.count("max abs metric diff:") == 2 and "DISAGREE" not in out
    assert "projection: 40000 images x 42.5 texts/image" in out
    assert "text prefix packs: True" in out
    assert "at scale: the 2 models as one run_lgip_multi.py process (lookahead: True)" in out

    data = json.loads(results.read_text())
    assert data["complete"] is True  # rewritten after every model; complete once all are done
    assert data["script"] == "bench.py" and {"torch", "open_clip_torch"} <= set(data["versions"])
    assert data["config"]["N_IMAGES"] == 4 and data["data"]["images"] == 4
    assert [r["name"] for r in data["results"]] == ["tiny_openclip", "tiny_siglip"]
    for row in data["results"]:
        p, q = row["project"]["metrics"], row["published"]["metrics"]
        assert p["num_invariance_pairs"] == q["num_invariance_pairs"] > 0
        assert p["num_sensitivity_pairs"] == q["num_sensitivity_pairs"] > 0
        for k in KEYS:
            assert abs(p[k] - q[k]) <= TOL, (row["name"], k, p[k], q[k])
        assert row["metrics_comparable"] and row["metrics_agree"] and row["max_abs_metric_diff"] <= TOL
        for path in ("project", "published"):
            assert row[path]["images_per_s"] > 0 and row[path]["texts_per_s"] > 0
        assert row["scale"]["records"] == 3 and row["speedup_at_scale"] > 0
    assert data["results"][1]["scale"]["image_sources"]["decoded"] == 3  # another geometry
    profile = data["results"][1]["scale"]["profile"]  # PROFILE: that model's pass only; on the CPU no device time
    assert "profile" not in data["results"][0]["scale"] and profile["device_busy_s"] is None
    assert len(profile["top"]) == 12 and all(ms >= 0 and calls >= 1 for _, ms, calls in profile["top"])
    assert "  profile: device busy None s" in out
    cache = data["results"][0]["cache"]
    assert cache["same_metrics"] and cache["warm_texts_encoded"] == 0
    assert cache["warm_hits"]["image_hits"] == 4 and cache["warm_hits"]["text_hits"] > 0
    assert (tmp_path / "work" / "bench_base_with_perturb.jsonl").read_text().count("\n") == 4


def test_random_init_siglip_folder_loads_with_project_loader(tmp_path, monkeypatch):
    """The GPU-only per-architecture path: a SigLIP built from sizes, saved, read by load_transformers."""
    monkeypatch.setattr(sys, "argv", ["bench.py"])
    sys.modules.pop("bench", None)
    bench = importlib.import_module("bench")
    monkeypatch.setitem(
        bench._SIGLIP_ARCHS, "siglip-test-patch16-32", dict(width=32, mlp=64, heads=2, layers=1, vocab=1000, image=32)
    )
    spec, folder = bench.arch_spec("siglip-test-patch16-32", str(tmp_path))
    assert os.path.isdir(folder) and bench.arch_key(spec) == "siglip-test-patch16-32"
    enc = load_model(spec, "corrected", "cpu", "fp32")
    assert enc.pad_length([3, 5]) == SIGLIP_TEXT_LENGTH  # padded to 64 as the real model
    assert len(enc.tokenize(["a red bus"])[0]) > 1
    pub = bench.PUBLISHED_STYLE[spec["type"]](spec, enc.model, enc)
    emb = pub.texts(["a red bus", "two dogs on a beach"])
    assert emb.shape == (2, 32)
    image = sorted(glob.glob(os.path.join(ROOT, "demo", "images", "*.jpg")))[0]  # (a tracked demo image)
    assert pub.image(image).shape == (1, 32)


def test_bench_host_reports_cost_per_text(tmp_path):
    proc = run_script("benchmarks/bench_host.py", "--N_IMAGES=6", "--REPEATS=1", f"--WORK_DIR={str(tmp_path)!r}")
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("6 records, ") and " us per text" in line and "'lookup_and_tokenize'" in line
    assert "override: N_IMAGES = 6" in proc.stdout and proc.stdout.count("override:") == 3  # bench.py keeps its own
    assert "6 records, " in proc.stdout.split("first model")[0] and "later model" in line
    proc = run_script(
        "benchmarks/bench_host.py",
        "--N_IMAGES=6",
        "--REPEATS=1",
        "--WIDTH=8",
        "--DTYPE=bf16",
        "--CACHE=True",
        f"--WORK_DIR={str(tmp_path / 'w2')!r}",
    )
    assert proc.stdout.count(" us per text") == 2
    assert glob.glob(str(tmp_path / "w2" / "cache" / "*" / "text-*.npz"))  # (the last pass's cache, cold)


def test_imported_script_keeps_its_defaults(monkeypatch):
    """The command line belongs to the script being run, not to the scripts it imports."""
    monkeypatch.setattr(sys, "argv", ["bench_host.py", "--N_IMAGES=6"])
    ns = {"__name__": "bench", "N_IMAGES": 32}
    assert configure(ns) == {"N_IMAGES": 32}
    ns = {"__name__": "__main__", "N_IMAGES": 32}
    assert configure(ns) == {"N_IMAGES": 6}


def test_bench_measures_without_prefix_packs(tmp_path):
    """PREFIX_PACKS=False: CLIP-family texts in exact-length batches (to measure what packing
    buys), the same metrics as the published-style loop."""
    proc = run_script(
        "benchmarks/bench.py",
        f"--MODEL={OPENCLIP_TINY!r}",
        "--N_IMAGES=2",
        "--DEVICE=cpu",
        "--NUM_WORKERS=0",
        "--PREFIX_PACKS=False",
        f"--WORK_DIR={str(tmp_path / 'work')!r}",
        "--RESULTS_JSON=None",
    )
    assert "text prefix packs: False" in proc.stdout and "DISAGREE" not in proc.stdout
    assert "max abs metric diff:" in proc.stdout


def test_at_scale_passes_run_as_one_process(tmp_path, monkeypatch):
    """at_scale_sequence runs its models as one process would: the second model of a family
    finds the first one's pixels and tokens; a SigLIP model after them gets what the
    Lookahead did for it (or did it itself, had it started first); the same metrics for the
    twins; the process state from before is back afterwards."""
    sys.path.insert(0, ROOT)
    bench = importlib.import_module("bench")
    from conftest import SIGLIP_TINY

    monkeypatch.setattr(bench, "NUM_WORKERS", 1)
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    jsonl = bench.make_records(str(tmp_path), 3, 0)
    records = load_records(jsonl, ("same_caps", "diff_caps"))
    enc, sig = (load_model(s, "corrected", "cpu") for s in (OPENCLIP_TINY, SIGLIP_TINY))
    twin = dict(OPENCLIP_TINY, name="tiny_openclip_again")
    rows = [{"name": s["name"], "published": {"s_per_record": 1.0}} for s in (OPENCLIP_TINY, twin, SIGLIP_TINY)]
    marker = shared_token_table(("marker",))
    runs = list(zip(rows, (OPENCLIP_TINY, twin, SIGLIP_TINY), (enc, enc, sig)))
    done = list(bench.at_scale_sequence(runs, (records, jsonl, str(tmp_path), bench.text_counts(records))))
    first, second, third = (r["scale"] for r in done)
    assert first["image_sources"]["decoded"] == 3 and first["lookahead"] == []
    assert second["image_sources"] == {"decoded": 0, "from_pixel_memory": 3, "from_cache": 0}
    assert second["lookahead"] == []
    assert first["metrics"] == second["metrics"]
    jobs = third["lookahead"]
    if not jobs:  # (the helper thread was still preparing SigLIP when it started, on a busy machine: it did it itself)
        assert third["image_sources"]["decoded"] == 3, third
    else:
        assert [j["kind"] for j in jobs] == ["tokens", "pixels"] and {j["state"] for j in jobs} <= {"done", "dropped"}
        if jobs[1]["state"] == "done":
            assert third["image_sources"]["from_pixel_memory"] == 3
    assert all(r["speedup_at_scale"] > 0 for r in done)
    assert KEPT.token_tables == {("marker",): marker}  # the state from before the sequence


def test_compare_outputs_tells_a_second_runs_times_from_a_changed_figure(tmp_path):
    """benchmarks/compare_outputs.py: a second run's times (created, seconds, an ISO timestamp in the
    markdown) are not a difference; a changed figure, or a file only one folder has, is (exit 1)."""
    import subprocess

    before, after = tmp_path / "before", tmp_path / "after"
    before.mkdir(), after.mkdir()
    row = {
        "model_tag": "m",
        "invariance_error_mean": 0.25,
        "run": {"created": "2026-11-26T10:00:00+0000", "seconds": 1.5},
    }
    for folder, created, seconds in (
        (before, "2026-11-26T10:00:00+0000", 1.5),
        (after, "2026-11-27T11:00:00+0000", 2.0),
    ):
        (folder / "x.metrics.json").write_text(json.dumps([dict(row, run={"created": created, "seconds": seconds})]))
        (folder / "x.md").write_text(f"made on {created} in {seconds} s\n")
        (folder / "x.png").write_bytes(b"\x89PNG same")

    def compare():
        return subprocess.run(
            [sys.executable, os.path.join(ROOT, "benchmarks", "compare_outputs.py"), str(before), str(after)],
            capture_output=True,
            text=True,
        )

    same = compare()
    assert same.returncode == 0 and "1 byte-identical, 2 identical but for times, 0 differ" in same.stdout, same.stdout
    (after / "x.metrics.json").write_text(json.dumps([dict(row, invariance_error_mean=0.26)]))
    (after / "extra.json").write_text("{}")
    changed = compare()
    assert changed.returncode == 1 and "DIFFERS: x.metrics.json" in changed.stdout and "ONLY IN" in changed.stdout


def test_the_generative_benchmark_prints_both_paths_and_their_agreement():
    """benchmarks/bench_generative.py on the tiny LLaVA: both paths timed, LM tokens per text, and the
    scores of the image's prefix run once within 1e-4 of the plain forwards'."""
    import re

    proc = run_script(
        os.path.join("benchmarks", "bench_generative.py"), "--N_IMAGES=1", "--PRIOR_IMAGES=1", "--MAX_TEXTS=20"
    )
    assert re.search(r"^  plain .* texts/s .* LM tokens per text$", proc.stdout, re.M), proc.stdout
    assert re.search(r"^  prefix .* texts/s .* LM tokens per text$", proc.stdout, re.M), proc.stdout
    ratio, diff = re.search(
        r"LM tokens, plain / prefix: ([\d.]+)x; .* max \|score difference\|: (\S+)", proc.stdout
    ).groups()
    assert float(ratio) > 1 and float(diff) < 1e-4
    fewer = re.search(
        r"^LLaVA-1.5-7B's shape \(prefix (\d+) tokens, 576 of them .* \(([\d.]+)x fewer\)", proc.stdout, re.M
    )
    assert fewer and int(fewer.group(1)) > 576 and float(fewer.group(2)) > 10, proc.stdout
    proc = run_script(
        os.path.join("benchmarks", "bench_generative.py"),
        "--N_IMAGES=1",
        "--PRIOR_IMAGES=1",
        "--FAMILY=paligemma",
        "--MAX_TEXTS=8",
    )  # (a prefix-LM: its own path)
    diff = re.search(r"max \|score difference\|: (\S+)", proc.stdout).group(1)
    assert float(diff) < 1e-4, proc.stdout
    # LLaVA-1.5-7B's architecture built with random weights (the GPU issue's run), shrunk for the CPU: 576 image tokens
    proc = run_script(
        os.path.join("benchmarks", "bench_generative.py"),
        "--N_IMAGES=1",
        "--PRIOR_IMAGES=1",
        "--ARCH=llava-1.5-7b",
        "--SHRINK=128",
        "--WIDTH_SHRINK=2",
        "--MAX_TEXTS=6",
    )
    plain = re.search(r"^  plain .* ([\d.]+) LM tokens per text$", proc.stdout, re.M)
    assert plain and float(plain.group(1)) > 576, proc.stdout
    assert float(re.search(r"max \|score difference\|: (\S+)", proc.stdout).group(1)) < 1e-4
    # the operators a run dispatches per image (torch.profiler's top-level aten:: events), 6fc3297's path and
    # all on, with their wall times: WIDTH_SHRINK narrows it further, its layer counts kept (here 1 + 1 by SHRINK)
    ops = re.search(
        r"^LLaVA-7B-shaped operators per image: ([\d,]+) -> ([\d,]+) \(.* wall ([\d.]+) -> ([\d.]+) s per image",
        proc.stdout,
        re.M,
    )
    assert ops, proc.stdout
    before, after = (int(x.replace(",", "")) for x in ops.groups()[:2])
    assert before > after > 0 and float(ops.group(4)) > 0, proc.stdout
