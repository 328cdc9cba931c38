"""report.py's web page at the published scale (nine models, the default TOP_K), opened in a real
headless Chromium from another folder; and the lgip.report helpers against plain restatements.

The nine models' metrics and score files are made here (no model runs): each model's strongest
failures fall on images of its own, so the galleries show as many different photographs as they
can (the page's size at its worst), and two of them point at a missing and an unreadable image.
"""
import json
import os
import random
import shutil

import numpy as np
import pytest

from conftest import run_script
from lgip.method import COLORS, NUMBER_WORDS, OBJECTS
from lgip.models import PUBLISHED_MODELS

MODELS = [m["name"] for m in PUBLISHED_MODELS]  # nine
HTML_WORDS = "waiting near Tom & Jerry's <b>wall</b>"  # captions are text, never markup
PER_MODEL = 20  # records whose flips and paraphrases only this model gets badly wrong
MAX_PAGE_BYTES = 5_000_000
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def photos(folder, n, size=(320, 240)):
    """n different photographs (crops of matplotlib's sample portrait, mirrored and tinted)."""
    from matplotlib import cbook
    from PIL import Image, ImageOps
    rng = random.Random(0)
    with Image.open(cbook.get_sample_data("grace_hopper.jpg")) as src:
        src = src.convert("RGB").resize((1024, 1200))
    os.makedirs(folder, exist_ok=True)
    names = []
    for i in range(n):
        w = rng.randint(420, 1000)
        x, y = rng.randint(0, 1024 - w), rng.randint(0, 1200 - w * 3 // 4)
        img = src.crop((x, y, x + w, y + w * 3 // 4)).resize(size)
        if i % 2:
            img = ImageOps.mirror(img)
        tint = Image.new("RGB", size, tuple(rng.randint(0, 255) for _ in range(3)))
        img = Image.blend(img, tint, 0.25)
        name = f"{i + 1:012d}.jpg"
        img.save(os.path.join(folder, name), quality=90)
        names.append(name)
    return names


def swap(word, words, rng):
    return rng.choice([w for w in words if w != word])


def make_inputs(folder):
    """nine.jsonl's two evaluations (multi, fliptypes) as their scripts leave them: metrics with
    intervals and one score file per model, the sims drawn so that model m fails worst on records
    [m * PER_MODEL, (m + 1) * PER_MODEL); the two last records have no readable image."""
    rng = random.Random(1)
    names = photos(os.path.join(folder, "images"), PER_MODEL * len(MODELS))
    with open(os.path.join(folder, "images", "corrupt.jpg"), "wb") as f:
        f.write(b"\xff\xd8\xff\xe0 this is not a JPEG")
    names += ["missing.jpg", "corrupt.jpg"]
    records = []
    for i, name in enumerate(names):
        n, c, o = rng.choice(NUMBER_WORDS[1:]), rng.choice(COLORS), rng.choice(OBJECTS)
        rest = "waiting near the old stone wall" if i < len(names) - 2 else HTML_WORDS
        caption = f"{n} {c} {o}s {rest}"
        flips = [(f"{swap(n, NUMBER_WORDS, rng)} {c} {o}s {rest}", "number"),
                 (f"{n} {swap(c, COLORS, rng)} {o}s {rest}", "color"), (f"{n} {c} {swap(o, OBJECTS, rng)}s {rest}", "object")]
        paraphrases = ["a photo of " + caption, caption.replace("waiting near", "standing close to")]
        records.append((i + 1, "images/" + name, caption, flips, paraphrases))
    owner = {i: min(i // PER_MODEL, len(MODELS) - 1) for i in range(len(records))}
    owner[len(records) - 2], owner[len(records) - 1] = 0, 1  # missing: model 0's; unreadable: model 1's
    spread = [0.01 + 0.005 * ((5 * m) % len(MODELS)) for m in range(len(MODELS))]  # invariance not in model order
    for stem, key in (("nine_with_perturb", "multi"), ("nine_with_fliptypes", "fliptypes")):
        metrics = []
        for m, model in enumerate(MODELS):
            lines, errs, gaps, types = [], [], [], []
            for i, (image_id, path, caption, flips, paraphrases) in enumerate(records):
                # a model's own records: the first half with one preferred flip each, the second half
                # with one paraphrase that moves the score; the unreadable images' flips all preferred
                mine, j = owner[i] == m, i % PER_MODEL
                last = i >= len(records) - 2
                base = round(rng.uniform(0.22, 0.3), 6)
                para = [{"text": t, "sim": round(base + rng.choice([-1, 1]) * (
                    rng.uniform(0.1, 0.3) if mine and not last and j >= PER_MODEL // 2 and k == j % 2
                    else rng.uniform(0, spread[m])), 6)} for k, t in enumerate(paraphrases)]
                fl = [{"text": t, "sim": round(base + (
                    rng.uniform(0.32, 0.5) if mine and last else rng.uniform(0.02, 0.2)
                    if mine and j < PER_MODEL // 2 and k == j % 3 else -rng.uniform(0, 0.1)), 6), "type": kind}
                    for k, (t, kind) in enumerate(flips)]
                lines.append({"line": i + 1, "image_id": image_id, "image_path": path, "caption_index": 0,
                              "caption": caption, "sim": base, "paraphrases": para, "flips": fl})
                errs.append(np.mean([abs(p["sim"] - base) for p in para]))
                gaps += [base - f["sim"] for f in fl]
                types += [f["type"] for f in fl]
            scores = f"{stem}__LGIP_{'fliptypes_' if key == 'fliptypes' else ''}{model}.scores.jsonl"
            with open(os.path.join(folder, scores), "w", encoding="utf-8") as f:
                f.writelines(json.dumps(r) + "\n" for r in lines)
            gaps, types = np.array(gaps), np.array(types)
            run = {"config": {"JSONL_PATH": os.path.join(folder, stem + ".jsonl"), "IMAGE_ROOT": None},
                   "model": {"protocol": "corrected", "type": "siglip" if "siglip" in model else "openclip"},
                   "num_records_in_file": len(records), "num_failed_images": 2,
                   "versions": {"python": "3.11", "numpy": np.__version__}}
            err = float(np.mean(errs))
            m_out = {"model_tag": model, "num_samples": len(records), "scores_file": scores, "run": run}
            figures = {"invariance_error_mean": err, "invariance_error_mean_ci95": [err * 0.9, err * 1.1]}
            pos = float((gaps > 0).mean())
            sens = {"gap_mean": float(gaps.mean()), "gap_mean_ci95": [float(gaps.mean()) - 0.01, float(gaps.mean()) + 0.01],
                    "pos_rate": pos, "pos_rate_ci95": [pos - 0.02, min(1.0, pos + 0.01)]}
            m_out.update(figures)
            if key == "multi":
                m_out.update({"sensitivity_" + k: v for k, v in sens.items()})
            else:
                m_out["global_sensitivity"] = dict(sens, count=len(gaps))
                m_out["by_flip_type"] = {t: {"pos_rate": float((gaps[types == t] > 0).mean()),
                                             "gap_mean": float(gaps[types == t].mean()), "count": int((types == t).sum())}
                                         for t in ("color", "number", "object")}
            metrics.append(m_out)
        suffix = "LGIP_ALL.metrics.json" if key == "multi" else "LGIP_fliptypes.metrics.json"
        with open(os.path.join(folder, f"{stem}__{suffix}"), "w", encoding="utf-8") as f:
            json.dump(metrics, f)
    with open(os.path.join(folder, "nine.jsonl"), "w", encoding="utf-8") as f:
        for image_id, path, caption, _, _ in records:
            f.write(json.dumps({"image_id": image_id, "image_path": path, "orig_captions": [caption]}) + "\n")
    return records


@pytest.fixture(scope="module")
def nine(tmp_path_factory):
    """(folder, its records, report.py's output) for nine models at the default TOP_K."""
    folder = tmp_path_factory.mktemp("nine")
    records = make_inputs(str(folder))
    proc = run_script("report.py", f"--JSONL_PATH={folder / 'nine.jsonl'}")
    return folder, records, proc


def test_page_is_small_self_contained_and_names_unreadable_images(nine):
    folder, _, proc = nine
    page = folder / "nine__LGIP_report.html"
    html = page.read_text(encoding="utf-8")
    assert page.stat().st_size <= MAX_PAGE_BYTES, page.stat().st_size
    assert f"-> {page} (" in proc.stdout and "2 gallery image(s) missing or unreadable" in proc.stdout
    assert "http://" not in html and "https://" not in html and "<link" not in html
    assert html.count('<table id="results">') == 1 and html.count("<tr data-model=") == len(MODELS)
    assert html.count('<article class="card"') == 2 * 10 * len(MODELS)  # top K per model; those over all are among them
    assert "Tom &amp; Jerry&#39;s &lt;b&gt;wall&lt;/b&gt;" in html and "<b>wall" not in html
    for name, why in (("missing.jpg", "image not found"), ("corrupt.jpg", "unreadable image")):
        assert f"<strong>{why}" in html and os.path.join(str(folder), "images", name) in html
    # the markdown, CSV and PNGs are still written beside it
    for name in ("report.md", "report.csv", "frontier.png", "fliptypes.png"):
        assert (folder / f"nine__LGIP_{name}").is_file(), name


def _launch(playwright, profile):
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    return playwright.chromium.launch_persistent_context(str(profile), executable_path=executable, headless=True,
                                                         args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 900})


def test_page_in_chromium(request, tmp_path):
    """One page load, from a folder holding the page alone: every image decoded, no console or page
    error, nothing fetched; a header click sorts the table; flips' changed words in <mark>; filters."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed (pip install -r requirements.txt)")
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        pytest.skip("no Chromium installed (apt-get install -y chromium; .ci/run installs it when missing)")
    folder, _, _ = request.getfixturevalue("nine")  # made only when the browser can run
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    page_path = elsewhere / "page.html"
    shutil.copy(folder / "nine__LGIP_report.html", page_path)
    errors, fetched = [], []
    with sync_api.sync_playwright() as p:
        browser = _launch(p, tmp_path / "profile")
        try:
            page = browser.new_page()
            page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
            page.on("request", lambda r: fetched.append(r.url))
            page.goto(page_path.as_uri(), wait_until="load")
            images = page.evaluate("""() => Promise.all([...document.images].map(img => img.decode().then(
                () => [img.alt, img.naturalWidth], () => [img.alt, 0])))""")
            placeholders = page.eval_on_selector_all(".placeholder", "els => els.map(e => e.textContent)")

            def order():
                return page.eval_on_selector_all("#results tbody tr", "rows => rows.map(r => r.dataset.model)")

            def column(name):
                return page.evaluate("""name => { const th = [...document.querySelectorAll('#results thead th')]
                    .findIndex(h => h.textContent.includes(name));
                    return [...document.querySelectorAll('#results tbody tr')].map(r => parseFloat(r.cells[th].dataset.v)); }""", name)

            before = order()
            page.click("#results thead th:has-text('Inv. error') button")
            ascending, values_up = order(), column("Inv. error")
            page.click("#results thead th:has-text('Inv. error') button")
            descending, values_down = order(), column("Inv. error")
            escaped = page.eval_on_selector_all("#flips .card td.txt b", "els => els.length")
            flips = page.eval_on_selector_all("#flips .card", """cards => cards.map(c => [
                c.querySelector('td.txt').textContent, c.querySelector('td.alt').textContent,
                [...c.querySelectorAll('td.alt mark')].map(m => m.textContent.trim())])""")

            def visible(section):
                return page.eval_on_selector_all(f"#{section} .card:not([hidden])",
                                                 "cards => cards.map(c => [c.dataset.model, c.dataset.type])")

            shown_all = visible("flips")
            shown_all_placeholders = len(page.query_selector_all("#flips .card:not([hidden]) .placeholder"))
            page.click(f"button.f-model[data-model='{MODELS[3]}']")
            shown_model, shown_model_paras = visible("flips"), visible("paraphrases")
            page.click("#flips button.f-type[data-type='color']")
            shown_color = visible("flips")
            status = page.inner_text("#flips .status")
        finally:
            browser.close()
    assert not errors, errors
    assert all(u == page_path.as_uri() or u.startswith("data:") for u in fetched), fetched
    assert len(images) == 2 * 10 * len(MODELS) - 6 + 2  # the thumbnails (six are placeholders) and two figures
    assert all(width > 0 for _, width in images), [alt for alt, width in images if not width]
    assert {t.split("images")[-1] for t in placeholders} == {os.sep + "missing.jpg", os.sep + "corrupt.jpg"}
    assert all(("image not found" in t) == ("missing.jpg" in t) for t in placeholders)
    assert before != ascending and values_up == sorted(values_up) and values_down == sorted(values_down, reverse=True)
    assert descending == ascending[::-1]
    assert len(flips) >= 10 * len(MODELS) and escaped == 0
    assert sum(HTML_WORDS in caption for caption, _, _ in flips) >= 6  # shown as the text it is
    for caption, flip, marks in flips:  # the flip changes one word: that word, and only it, is marked
        changed = [b for a, b in zip(caption.split(), flip.split()) if a != b]
        assert len(caption.split()) == len(flip.split()) and marks == changed and len(marks) == 1, (caption, flip, marks)
    assert len(shown_all) == 10 and shown_all_placeholders == 6  # the two unreadable images' flips head the list
    assert len(shown_model) == 10 and {m for m, _ in shown_model} == {MODELS[3]}
    assert len(shown_model_paras) == 10 and {m for m, _ in shown_model_paras} == {MODELS[3]}
    assert shown_color and {t for _, t in shown_color} == {"color"} and {m for m, _ in shown_color} == {MODELS[3]}
    assert status.startswith(f"{len(shown_color)} shown") and "color flips only" in status


# --- the lgip.report helpers ---

def test_word_marks_compare_position_by_position_or_by_runs():
    from lgip.report import word_marks
    caption, flip = word_marks("a yellow train moving", "a green train moving")
    assert [w["text"] for w in flip if w["changed"]] == ["green"] and [w["text"] for w in caption if w["changed"]] == ["yellow"]
    caption, para = word_marks("Two bicycles parked near a car.", "a photo of Two bicycles parked near a car.")
    assert [w["text"] for w in para if w["changed"]] == ["a", "photo", "of"] and not any(w["changed"] for w in caption)
    caption, para = word_marks("dogs waiting near the wall", "dogs standing close to the wall")
    assert [w["text"] for w in para if w["changed"]] == ["standing", "close", "to"]
    assert [w["text"] for w in caption if w["changed"]] == ["waiting", "near"]
    assert word_marks("", "") == ([], [])


def test_thumbnails_fit_and_unreadable_images_say_why(tmp_path):
    import base64
    import io

    from PIL import Image
    from lgip.report import thumbnail
    Image.new("RGB", (640, 480), (200, 30, 30)).save(tmp_path / "wide.png")
    Image.new("L", (300, 900), 128).save(tmp_path / "tall.png")
    (tmp_path / "bad.jpg").write_bytes(b"not an image")
    for name, size in (("wide.png", (200, 150)), ("tall.png", (67, 200))):
        t = thumbnail(str(tmp_path / name), 200)
        assert (t["width"], t["height"]) == size and t["src"].startswith("data:image/jpeg;base64,")
        with Image.open(io.BytesIO(base64.b64decode(t["src"].split(",", 1)[1]))) as img:
            assert img.size == size and img.mode == "RGB"
    assert thumbnail(str(tmp_path / "none.jpg"), 200) == {"error": "image not found", "path": str(tmp_path / "none.jpg")}
    bad = thumbnail(str(tmp_path / "bad.jpg"), 200)
    assert bad["error"].startswith("unreadable image (") and bad["path"] == str(tmp_path / "bad.jpg")


def test_top_lists_per_model_and_over_all_models_are_the_extremes(tmp_path):
    """scan_scores' lists against a plain sort of every pair: per model and over all models."""
    from lgip.report import scan_scores
    rng = random.Random(3)
    files, pairs = [], []
    for model in ("a", "b", "c"):
        path = tmp_path / f"{model}.scores.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            for i in range(40):
                base = rng.uniform(-0.3, 0.3)
                r = {"image_id": i, "image_path": f"{i}.jpg", "caption_index": 0, "caption": f"cap {i}", "sim": base,
                     "paraphrases": [{"text": f"p{i}{j}", "sim": base + rng.uniform(-0.2, 0.2)} for j in range(3)],
                     "flips": [{"text": f"f{i}{j}", "sim": base + rng.uniform(-0.2, 0.2), "type": "color"} for j in range(3)]}
                f.write(json.dumps(r) + "\n")
                pairs += [(model, "para", abs(p["sim"] - base), p["text"]) for p in r["paraphrases"]]
                pairs += [(model, "flip", fl["sim"] - base, fl["text"]) for fl in r["flips"] if base - fl["sim"] < 0]
        files.append(("multi", model, str(path)))
    tops = scan_scores(files + files[:1], 7)  # a file read twice: its pairs count once

    def top(kind, model=None):
        chosen = [p for p in pairs if p[1] == kind and model in (None, p[0])]
        return [t for *_, t in sorted(chosen, key=lambda p: -p[2])[:7]]

    for model in (None, "a", "b", "c"):
        assert [r["text"] for r in tops.paraphrases[model]] == top("para", model)
        assert [r["text"] for r in tops.flips[model]] == top("flip", model)
    per_model, _ = tops.for_markdown(per_model=True)
    assert list(per_model) == ["a", "b", "c"] and list(tops.for_markdown(per_model=False)[0]) == [None]


def test_topk_keeps_largest_once():
    from lgip.report import TopK
    top = TopK(3)
    for i, score in enumerate([0.1, 0.5, 0.3, 0.5, 0.9, 0.2]):
        top.offer(score, ("k", i), i)
    top.offer(0.95, ("k", 4), "duplicate")  # key already held: ignored
    assert top.rows() == [4, 1, 3]


def test_pareto_front():
    from lgip.report import pareto_front
    assert pareto_front([(0.1, 0.6), (0.2, 0.9), (0.3, 0.8), (0.1, 0.5)]) == [0, 1]
    assert pareto_front([(0.2, 0.5), (0.1, 0.7)]) == [1]
    assert pareto_front([(0.1, 0.5), (0.1, 0.5)]) == [0, 1]  # ties dominate neither


def test_short_labels():
    from lgip.report import short_labels
    labels = short_labels(MODELS + ["tiny_siglip"])
    assert labels["openclip_ViT-H-14_laion2b_s32b_b79k"] == "ViT-H-14 (laion2b)"
    assert labels["openclip_EVA02-L-14_merged2b_s4b_b131k"] == "EVA02-L-14 (merged2b)"
    assert labels["siglip2_google_siglip2-base-patch16-224"] == "siglip2-base-patch16-224"
    assert labels["tiny_siglip"] == "tiny_siglip"
    assert len(set(labels.values())) == len(labels)
    assert short_labels(["openclip_A_x_s1b_b1k", "openclip_A_x_s2b_b2k"]) == \
        {"openclip_A_x_s1b_b1k": "openclip_A_x_s1b_b1k", "openclip_A_x_s2b_b2k": "openclip_A_x_s2b_b2k"}
