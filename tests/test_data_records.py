"""Your own data: every source format reads the same records, token labels follow a hand rule, and bad
input is refused with the value and the fix."""

import json

import numpy as np
import pytest

from beliefscope.tasks.records import load_data
from beliefscope.tasks.sources import read_rows

ROWS = [
    {"id": "a", "text": "The key is in the hall. Tom takes it to the den.", "negated": "no",
     "events": [{"end": 23, "state": "hall"}, {"end": 48, "state": "den"}], "split": "train"},
    {"id": "b", "text": "The cup is in the den. Mia does not move it.", "negated": "yes",
     "events": [{"end": 22, "state": "den"}, {"end": 44, "state": "den"}], "split": "test"},
]


def _formats(tmp_path):
    import datasets
    import pandas as pd

    jsonl = tmp_path / "r.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    df = pd.DataFrame([{**r, "events": json.dumps(r["events"])} for r in ROWS])  # JSON in a CSV cell
    df.to_csv(tmp_path / "r.csv", index=False)
    df.to_parquet(tmp_path / "r.parquet")
    ds = datasets.Dataset.from_list(ROWS)
    ds.save_to_disk(str(tmp_path / "disk"))
    return {"jsonl": str(jsonl), "csv": str(tmp_path / "r.csv"), "parquet": str(tmp_path / "r.parquet"),
            "save_to_disk": str(tmp_path / "disk"), "DataFrame": pd.DataFrame(ROWS), "Dataset": ds, "list": ROWS}


def test_every_source_reads_the_same_records(tmp_path):
    want = load_data(ROWS, label_field=("negated",))
    for name, src in _formats(tmp_path).items():
        got = load_data(src, label_field=("negated",))
        assert [r.text for r in got.records] == [r.text for r in want.records], name
        assert [r.tracks for r in got.records] == [r.tracks for r in want.records], name
        assert got.classes == {"negated": ["no", "yes"], "events": ["den", "hall"]}, name
        assert [r.heldout for r in got.records] == [False, True], name


