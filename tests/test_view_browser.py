"""The viewer in a real browser (headless Chromium through Selenium): hover and keyboard focus show
what the page's JSON says, the layer control recolours the tokens with that layer's numbers, the
screenshot is not blank, and the page makes no network request.

Needs Debian's ``chromium`` and ``chromium-driver`` and the ``selenium`` package (``make test``
installs them when it can); without them these tests skip with the reason.
"""

import io
import json

import pytest

from .helpers import browser_parts
from .viewpages import page

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def browser():
    parts, why = browser_parts()
    if parts is None:
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = parts[0]
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,900",
              "--disable-extensions", "--no-first-run", "--disable-background-networking"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    drv = webdriver.Chrome(service=Service(parts[1]), options=opts)
    yield drv
    drv.quit()


def _open(browser, tmp_path_factory, task="coinflip"):
    data, text = page(task)
    path = tmp_path_factory.mktemp("view") / "view.html"
    path.write_text(text)
    browser.get(path.as_uri())
    assert browser.execute_script("return document.body.dataset.ready") == "1"
    return data, path


def _hover(browser, el):
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(browser).move_to_element(el).perform()


def _tok(browser, s, m, t):
    return browser.find_element("css selector", f'.tok[data-s="{s}"][data-m="{m}"][data-t="{t}"]')


def _ramp(stops, x):
    """The page's colour for P(first state) = x: the same linear interpolation, in Python."""
    f = min(max(x, 0), 1) * (len(stops) - 1)
    i = min(int(f), len(stops) - 2)
    a, b = [[int(h[j:j + 2], 16) for j in (1, 3, 5)] for h in stops[i:i + 2]]
    return "rgb(" + ", ".join(str(round(u + (v - u) * (f - i))) for u, v in zip(a, b)) + ")"


def _text(browser, id_):
    return browser.find_element("id", id_).text


@pytest.mark.slow
def test_hover_shows_the_json(browser, tmp_path_factory):
    data, _ = _open(browser, tmp_path_factory)
    names = data["state_names"]
    for mi, m in enumerate(data["models"]):
        panel = data["stories"][1]["models"][m["name"]]
        for t in (panel["boundaries"][1], panel["boundaries"][1] - 1, len(panel["tokens"]) - 1):
            el = _tok(browser, 1, mi, t)
            _hover(browser, el)
            assert _text(browser, "ins-truth") == names[panel["truth"][t]]
            shown = [r.text.split()[-1] for r in browser.find_elements("css selector", "#ins-layers tr")]
            assert shown == [f"{panel['p'][r][t][0]:.3f}" for r in range(len(m["layers"]))]
            # every layer's logit-lens answer beside the probe (none for the embedding row), and where it is readable
            cells = [c.text for c in browser.find_elements("css selector", "#ins-layers td.lens")]
            assert cells == [f"lens {names[panel['lens'][t][b]]}" if b >= 0 else "" for b in m["layers"]]
            frm = panel["lens_from"][t]
            assert _text(browser, "ins-lens") == ("the model\u2019s answer is not readable here" if frm is None else
                                                  f"{names[panel['lens'][t][-1]]} readable from block {frm}")
            assert el.value_of_css_property("background-color").replace("rgba", "rgb").replace(", 1)", ")") == \
                _ramp(data["belief_colours"], panel["p"][m["best"]][t][0])
            if t in panel["boundaries"]:
                j = panel["boundaries"].index(t)
                f = panel["forced"][j]
                k = max(range(len(f)), key=f.__getitem__)
                assert _text(browser, "ins-forced") == f"{names[k]} (P {f[k]:.3f})"
                if m["thinking"]:
                    assert _text(browser, "ins-thought") == names[panel["thought"][j]]
            else:
                assert "not an event boundary" in _text(browser, "ins-forced")


def test_hover_shows_each_blocks_interchange_accuracy(browser, tmp_path_factory):
    """With an interchange report (`view --interchange`), every block's row of the hover shows its IIA at the
    hovered token's position rule: event:j at boundary j, last_event at the last boundary, last at the last token,
    nothing elsewhere (values are the page JSON's, here set by hand so that every cell differs)."""
    import copy

    from beliefscope.analyses.view_page import render

    data = copy.deepcopy(page("coinflip")[0])
    m = data["models"][1]  # target: a plain model
    n = 1 + max(m["layers"])
    m["iia"] = {"event:0": [0.1 + b / 100 for b in range(n)], "last_event": [0.2 + b / 100 for b in range(n)],
                "last": [0.3 + b / 100 for b in range(n)]}
    path = tmp_path_factory.mktemp("view-iia") / "view.html"
    path.write_text(render(data))
    browser.get(path.as_uri())
    assert browser.execute_script("return document.body.dataset.ready") == "1"
    panel = data["stories"][0]["models"][m["name"]]
    want = {panel["boundaries"][0]: "event:0", panel["boundaries"][-1]: "last_event", len(panel["tokens"]) - 1: "last",
            panel["boundaries"][0] + 1: None}
    for t, rule in want.items():
        _hover(browser, _tok(browser, 0, 1, t))
        cells = [c.text for c in browser.find_elements("css selector", "#ins-layers td.iia")]
        assert cells == [("" if rule is None or b < 0 else f"IIA {m['iia'][rule][b]:.3f}") for b in m["layers"]], t


