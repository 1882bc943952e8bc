"""What a job carries and how it is named, without a Ray head (the Ray side is in
tests/test_ray_job.py):

- the submission id is a pure function of the run spec and the restart count: the same spec names
  the same job (a controller resumed after a crash finds it instead of starting another);
- the config a job carries has absolute paths, read against the submitter's working directory;
- the code packages are named by Ray's own content hash (the function Ray's job client calls):
  unchanged when compiled files appear, changed when a source file changes;
- a job PENDING beyond the limit is overdue, on a table of cases.

    .venv/bin/python -m pytest tests/test_cluster_submit.py -q
"""
from __future__ import annotations

import pytest
import yaml

from trainer.launch import (CODE_PACKAGES, PROJECT_ROOT, JobPendingError, code_runtime_env, pending_overdue,
                            run_spec, submission_id)
from sandboxes.errors import SwarmlabError


def _write(path, **over):
    cfg = {"name": "arm-1", "out_dir": "runs", "recipe": {"steps": 3}, **over}
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_submission_id_names_the_spec_and_the_restart(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a = run_spec(_write(tmp_path / "a.yaml"))
    same = run_spec(_write(tmp_path / "same.yaml"))           # another file, the same spec
    other = run_spec(_write(tmp_path / "b.yaml", seed=1))
    assert submission_id(a) == submission_id(same) == submission_id(a, 0)
    assert submission_id(a).startswith("swarmlab-arm-1-") and submission_id(a).endswith("-r0")
    assert submission_id(a, 1) != submission_id(a) and submission_id(a, 1).endswith("-r1")
    assert submission_id(other) != submission_id(a)
    with pytest.raises(ValueError, match="restart=-1"):
        submission_id(a, -1)
    # a run's key tells apart two runs of one spec (a workspace made again at the same path)
    assert submission_id(a, 0, "k1") == submission_id(same, 0, "k1") != submission_id(a, 0, "k2") != submission_id(a)


def test_ray_jobs_name_each_job_by_its_spec_restart_and_run_key_and_reserve_its_place(tmp_path, monkeypatch):
    """RayJobs.start submits with the goal's reservation; the live job's id is derived from the
    spec, the restart count and the run's key, any other job's (an arm) is new each time, since an
    arm rerun after a controller restart must start afresh (no Ray here: the submission is recorded)."""
    import swarm.jobs as jobs_mod
    import trainer.launch as launch

    sent = []
    monkeypatch.setattr(launch, "submit_job", lambda head, path, **kw: sent.append(kw) or "job-x")
    key = jobs_mod.run_key(tmp_path / "private")
    assert key == jobs_mod.run_key(tmp_path / "private")                   # kept for the run's life
    assert (tmp_path / "private" / "run_key").stat().st_mode & 0o077 == 0    # private
    rj = jobs_mod.RayJobs("http://127.0.0.1:1", job_cpus=1.0, job_resources={"trainer_node": 1.0}, run_key=key)
    monkeypatch.setattr(rj, "_head", lambda: setattr(rj, "head", object()) or rj.head)
    assert rj.start("train", tmp_path / "a.yaml", restart=2) == "job-x" and "job-x" in rj.handles
    assert sent == [{"restart": 2, "entrypoint_num_cpus": 1.0, "resources": {"trainer_node": 1.0}, "salt": key}]
    bare = jobs_mod.RayJobs("http://127.0.0.1:1")
    monkeypatch.setattr(bare, "_head", lambda: setattr(bare, "head", object()) or bare.head)
    bare.start("bt-1-candidate-s0", tmp_path / "b.yaml")            # not the live job: a new id each time
    bare.start("bt-1-candidate-s0", tmp_path / "b.yaml")
    first, second = sent[-2:]
    assert first["entrypoint_num_cpus"] is None and first["resources"] is None and first["restart"] == 0
    assert first["salt"] and second["salt"] and first["salt"] != second["salt"]


def test_the_carried_config_has_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ck = tmp_path / "ck" / "step_0000001.pt"
    spec = run_spec(_write(tmp_path / "a.yaml", fork_from="ck/step_0000001.pt"))
    assert spec.out_dir == str(tmp_path / "runs") and spec.fork_from == str(ck)
    # the same relative config submitted from elsewhere is another run (another folder, another id)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    moved = run_spec(tmp_path / "a.yaml")
    assert moved.out_dir == str(tmp_path / "elsewhere" / "runs") and submission_id(moved) != submission_id(spec)


def test_code_packages_are_named_by_content(tmp_path):
    from ray._private.runtime_env.packaging import get_uri_for_directory

    env = code_runtime_env()
    assert env["py_modules"] == [str(PROJECT_ROOT / p) for p in CODE_PACKAGES]
    for p in env["py_modules"]:   # what `python -m trainer.entry` imports, each a package
        assert (PROJECT_ROOT / p / "__init__.py").is_file()

    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "mod.py").write_text("X = 1\n")

    def uri() -> str:
        return get_uri_for_directory(str(pkg), include_gitignore=True, excludes=env["excludes"])

    first = uri()
    assert uri() == first
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\x00compiled")
    (pkg / "sub" / "stray.pyc").write_bytes(b"\x00")
    assert uri() == first, "compiled files changed the package's name: every import would upload it again"
    (pkg / "sub" / "mod.py").write_text("X = 2\n")
    assert uri() != first


@pytest.mark.parametrize("status,since,now,limit,overdue", [
    ("PENDING", 100.0, 150.0, 60.0, False),
    ("PENDING", 100.0, 161.0, 60.0, True),
    ("PENDING", None, 1e9, 60.0, False),        # never seen pending
    ("RUNNING", 100.0, 1e9, 60.0, False),       # started: no longer a pending question
    ("FAILED", 100.0, 1e9, 60.0, False),
    ("PENDING", 100.0, 100.5, 0.0, True),
])
def test_pending_overdue(status, since, now, limit, overdue):
    assert pending_overdue(status, since, now, limit) is overdue


def test_pending_error_is_the_projects():
    e = JobPendingError("j1", 301.0, 300.0, "no node has resource x")
    assert isinstance(e, SwarmlabError) and isinstance(e, RuntimeError)
    assert "j1" in str(e) and "300s" in str(e) and "no node has resource x" in str(e)