def _word_tok():
    """A word-level tokenizer with offsets (a word = its letters; '.' its own token), and a BOS."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = sorted({w for r in ROWS for w in r["text"].replace(".", " . ").split()})
    vocab = {"[UNK]": 0, "<s>": 1, **{w: i + 2 for i, w in enumerate(words)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    core.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", bos_token="<s>")


def test_token_labels_follow_the_hand_rule():
    tok = _word_tok()
    data = load_data(ROWS, label_field=("negated",), spans_field=())
    enc = tok(ROWS[0]["text"], return_offsets_mapping=True)
    lab = data.token_labels(0, np.asarray(enc["offset_mapping"]))
    words = tok.convert_ids_to_tokens(enc["input_ids"])
    # hand labels: BOS and the first sentence's words before its '.' see no event (-1); from that '.' on the key is
    # in the hall (class 1), from the second '.' on in the den (class 0)
    first_dot = words.index(".")
    want = [-1] * first_dot + [1] * (len(words) - 1 - first_dot) + [0]
    assert lab["events"].tolist() == want
    assert lab["negated"].tolist() == [-1] * (len(words) - 1) + [0]  # read at the last token only


def test_spans_and_initial_state():
    rows = [{"text": "Tom met Mia in Rome.", "initial": "hall", "events": [{"end": 20, "state": "den"}],
             "spans": [{"start": 0, "end": 3, "label": "PER"}, {"start": 8, "end": 11, "label": "PER"},
                       {"start": 15, "end": 19, "label": "LOC"}]}]
    data = load_data(rows)
    offsets = np.array([[0, 0], [0, 3], [4, 7], [8, 11], [12, 14], [15, 19], [19, 20]])  # <s> Tom met Mia in Rome .
    lab = data.token_labels(0, offsets)
    assert lab["spans"].tolist() == [-1, 1, -1, 1, -1, 0, -1]  # classes sorted: LOC 0, PER 1
    assert lab["events"].tolist() == [1, 1, 1, 1, 1, 1, 0]  # hall (1) before the event, den (0) from its end


BAD = [
    ("missing text field", [{"body": "x", "label": 1}], {"label_field": ("label",)}, "no text field 'text'"),
    ("missing label field", [{"text": "x"}], {"label_field": ("negated",)},
     "no field 'negated' \\(given as --label-field\\)"),
    ("event past the end", [{"text": "abc", "events": [{"end": 9, "state": "a"}]}], {}, "past the end"),
    ("events out of order", [{"text": "abcdef", "events": [{"end": 5, "state": "a"}, {"end": 3, "state": "b"}]}],
     {}, "out of order"),
    ("undeclared class", [{"text": "ab", "label": "c"}], {"label_field": ("label",), "classes": "label=a,b"},
     "not one of the declared classes"),
    ("empty text", [{"text": "  ", "label": "a"}], {"label_field": ("label",)}, "empty or missing"),
    ("duplicate ids", [{"id": 1, "text": "a", "label": "a"}, {"id": 1, "text": "b", "label": "a"}],
     {"label_field": ("label",)}, "share the id"),
]


@pytest.mark.parametrize("case,rows,kw,words", BAD, ids=[b[0] for b in BAD])
def test_bad_records_are_refused_with_the_value(case, rows, kw, words):
    with pytest.raises(ValueError, match=words):
        load_data(rows, **kw)


def test_missing_file_and_unknown_extension(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_rows(str(tmp_path / "nope.jsonl"))
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(ValueError, match="extension"):
        read_rows(str(tmp_path / "x.txt"))
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n{oops\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        read_rows(str(tmp_path / "bad.jsonl"))


def test_boxes_format():
    rows = [{"sentence": "Box 0 contains the car. Move the car from Box 0 to Box 1. Box 1 contains <extra_id_0> .",
             "masked_content": "<extra_id_0> the car", "numops": 1}]
    data = load_data(rows, format="boxes")
    assert data.records[0].text.endswith("Box 1 contains") and data.classes["content"] == ["the car"]
    assert data.records[0].group == "1"


def test_records_with_one_text_share_a_fold_group_and_cannot_straddle_the_split():
    """A user's file with repeated stories: every record with the same text (up to whitespace) joins the first
    one's group, transitively through declared groups, so GroupKFold never trains on a text it scores; a text
    in both a training and a held-out record is refused, naming both."""
    from beliefscope.probes.controls import prompt_folds
    from beliefscope.probes.harvest_data import data_examples

    ev = [{"end": 3, "state": "a"}]
    rows = [{"text": f"s{i % 4} x", "events": ev} for i in range(12)]  # 4 stories, each 3 times
    rows += [{"text": "s0  x", "events": ev},  # s0 again, spaced differently
             {"text": "t1 x", "events": ev, "group": "g"}, {"text": "t2 x", "events": ev, "group": "g"},
             {"text": "t2 x", "events": ev}]  # joins g through its text
    data = load_data(rows)
    groups = [r.group for r in data.records]
    assert groups[:12] == ["0", "1", "2", "3"] * 3 and groups[12] == "0" and groups[13:] == ["g", "g", "g"]
    assert data.shared_texts == 10  # 8 repeats of s0-s3, the spaced s0 and the second t2
    index = [ex.meta["group_index"] for ex in data_examples(data)]
    for train, test in prompt_folds(np.asarray(index), 3):
        seen = {" ".join(data.records[i].text.split()) for i in train}
        assert not seen & {" ".join(data.records[i].text.split()) for i in test}
    held = [{"id": "a", "text": "same", "events": ev}, {"id": "b", "text": "other", "events": ev},
            {"id": "c", "text": "same", "events": ev, "split": "test"}]
    with pytest.raises(ValueError, match=r"record 0 \(id a, training\) and record 2 \(id c, held out\)"):
        load_data(held)
    assert load_data(rows[:4]).shared_texts == 0 and [r.group for r in load_data(rows[:4]).records] == list("0123")


def test_a_label_whose_records_hold_one_class_is_refused_where_it_would_be_scored(tmp_path, capsys):
    """A constant label would read 100% for every probe, forced answer and verdict (the instrument called such a
    model one that "keeps a running state"): forced and instrument refuse it before any model loads, probe before
    any fit; another label of the same store is probed as usual."""
    from beliefscope.cli import main as cli

    from .tiny_llama import tiny_llama_folder

    rooms = ["hall", "den"]
    rows = [{"text": f"The box {i} is in the {rooms[i % 2]}.", "place": [{"end": 20, "state": rooms[i % 2]}],
             "still": [{"end": 20, "state": "box"}]} for i in range(12)]
    path = tmp_path / "one.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = tiny_llama_folder(str(tmp_path / "tiny"), [r["text"] for r in rows])
    said = "every record of label 'still' holds class 'box'"
    q = ["--question", " Where is it? In the", "--quiet"]
    for argv in (["forced", "--model", model, "--data", str(path), "--events-field", "still", *q],
                 ["instrument", "--models", model, "--data", str(path), "--events-field", "still", *q]):
        capsys.readouterr()
        assert cli(argv) == 2 and said in capsys.readouterr().err, argv
    acts = str(tmp_path / "acts")
    assert cli(["harvest", "--model", model, "--data", str(path), "--events-field", "place,still", "--out", acts,
                "--no-random-init", "--quiet"]) == 0
    capsys.readouterr()
    assert cli(["probe", "--acts", acts, "--label", "still", "--folds", "3", "--quiet"]) == 2
    assert said in capsys.readouterr().err
    assert cli(["probe", "--acts", acts, "--label", "place", "--folds", "3", "--quiet"]) == 0


def test_harvest_notes_repeated_texts_and_classes_written_two_ways():
    """What `harvest --data` says before the model loads: how many records repeated a text, and class names
    that are one name up to case and spacing (a probe would treat "Hall" and "hall" as two rooms)."""
    from beliefscope.probes.harvest_data import data_notes

    rows = [{"text": "The box is in the hall.", "events": [{"end": 23, "state": "Hall"}]},
            {"text": "The box is in the hall.", "events": [{"end": 23, "state": "hall"}]},
            {"text": "The box is in the den.", "events": [{"end": 22, "state": "den"}]}]
    notes = data_notes(load_data(rows))
    assert len(notes) == 2 and notes[0].startswith("1 record(s) repeat")
    assert "label 'events' has classes that differ only in case or spacing: ['Hall', 'hall']" in notes[1]
    assert data_notes(load_data(rows[1:])) == []