def test_layer_control_and_keyboard(browser, tmp_path_factory):
    from selenium.webdriver.common.keys import Keys

    data, _ = _open(browser, tmp_path_factory)
    m = data["models"][0]
    panel = data["stories"][0]["models"][m["name"]]
    slider = browser.find_element("id", "layer-0")
    slider.click()
    slider.send_keys(Keys.HOME)  # the embedding
    assert _text(browser, "layer-name-0") == "embedding"
    for r in range(len(m["layers"])):
        assert int(slider.get_attribute("value")) == r
        for t in (0, panel["boundaries"][0]):
            bg = _tok(browser, 0, 0, t).value_of_css_property("background-color")
            assert bg.replace("rgba", "rgb").replace(", 1)", ")") == _ramp(data["belief_colours"], panel["p"][r][t][0])
        slider.send_keys(Keys.ARROW_RIGHT)
    # keyboard: focus a token, move right and down (to the other model), change its layer with [ and ]
    first = _tok(browser, 0, 0, 0)
    first.click()
    first.send_keys(Keys.ARROW_RIGHT)
    act = browser.switch_to.active_element
    assert (act.get_attribute("data-m"), act.get_attribute("data-t")) == ("0", "1")
    act.send_keys(Keys.ARROW_DOWN)
    act = browser.switch_to.active_element
    assert (act.get_attribute("data-m"), act.get_attribute("data-t")) == ("1", "1")
    assert _text(browser, "ins-title").startswith(data["models"][1]["name"])
    before = int(browser.find_element("id", "layer-1").get_attribute("value"))
    act.send_keys("[")
    want = max(0, before - 1)
    assert int(browser.find_element("id", "layer-1").get_attribute("value")) == want
    cur = browser.find_element("css selector", "#ins-layers tr.cur")
    assert cur.get_attribute("data-layer") == str(want)


def test_decode_trace_shows_provenance(browser, tmp_path_factory):
    data, _ = _open(browser, tmp_path_factory)
    r = data["decode"]["stories"][0]
    names = {int(k): v["name"] for k, v in data["provenance"].items()}
    for i in (0, r["prompt_len"] - 1, r["prompt_len"] + 1):
        _hover(browser, browser.find_element("css selector", f'.tok[data-d="0"][data-t="{i}"]'))
        assert _text(browser, "ins-provenance") == names[r["provenance"][i]]
        k = r["step_of"][i]
        if k >= 0:
            assert _text(browser, "ins-drafted") == " ".join(r["steps"][k]["drafted"])
            assert _text(browser, "ins-accepted") == str(r["steps"][k]["accepted"])
    steps = browser.find_elements("css selector", '#decode .step')
    assert len(steps) == sum(len(s["steps"]) for s in data["decode"]["stories"])
    rej = steps[0].find_elements("css selector", ".chip.rej")
    assert len(rej) == len(r["steps"][0]["rejected"])


def test_n_way_legend_and_hover(browser, tmp_path_factory):
    data, _ = _open(browser, tmp_path_factory, "cups")
    sw = browser.find_elements("css selector", "#states .sw")
    assert [s.text for s in sw] == data["state_names"]
    panel = data["stories"][0]["models"]["thinking-cups"]
    t = panel["boundaries"][-1]
    _hover(browser, _tok(browser, 0, 0, t))
    d = panel["p"][data["models"][0]["best"]][t]
    k = max(range(len(d)), key=d.__getitem__)
    assert _text(browser, "ins-probe") == f"{data['state_names'][k]} {d[k]:.3f}"
    assert _text(browser, "ins-truth") == data["state_names"][panel["truth"][t]]


def test_screenshot_not_blank_and_no_network(browser, tmp_path_factory):
    from PIL import Image

    browser.get_log("performance")  # drop what earlier pages logged
    _, path = _open(browser, tmp_path_factory)
    _hover(browser, _tok(browser, 0, 0, 3))
    png = browser.get_screenshot_as_png()
    (path.parent / "view.png").write_bytes(png)
    img = Image.open(io.BytesIO(png)).convert("RGB")
    colours = img.getcolors(maxcolors=1 << 20)
    assert len(colours) > 50  # tokens in many belief colours, text, the legend
    white = sum(n for n, c in colours if min(c) > 245)
    assert white < 0.9 * img.width * img.height
    urls = []
    for entry in browser.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg["method"] == "Network.requestWillBeSent":
            urls.append(msg["params"]["request"]["url"])
    assert urls and all(u == path.as_uri() for u in urls), urls  # the page itself, nothing else
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
