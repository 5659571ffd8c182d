"""#32.10: the Python API answers what the command line answers on the same rows in a file.

``calmon.check(data).to_dict()`` == ``calmon check --json FILE``; ``calmon.fit(...).save`` == ``calmon fit -o``;
``.predict`` == ``calmon apply``. Plus scikit-learn style input errors and the notebook view.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import calmon
from calmon.cli import main as cli


def cli_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert cli(argv) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def binary_rows(n: int = 1500, seed: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    z = rng.uniform(0.02, 0.98, n)
    y = rng.uniform(size=n) < z ** 1.5  # over-confident: a verdict to reach
    return {"id": np.array([f"r{i}" for i in range(n)]), "score": z, "label": y}


def multiclass_rows(n: int = 1500, k: int = 4, seed: int = 4) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, k)) * 2.0
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    truth = np.exp(logits / 1.6) / np.exp(logits / 1.6).sum(axis=1, keepdims=True)
    labels = np.array([rng.choice(k, p=t) for t in truth])
    return {"id": np.array([f"r{i}" for i in range(n)]), "probs": p, "label": labels}


def write_jsonl(path: Path, rows: dict[str, np.ndarray], model: str = "churn") -> None:
    with path.open("w") as f:
        for i in range(len(rows["label"])):
            ev: dict[str, Any] = {"type": "labeled", "id": str(rows["id"][i]), "model": model,
                                  "label": int(rows["label"][i])}
            if "score" in rows:
                ev["score"] = float(rows["score"][i])
            else:
                ev["probs"] = [float(v) for v in rows["probs"][i]]
            f.write(json.dumps(ev) + "\n")


class Frame:
    """A minimal DataFrame (``.columns`` + column access + ``Series.to_numpy``): what pandas and polars offer."""

    class Series:
        def __init__(self, values: Any) -> None:
            self.values = values

        def to_numpy(self) -> np.ndarray:
            return np.asarray(self.values)

    def __init__(self, columns: dict[str, Any]) -> None:
        self._cols = columns

    @property
    def columns(self) -> list[str]:
        return list(self._cols)

    def __getitem__(self, name: str) -> Frame.Series:
        return Frame.Series(self._cols[name])


def test_check_binary_equals_the_cli_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = binary_rows()
    path = tmp_path / "preds.jsonl"
    write_jsonl(path, rows)
    want = cli_json(capsys, ["check", "--json", str(path), "--mc", "300"])
    frame = Frame({"id": rows["id"], "model": ["churn"] * len(rows["id"]), "score": rows["score"],
                   "label": rows["label"]})
    got = calmon.check(frame, mc=300, source=str(path))
    assert got.to_dict() == want
    assert want["summary"]["calibrated"] is False  # a verdict, not just metrics, was compared
    assert got.calibrated is False and got.verdict == want["summary"]["text"]
    assert got.metrics == want["metrics"] and got.tests == want["tests"] and got.n == len(rows["id"])
    # the same rows as a dict of arrays with the model named: the same document
    assert calmon.check(rows, model="churn", mc=300, source=str(path)).to_dict() == want
    assert json.loads(got.to_json()) == want


def test_check_multiclass_equals_the_cli_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = multiclass_rows()
    path = tmp_path / "preds.jsonl"
    write_jsonl(path, rows, model="intent")
    argv = ["check", "--json", str(path), "--tests", "tcal,smce", "--alpha", "0.01", "--reliability-bins", "16",
            "--mc", "300"]
    want = cli_json(capsys, argv)
    got = calmon.check({"id": rows["id"], "label": rows["label"],
                        **{f"p{k}": rows["probs"][:, k] for k in range(4)}},  # the CSV layout's columns
                       model="intent", tests=["tcal", "smce"], alpha=0.01, reliability_bins=16, mc=300,
                       source=str(path))
    assert want["kind"] == "multiclass" and want["classes"] == 4
    assert got.to_dict() == want
    # a column of vectors, as a DataFrame holds lists
    vectors = Frame({"probs": np.array(list(rows["probs"]), dtype=object), "label": rows["label"]})
    doc = calmon.check(vectors, model="intent", tests="tcal,smce", alpha=0.01, reliability_bins=16, mc=300,
                       source=str(path)).to_dict()
    assert doc == want


def test_check_csv_without_model_and_metrics_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = binary_rows(400)
    path = tmp_path / "s.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["score", "label"])
        w.writerows([repr(float(z)), int(y)] for z, y in zip(rows["score"], rows["label"]))
    want = cli_json(capsys, ["check", "--json", "--tests", "none", str(path)])
    got = calmon.check(score=rows["score"], label=rows["label"], tests="none", source=str(path))
    assert got.to_dict() == want and got.calibrated is None and got.tests == {}


def test_check_with_reference_equals_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old, new = binary_rows(800, seed=5), binary_rows(800, seed=6)
    write_jsonl(tmp_path / "old.jsonl", old)
    write_jsonl(tmp_path / "new.jsonl", new)
    want = cli_json(capsys, ["check", "--json", "--tests", "none", "--permutations", "99",
                             str(tmp_path / "new.jsonl"), "--reference", str(tmp_path / "old.jsonl")])
    got = calmon.check(new, model="churn", tests="none", reference=old, source=str(tmp_path / "new.jsonl"))
    doc = got.to_dict()
    assert doc["reference"].pop("input") == "<reference>"
    want["reference"].pop("input")
    doc["reference"]["permutations"] = want["reference"]["permutations"]  # --permutations is not an API option
    assert {k: v for k, v in doc.items() if k != "reference"} == {k: v for k, v in want.items() if k != "reference"}
    assert doc["reference"]["decision"] == want["reference"]["decision"]


def _without_volatile(doc: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in doc.items() if k != "created_at"}
    out["training"] = {k: v for k, v in doc["training"].items() if k != "input"}
    return out


@pytest.mark.parametrize(("kind", "method", "options"), [
    ("binary", "platt", {}),
    ("binary", "isotonic", {}),
    ("multiclass", "temperature", {}),
    ("multiclass", "platt", {}),  # a binary method on multiclass data: the top-label confidence
])
def test_fit_save_and_predict_equal_calmon_fit_and_apply(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         kind: str, method: str, options: dict[str, Any]) -> None:
    rows = binary_rows() if kind == "binary" else multiclass_rows()
    path = tmp_path / "train.jsonl"
    write_jsonl(path, rows)
    assert cli(["fit", "-m", method, "--holdout", "0.25", str(path), "-o", str(tmp_path / "cli.json")]) == 0
    cal = calmon.fit(rows, method=method, model="churn", holdout=0.25, **options)
    cal.save(tmp_path / "api.json")
    cli_doc = json.loads((tmp_path / "cli.json").read_text())
    api_doc = json.loads((tmp_path / "api.json").read_text())
    assert _without_volatile(api_doc) == _without_volatile(cli_doc)
    assert cal.evaluation == cli_doc["evaluation"]
    # predict == calmon apply (CSV output: repr floats, exact)
    assert cli(["apply", str(tmp_path / "api.json"), str(path), "-o", str(tmp_path / "out.csv")]) == 0
    with (tmp_path / "out.csv").open() as f:
        table = list(csv.DictReader(f))
    x = rows["score"] if kind == "binary" else rows["probs"]
    got = cal.predict(x)
    if got.ndim == 2:
        want = np.array([[float(r[f"p{k}"]) for k in range(got.shape[1])] for r in table])
    else:
        want = np.array([float(r["score" if kind == "binary" else "confidence"]) for r in table])
    np.testing.assert_array_equal(got, want)
    # and the saved document loads back to the same map
    np.testing.assert_array_equal(calmon.load_calibrator(tmp_path / "api.json").predict(x), got)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"score": [0.1, 0.2, 0.3], "label": [0, 1]},
     r"^Found input variables with inconsistent numbers of samples: \[score: 3, label: 2\]$"),
    ({"score": [0.1, float("nan"), 0.3], "label": [0, 1, 1]}, r"^Input score contains NaN \(first at row 1\)$"),
    ({"score": [0.1, 1.2], "label": [0, 1]}, r"^score must be probabilities in \[0, 1\]: row 1 is 1\.2$"),
    ({"score": [0.1, 0.8], "label": [0, 2]}, r"^label must be 0/1 or booleans for binary scores: row 1 is 2$"),
    ({"probs": [[0.5, 0.4, 0.0], [0.2, 0.3, 0.5]], "label": [0, 2]},
     r"^probs rows must sum to 1 \(within 0\.001\): row 0 sums to 0\.9$"),
    ({"probs": [[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]], "label": [0, 3]},
     r"^label must be a class index in \[0, 3\) \(one per probs column\): row 1 is 3$"),
    ({"score": [0.1], "probs": [[0.5, 0.5]], "label": [0]},
     r"^pass score \(binary\) or probs \(multiclass\), not both$"),
    ({"score": [], "label": []}, r"^Found array with 0 sample\(s\)"),
])
def test_check_refuses_bad_arrays_in_one_line(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        calmon.check(**kwargs)


def test_check_names_missing_columns_and_several_models() -> None:
    with pytest.raises(ValueError, match=r"^data has no column 'y_true' for label \(columns: p, y\); "
                                         r"pass label='<column>'$"):
        calmon.check({"p": [0.2], "y": [1]}, score="p", label="y_true")
    with pytest.raises(ValueError, match=r"^data has neither a score column .* columns: p, y\. Pass score="):
        calmon.check({"p": [0.2], "y": [1]}, label="y")
    with pytest.raises(ValueError, match=r"^data holds 2 models \(a, b\): pass model='\.\.\.' to check one$"):
        calmon.check({"model": ["a", "b"], "score": [0.2, 0.4], "label": [0, 1]})
    with pytest.raises(TypeError, match="data must be a DataFrame"):
        calmon.check(np.zeros((3, 2)))
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        calmon.check({"score": [0.2], "label": [1]}, bogus=1)  # type: ignore[call-arg]


def test_fit_refuses_a_method_for_other_data_and_predict_checks_shapes() -> None:
    rows = binary_rows(300)
    with pytest.raises(ValueError, match="needs multiclass probabilities"):
        calmon.fit(rows, method="lp")
    cal = calmon.fit(rows, method="platt")
    with pytest.raises(ValueError, match=r"^Input contains NaN or infinity \(first at row 1\)$"):
        cal.predict([0.2, float("nan")])
    mc = calmon.fit(multiclass_rows(300), method="temperature")
    with pytest.raises(ValueError, match="multiclass calibrator: pass probabilities"):
        mc.predict([0.2, 0.3])


def test_repr_html_shows_verdict_tables_and_the_diagram() -> None:
    pytest.importorskip("matplotlib")
    r = calmon.check(binary_rows(600), tests="smce", mc=100)
    page = r._repr_html_()
    assert r.verdict.split(";")[0] in page and "<svg" in page and "<td>smce</td>" in page
    assert repr(r).splitlines()[1].strip().startswith("verdict:")


def test_repr_html_without_matplotlib_is_the_tables_and_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    class Blocker:
        def find_spec(self, name: str, path: object = None, target: object = None) -> None:
            if name.partition(".")[0] == "matplotlib":
                raise ModuleNotFoundError(name=name)

    for mod in list(sys.modules):
        if mod.partition(".")[0] == "matplotlib" or mod.startswith("calmon.report"):
            monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setattr(sys, "meta_path", [Blocker(), *sys.meta_path])
    r = calmon.check(binary_rows(300), tests="none")
    page = r._repr_html_()
    assert "<svg" not in page and "<table>" in page and "ece" in page
    assert "calmon report needs matplotlib: pip install &#x27;calmon[report]&#x27;" in page


def test_pandas_and_polars_dataframes_when_installed() -> None:
    pd = pytest.importorskip("pandas")  # both are in the test extra; neither is a dependency of calmon
    pl = pytest.importorskip("polars")
    rows, mc = binary_rows(500), multiclass_rows(500)
    want = calmon.check(rows, tests="none", source="x").to_dict()
    want_mc = calmon.check(mc, tests="none", source="x").to_dict()
    for frame in (pd.DataFrame, pl.DataFrame):
        assert calmon.check(frame({"score": rows["score"], "label": rows["label"]}), tests="none",
                            source="x").to_dict() == want
        lists = frame({"probs": mc["probs"].tolist(), "label": mc["label"]})  # a column of vectors
        assert calmon.check(lists, tests="none", source="x").to_dict() == want_mc
    labels = pd.Series(rows["label"], dtype="boolean")
    labels[3] = pd.NA
    with pytest.raises(ValueError, match=r"^Input label contains missing values \(first at row 3\)$"):
        calmon.check(pd.DataFrame({"score": rows["score"], "label": labels}))


@pytest.mark.parametrize("kind", ["binary", "multiclass"])
def test_check_of_two_frames_joins_them_as_the_cli_joins_two_files(tmp_path: Path, kind: str,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Predictions and outcomes in two frames (#32 left it out: "join them first"): joined by id as
    ``calmon check predictions.jsonl outcomes.jsonl`` joins the files -- shuffled outcomes, outcomes with and
    without model and time, a prediction never labelled, an orphan outcome, a repeated id."""
    rows = binary_rows(1200) if kind == "binary" else multiclass_rows(1200)
    n = len(rows["label"])
    rng = np.random.default_rng(7)
    ts = 1.76e9 + np.arange(n, dtype=float)
    order = rng.permutation(n - 1)  # the last prediction gets no outcome
    out_ids = np.append(rows["id"][order], ["ghost", rows["id"][order[0]]])  # an orphan and a repeated outcome
    out_labels = np.append(rows["label"][order].astype(int), [1, int(rows["label"][order[0]])])
    out_ts = np.append(ts[order] + 60.0, [ts[0], ts[order[0]] + 61.0])
    with_model = rng.uniform(size=len(out_ids)) < 0.5
    preds, outs = tmp_path / "preds.jsonl", tmp_path / "outs.jsonl"
    with preds.open("w") as f:
        for i in range(n):
            ev: dict[str, Any] = {"type": "prediction", "id": str(rows["id"][i]), "model": "m", "ts": ts[i]}
            if kind == "binary":
                ev["score"] = float(rows["score"][i])
            else:
                ev["probs"] = [float(v) for v in rows["probs"][i]]
            f.write(json.dumps(ev) + "\n")
    with outs.open("w") as f:
        for i in range(len(out_ids)):
            ev = {"type": "outcome", "id": str(out_ids[i]), "label": int(out_labels[i]), "ts": out_ts[i]}
            if with_model[i]:
                ev["model"] = "m"
            f.write(json.dumps(ev) + "\n")
    want = cli_json(capsys, ["check", "--json", str(preds), str(outs), "--mc", "300", "--skip-invalid"])
    pred_frame: dict[str, Any] = {"id": rows["id"], "model": ["m"] * n, "ts": ts.astype("datetime64[s]")}
    if kind == "binary":
        pred_frame["score"] = rows["score"]
    else:
        pred_frame.update({f"p{k}": rows["probs"][:, k] for k in range(rows["probs"].shape[1])})
    out_frame = Frame({"id": out_ids, "label": out_labels, "ts": out_ts,
                       "model": np.where(with_model, "m", "m")})
    got = calmon.check(Frame(pred_frame), out_frame, mc=300).to_dict()
    assert want["n"] == n - 1 and got["n"] == n - 1
    assert {k: v for k, v in got.items() if k != "input"} == {k: v for k, v in want.items() if k != "input"}
    # the join's counts: a prediction still waiting; the orphan and the repeat (its prediction already joined)
    ds = calmon.check(Frame(pred_frame), {"id": out_ids, "label": out_labels}, mc=300).dataset
    assert (ds.joined, ds.unjoined_predictions, ds.orphan_outcomes) == (n - 1, 1, 2)


