"""The one home of dotted config paths (trainer/config.py): get / put / del on nested dicts,
`set_dotted` on a RunConfig, `apply_changes` on recipe/harness dicts. Each error names the key.

    .venv/bin/python -m pytest tests/test_dotted.py -q
"""
from __future__ import annotations

import pytest

from trainer.config import (ConfigError, RunConfig, apply_changes, del_dotted, get_dotted, put_dotted, set_dotted,
                            validate_section)

D = {"recipe": {"lr": 0.1, "warm": None}, "harness": {"sampling": {"temperature": 1.0}}, "n": 3}


@pytest.mark.parametrize("path, want", [
    ("recipe.lr", (True, 0.1)),
    ("recipe.warm", (True, None)),                 # present and None is not missing
    ("recipe.nope", (False, None)),
    ("harness.sampling.temperature", (True, 1.0)),
    ("n.deeper", (False, None)),                   # through a non-section
    ("", (True, D)),                               # the empty path is the whole tree
])
def test_get_dotted(path, want):
    assert get_dotted(D, path) == want


def test_put_dotted_creates_sections_and_names_the_key():
    d: dict = {"harness": {"template": "{question}="}}
    put_dotted(d, "harness.curriculum.start", 2)
    assert d == {"harness": {"template": "{question}=", "curriculum": {"start": 2}}}
    with pytest.raises(ConfigError, match=r"'harness.template.x'.*'template' is not a section"):
        put_dotted(d, "harness.template.x", 1)
    with pytest.raises(ValueError, match="'template.x'"):   # ConfigError is a ValueError; the name defaults to the path
        put_dotted(d["harness"], "template.x", 1)


def test_del_dotted_removes_only_what_is_there():
    d = {"a": {"b": 1, "c": 2}, "x": 5}
    del_dotted(d, "a.b")
    del_dotted(d, "a.missing")
    del_dotted(d, "x.y")                             # through a non-section: nothing happens
    del_dotted(d, "nope.deeper")
    assert d == {"a": {"c": 2}, "x": 5}


def test_set_dotted_revalidates_and_refuses_unknown_fields():
    cfg = RunConfig()
    new = set_dotted(cfg, "recipe.lr", 0.01)
    assert new.recipe.lr == 0.01 and cfg.recipe.lr != 0.01       # a copy
    for key in ("recipe.nope", "nope", "", "recipe.lr.x"):
        with pytest.raises(ConfigError, match="unknown config field"):
            set_dotted(cfg, key, 1)
    with pytest.raises(ConfigError, match="recipe.lr"):
        set_dotted(cfg, "recipe.lr", -1.0)


def test_apply_changes_validates_each_section():
    r, h = apply_changes({"lr": 0.1}, {}, {"recipe.lr": 0.01, "harness.sampling.max_new_tokens": 8})
    assert r == {"lr": 0.01} and h == {"sampling": {"max_new_tokens": 8}}
    with pytest.raises(ConfigError, match="only recipe.\\* and harness.\\*"):
        apply_changes({}, {}, {"model.d_model": 8})
    with pytest.raises(ConfigError, match=r"changes \{'recipe.lr': -1\} do not apply: invalid recipe: lr"):
        apply_changes({}, {}, {"recipe.lr": -1})
    with pytest.raises(ConfigError, match="invalid harness"):
        validate_section("harness", {"sampling": {"top_p": 0}})
