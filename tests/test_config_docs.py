"""docs/configuration.md is generated from the config models (scripts/gen_config_docs.py): every
goal and run-config field has a description, and the committed page is what the script writes.

    .venv/bin/python -m pytest tests/test_config_docs.py -q
    .venv/bin/python scripts/gen_config_docs.py          # after changing a field: rewrite the page
"""
from __future__ import annotations

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_config_docs", ROOT / "scripts" / "gen_config_docs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_config_field_has_a_description():
    gen = _generator()
    rows = [r for _, _, rows in gen.documents() for r in rows]
    assert len(rows) > 100, len(rows)            # the walk reaches the nested sections
    assert {"target.threshold", "swarm.backtest.horizon_steps", "recipe.lr", "harness.sampling.temperature",
            "perturbations[].at_step"} <= {path for _, path, *_ in rows}
    missing = gen.undescribed()
    assert not missing, f"fields without Field(description=...): {', '.join(missing)}"


def test_committed_page_matches_the_generator():
    gen = _generator()
    page = ROOT / "docs" / "configuration.md"
    assert page.is_file(), "docs/configuration.md is missing: run scripts/gen_config_docs.py"
    assert page.read_text(encoding="utf-8") == gen.render(), \
        "docs/configuration.md is out of date: run .venv/bin/python scripts/gen_config_docs.py"


def test_the_check_fails_on_a_stale_page(tmp_path, monkeypatch):
    gen = _generator()
    monkeypatch.setattr(gen, "OUT", tmp_path / "configuration.md")
    (tmp_path / "configuration.md").write_text(gen.render().replace("peak learning rate", "learning rate"))
    assert gen.main(["--check"]) == 1
    (tmp_path / "configuration.md").write_text(gen.render())
    assert gen.main(["--check"]) == 0