def test_check_of_two_frames_names_the_frame_row_and_field() -> None:
    preds = {"id": ["a", "b", "c"], "score": [0.2, 0.9, 0.6]}
    with pytest.raises(ValueError, match=r"^<outcomes>: row 2: label_range: "):
        calmon.check(preds, {"id": ["a", "b"], "label": [1, 7]})
    with pytest.raises(ValueError, match=r"^<predictions>: row 3: out_of_range: score must lie in \[0, 1\]"):
        calmon.check({"id": ["a", "b", "c"], "score": [0.2, 0.9, 1.6]}, {"id": ["a"], "label": [1]})
    with pytest.raises(ValueError, match=r"^predictions: data has no column 'id' for id"):
        calmon.check({"score": [0.2]}, {"id": ["a"], "label": [1]})


def test_check_of_two_frames_takes_probs_as_columns_vectors_or_an_array() -> None:
    """Multiclass predictions in each of the forms ``to_dataset`` takes give the same joined result."""
    rows = multiclass_rows(600)
    p, ids = rows["probs"], rows["id"]
    outs = {"id": ids[::-1], "label": rows["label"][::-1]}
    docs = [calmon.check({"id": ids, **{f"p{k}": p[:, k] for k in range(4)}}, outs, tests="none").to_dict(),
            calmon.check(Frame({"id": ids, "probs": np.array(list(p), dtype=object)}), outs, tests="none").to_dict(),
            calmon.check({"id": ids}, outs, probs=p, tests="none").to_dict()]
    assert docs[0]["n"] == 600 and docs[0]["kind"] == "multiclass"
    assert docs[1] == docs[0] and docs[2] == docs[0]
