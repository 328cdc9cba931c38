"""The issue's finish line for models that score a pair jointly (LGIP_SPEC.md 13): the whole pipeline
(run_all.py on the demo) with a tiny LLaVA, a tiny BLIP ITM and the demo model in one MODELS list, and
its page in Chromium. (A file of its own: the test runs every step, and the two test workers share the
suite's time.)"""

import json
import re
import shutil

import pytest

from test_joint import folders, specs  # noqa: F401 (the tiny models, built once for this file)

PAGE = """() => ({
  rows: [...document.querySelectorAll('#results tbody tr')].map(tr => tr.cells[0].textContent.trim()),
  headers: [...document.querySelectorAll('#results thead th')].map(th => th.textContent.trim()),
  text: document.body.innerText,
  statuses: [...document.querySelectorAll('section.gallery .status')].map(e => e.textContent),
  firstFlips: [...document.querySelectorAll('#flips .card')].filter(c => c.dataset.rankAll)
    .sort((a, b) => a.dataset.rankAll - b.dataset.rankAll).slice(0, 3).map(c => c.dataset.model),
})"""


def test_run_all_with_a_llava_a_blip_and_the_demo_model_writes_a_page_with_all_three(
    tmp_path,
    folders,  # noqa: F811 (test_joint's fixture, imported above)
):
    """The issue's finish line: `run_all.py --DATA=demo` with a tiny LLaVA, a tiny BLIP ITM and the demo model
    in one MODELS list completes (retrieval and explain leaving the scorers out, in a line each; the image
    side giving their paraphrase and flip figures), and its page, in Chromium, shows all three with their score
    kinds, the Inv. rel. column and the note that the kinds' units differ."""
    from test_run_all import demo_inputs
    from conftest import run_script

    folder = demo_inputs(tmp_path / "demo")
    models = specs(folders) + ["demo"]
    proc = run_script(
        "run_all.py",
        f"--DEMO_JSONL={folder / 'lgip_demo.jsonl'}",
        "--DATA=demo",
        f"--MODELS={models!r}",
        "--DEVICE=cpu",
        "--NUM_WORKERS=0",
        "--SETTINGS={'BOOTSTRAP': 20}",
    )
    for step in ("run_lgip_retrieval.py", "explain_flips.py"):
        assert f"{step}: model 'llava' (type 'generative') is left out" in proc.stdout, step
    assert "llava: scores a pair jointly: its image paraphrase and flip figures only" in proc.stdout
    rows = json.load(open(folder / "lgip_demo_with_perturb__LGIP_ALL.metrics.json"))
    assert [r["score_kind"] for r in rows] == ["logprob", "itm_logodds", "cosine"]
    page = folder / "lgip_demo__LGIP_report.html"
    md = (folder / "lgip_demo__LGIP_report.md").read_text(encoding="utf-8")
    assert "| llava (logprob) " in md and "| blip (itm_logodds) " in md and "| demo_tiny_random (cosine) " in md
    # each gallery card labels its score as its model's kind scores: a log-probability is not a "sim"
    html = page.read_text(encoding="utf-8")
    labels = {"llava": ("log p", "log p(image, caption)"), "blip": ("ITM", "itm(image, caption)"),
              "demo_tiny_random": ("sim", "sim(image, caption)")}  # fmt: skip
    for model, (short, formula) in labels.items():
        cards = re.findall(rf'<article class="card"[^>]*data-model="{model}".*?</article>', html, re.S)
        assert cards and all(f">{short}</th>" in c and f'title="{formula}"' in c for c in cards), model
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright not installed (pip install -r requirements-test.txt)"
    )
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        pytest.skip("no Chromium installed (apt-get install -y chromium; .ci/run installs it when missing)")
    from test_report_page import _launch

    with sync_api.sync_playwright() as p:
        browser = _launch(p, tmp_path / "profile")
        try:
            tab = browser.new_page()
            tab.goto(page.as_uri(), wait_until="load")
            seen = tab.evaluate(PAGE)
        finally:
            browser.close()
    assert seen["rows"][:3] == ["llava (logprob)", "blip (itm_logodds)", "demo_tiny_random (cosine)"], seen["rows"]
    assert any(h.startswith("Inv. rel.") for h in seen["headers"]), seen["headers"]
    assert "The models score in 3 kinds (logprob, itm_logodds, cosine, beside each name)" in seen["text"]
    # the galleries do not rank a logprob gap against a cosine gap: each model's top in turn, and they say so
    assert sorted(seen["firstFlips"]) == ["blip", "demo_tiny_random", "llava"], seen["firstFlips"]
    assert "over all models, each model's in turn (their scores differ in kind)" in seen["statuses"][0], seen[
        "statuses"
    ]
