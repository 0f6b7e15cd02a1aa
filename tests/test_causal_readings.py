"""An interchange report read into the instrument and the viewer (`analyses.causal_readings`): the table carries the
report's own numbers site by site, the strongest baseline is the larger one, the erasure drop sits at the erased
layer's answer token, and a report of another model is refused."""

import pytest

from beliefscope.analyses.causal_readings import causal_lines, causal_table, iia_by_layer, load_report
from beliefscope.analyses.interchange_report import InterchangeConfig
from beliefscope.analyses.interchange_report import main as interchange_report
from beliefscope.models.load import load_model


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("ic")
    cfg = InterchangeConfig(model="target", n=40, events="3-6", layers="2,3", das_layers="3", das_steps=20,
                            erase_layers="3", out=str(out))
    interchange_report(cfg)
    return out


def test_the_table_carries_the_report_site_by_site(report):
    bridge, _ = load_model("target")
    rep = load_report(str(report), bridge)
    rows = causal_table(rep)
    assert [(r["layer"], r["position"]) for r in rows] == [(s["layer"], s["position"]) for s in rep["sites"]]
    for r, s in zip(rows, rep["sites"]):
        assert r["probe"]["accuracy"] == s["probe"]["accuracy"] and r["verdict"] == s["verdict"]
        assert r["baseline"]["accuracy"] == max(s["majority"]["accuracy"], s["bag_of_words"]["accuracy"])
        assert r["iia_probe"]["accuracy"] == s["iia_probe"]["accuracy"]
        assert (r["iia_das"] is None) == ("iia_das" not in s or s["iia_das"] is None)
        erased = r["layer"] == 3 and r["position"] == "last"
        assert (r["erasure_drop"] is not None) == erased
        if erased:
            assert r["erasure_drop"]["leace"] == rep["erasure"]["3"]["drop_leace"]
    grid = iia_by_layer(rep)
    assert set(grid) == {"last_event", "last"} and len(grid["last"]) == 4 and grid["last"][:2] == [None, None]
    assert grid["last"][3] == next(s["iia_full"]["accuracy"] for s in rep["sites"]
                                   if s["layer"] == 3 and s["position"] == "last")
    lines = causal_lines(rep)
    assert len(lines) == 1 + len(rows) and "LEACE drop" in lines[-1]


def test_a_report_of_another_model_or_no_report_is_refused(report, tmp_path):
    draft, _ = load_model("draft")
    with pytest.raises(ValueError, match="run `beliefscope interchange` on this model"):
        load_report(str(report), draft)
    with pytest.raises(FileNotFoundError, match="no interchange report"):
        load_report(str(tmp_path))
    (tmp_path / "interchange.json").write_text('{"model": "x"}')
    with pytest.raises(ValueError, match="is not an interchange report"):
        load_report(str(tmp_path))


def test_the_instrument_and_the_viewer_carry_the_report(report, tmp_path):
    from beliefscope.analyses.instrument import InstrumentConfig, table_lines
    from beliefscope.analyses.instrument import main as instrument
    from beliefscope.analyses.view import ViewConfig, build

    rep = load_report(str(report))
    res = instrument(InstrumentConfig(models=("target",), n_train=60, n_test=20, bands=((3, 4),), random_init=False,
                                      lens_n=0, interchange=(f"target={report}",)))
    got = res["models"]["target"]["causal_tests"]
    assert got["rows"] == causal_table(rep) and got["iia_by_layer"] == iia_by_layer(rep)
    lines = table_lines(res)
    assert sum("IIA whole" in line and "mass-mean" in line for line in lines) == len(rep["sites"])
    data = build(ViewConfig(models=("target",), events="3-4", n=1, n_train=20, decode="",
                            interchange=(f"target={report}",), out=str(tmp_path / "v.html")))
    assert data["models"][0]["iia"] == iia_by_layer(rep)
    with pytest.raises(ValueError, match="--interchange names \\['draft'\\]"):
        build(ViewConfig(models=("target",), interchange=(f"draft={report}",)))
