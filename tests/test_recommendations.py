"""Every method a verdict recommends is accepted by ``calmon fit`` for every kind of data (issue #32, finding 1)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from calmon.cli import main as cli_main
from calmon.evaluate.verdict import RECOMMENDED, RECOMMENDED_METHODS


def _write(path: Path, kind: str, n: int = 3000) -> Path:
    rng = np.random.default_rng(7)
    if kind == "top-label":  # a CSV of top-label confidence and correctness
        conf = rng.uniform(0.3, 1.0, n)
        correct = (rng.uniform(size=n) < conf ** 2).astype(int)
        path.write_text("id,confidence,correct\n" + "".join(f"i{i},{c},{y}\n" for i, (c, y) in
                                                             enumerate(zip(conf, correct))))
        return path
    with path.open("w") as f:
        for i in range(n):
            if kind == "binary":
                z = float(rng.uniform(0.02, 0.98))
                rec = {"id": f"i{i}", "model": "m", "score": z ** 0.5, "label": int(rng.uniform() < z)}
            else:
                logits = 3 * rng.normal(size=4)
                p = np.exp(logits) / np.exp(logits).sum()
                lab = int(rng.choice(4, p=np.exp(logits / 3) / np.exp(logits / 3).sum()))
                rec = {"id": f"i{i}", "model": "m", "probs": p.tolist(), "label": lab}
            f.write(json.dumps(rec) + "\n")
    return path


def test_every_direction_names_its_methods() -> None:
    assert set(RECOMMENDED) == set(RECOMMENDED_METHODS)
    for direction, methods in RECOMMENDED_METHODS.items():
        for m in methods:
            assert m.split("-")[0] in RECOMMENDED[direction].lower().replace(" scaling", "").replace(
                "isotonic regression", "isotonic").replace("histogram binning", "histogram"), (direction, m)


@pytest.mark.parametrize("kind", ["binary", "multiclass", "top-label"])
@pytest.mark.parametrize("direction", sorted(RECOMMENDED_METHODS))
def test_fit_accepts_every_recommended_method(tmp_path: Path, kind: str, direction: str) -> None:
    data = _write(tmp_path / (f"{kind}.csv" if kind == "top-label" else f"{kind}.jsonl"), kind)
    for method in RECOMMENDED_METHODS[direction]:
        out = tmp_path / f"{method}.json"
        assert cli_main(["fit", str(data), "--method", method, "-o", str(out)]) == 0, (kind, method)
        doc = json.loads(out.read_text())
        assert doc["method"] == method
        # temperature takes the kind of its data; the others are binary methods (top-label confidence)
        assert doc["kind"] == ("multiclass" if kind == "multiclass" and method == "temperature" else "binary")
        applied = tmp_path / f"{method}.out.csv"
        assert cli_main(["apply", str(out), str(data), "-o", str(applied)]) == 0
