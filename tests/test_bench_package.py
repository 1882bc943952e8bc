"""The benchmark suite as its own package (swarmbench): `swarm bench` reaches it through the entry
point pyproject.toml declares, and the runner starts each run's worker from the code under test (a
git snapshot first on PYTHONPATH), in either package layout a snapshot may hold.

    .venv/bin/python -m pytest tests/test_bench_package.py -q
"""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest
import yaml
from typer.testing import CliRunner

from swarmbench.runner import ROOT, prepare_src, resolve, worker_launch, worker_module


def _touch(root: pathlib.Path, *files: str) -> pathlib.Path:
    for f in files:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text("")
    return root


@pytest.mark.parametrize("files, module", [
    (("swarmbench/__init__.py", "swarmbench/worker.py"), "swarmbench.worker"),
    (("swarm/bench/__init__.py", "swarm/bench/worker.py"), "swarm.bench.worker"),   # a commit before the move
    (("swarmbench/worker.py", "swarm/bench/worker.py"), "swarmbench.worker"),        # both: the package of today
    ((), "swarmbench.worker"),                                                       # neither: the error names today's
])
def test_the_worker_module_is_the_one_the_snapshot_holds(tmp_path, files, module):
    assert worker_module(_touch(tmp_path, *files)) == module


def test_the_worker_of_a_head_snapshot_runs_the_snapshots_code(tmp_path):
    """As the runner starts it (`worker_launch`, in the snapshot of HEAD). The spec names no method,
    so the worker writes an error result whose traceback shows which files ran."""
    if resolve("HEAD") is None:
        pytest.skip("needs a git checkout")
    src, _ = prepare_src("head", tmp_path / "work")
    spec = {"method": "no-such-method", "goal": {}, "seed": 0, "target": 0.5, "budget": 1.0, "wall_cap": 10.0,
            "work": str(tmp_path / "run"), "progress": str(tmp_path / "progress.json")}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    argv, env = worker_launch(src, tmp_path / "spec.json", tmp_path / "result.json")
    p = subprocess.run(argv, cwd=src, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads((tmp_path / "result.json").read_text())
    assert res["stop"] == "error" and res["rc"] == 1 and "method='no-such-method': unknown" in res["log_tail"]
    ran = [pathlib.Path(line.split('"')[1]) for line in res["log_tail"].splitlines() if line.strip().startswith('File "')]
    ours = [f for f in ran if f.name in ("worker.py", "methods.py")]
    assert sorted(f.name for f in ours) == ["methods.py", "worker.py"], ran
    assert all(f.is_relative_to(src) for f in ours), ran      # the snapshot's files, not the working tree's


def test_swarm_bench_delegates_to_the_suite_package(tmp_path):
    from swarm.cli import app
    from swarmbench.scenarios import generate

    r = CliRunner().invoke(app, ["bench", "generate", str(tmp_path / "s"), "--seeds", "7"])
    assert r.exit_code == 0, r.output
    (written,) = (tmp_path / "s").glob("*.yaml")
    assert yaml.safe_load(written.read_text()) == generate(7)
    r = CliRunner().invoke(app, ["bench", str(tmp_path / "no-such-suite")])
    assert r.exit_code == 2


def test_swarm_bench_is_found_beside_a_stale_egg_info(tmp_path):
    """A swarmlab.egg-info left in the working directory by an old build (no entry points) comes
    first on the path; `swarm bench` still finds the installed suite."""
    stale = tmp_path / "swarmlab.egg-info"
    stale.mkdir()
    (stale / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: swarmlab\nVersion: 0.0.1\n")
    (stale / "entry_points.txt").write_text("[console_scripts]\nswarm = swarm.cli:app\n")
    code = "import sys; from swarm.cli import app; sys.argv = ['swarm', *sys.argv[1:]]; app()"
    out = subprocess.run([sys.executable, "-c", code, "bench", "generate", str(tmp_path / "s"), "--seeds", "7"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert [p.name for p in (tmp_path / "s").glob("*.yaml")] == [f"{generate_name(7)}.yaml"]


def generate_name(seed: int) -> str:
    from swarmbench.scenarios import generate

    return generate(seed)["scenario"]["name"]


def test_the_controller_never_imports_the_suite():
    """`swarm bench` is found through an entry point: a fresh `import swarm.cli` loads no swarmbench module."""
    code = "import sys, swarm.cli; print(sorted(m for m in sys.modules if m.split('.')[0] == 'swarmbench'))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "[]"
