"""Run storage (trainer/storage.py, trainer/run_storage.py) without Ray: the backends, retries on
injected failures, and a real trainer whose job side (its node's scratch folder) and controller
side (a replica) meet only on a `file://` storage that stands for a remote one.

    .venv/bin/python -m pytest tests/test_storage.py -q
"""
from __future__ import annotations

import hashlib
import json
import threading
import time

import pytest
import yaml

from sandboxes.errors import SwarmlabError
from trainer import run_storage
from trainer.control import send_command
from trainer.run_storage import JobMirror, bind, bound_uri, storage_ref, sync_run
from trainer.runlog import read_heartbeat, read_jsonl
from trainer.storage import (ArrowStorage, FolderStorage, RetryPolicy, Retrying, Storage, StorageError, join_uri,
                             open_storage)


pytestmark = pytest.mark.usefixtures("one_thread")


class Flaky(Storage):
    """A storage whose requests fail with a transient error on the call numbers in `fail` (1-based),
    counting every call (a scripted fake in the house style)."""

    def __init__(self, inner: Storage, fail: set[int] | None = None, every: int = 0) -> None:
        self.inner, self.fail, self.every, self.calls = inner, set(fail or ()), every, 0
        self.uri = inner.uri

    def _tick(self) -> None:
        self.calls += 1
        if self.calls in self.fail or (self.every and self.calls % self.every == 0):
            raise ConnectionResetError(f"injected failure on call {self.calls}")

    def put(self, key, data):
        self._tick()
        self.inner.put(key, data)

    def get(self, key):
        self._tick()
        return self.inner.get(key)

    def list(self, prefix=""):
        self._tick()
        return self.inner.list(prefix)

    def delete(self, key):
        self._tick()
        self.inner.delete(key)

    def delete_tree(self, prefix=""):
        self._tick()
        self.inner.delete_tree(prefix)


def check_storage_ops(s: Storage, on_put=None) -> None:
    """The requests the run mirror and the replica make, on any backend: a put overwrites whole, a
    listing names only the objects directly under a prefix, a missing object is FileNotFoundError,
    a delete of one that is not there does nothing. `on_put`: called after the puts (to look at
    the backend's own side)."""
    s.put("a/b/x.json", b"1")
    s.put("a/b/y.json", b"22")
    s.put("a/b/x.json", b"333")                  # overwritten whole
    assert s.get("a/b/x.json") == b"333"
    assert s.list("a/b") == ["x.json", "y.json"] and s.list("a") == [] and s.list("nothing") == []
    if on_put is not None:
        on_put()
    with pytest.raises(FileNotFoundError):
        s.get("a/b/missing")
    c = s.child("a")
    assert c.get("b/y.json") == b"22" and c.list("b") == ["x.json", "y.json"]
    assert c.uri == join_uri(s.uri, "a")
    s.delete("a/b/x.json")
    s.delete("a/b/x.json")                        # absent: nothing happens
    assert s.list("a/b") == ["y.json"]
    c.delete_tree("b")
    assert s.list("a/b") == []
    c.delete_tree("b")                            # absent: nothing happens
    with pytest.raises(ValueError, match=r"'\.\.'"):
        s.put("../escape", b"x")


@pytest.mark.parametrize("kind", ["folder", "arrow"])
def test_backends_put_get_list_delete(tmp_path, kind):
    root = tmp_path / "store"
    s = FolderStorage(root) if kind == "folder" else ArrowStorage(f"file://{root}")

    def no_temp_file_left() -> None:
        assert not [p for p in (root / "a" / "b").iterdir() if p.name.startswith(".")]

    check_storage_ops(s, on_put=no_temp_file_left)
    assert isinstance(open_storage(f"file://{root}"), Retrying) and isinstance(open_storage(str(root)).inner, FolderStorage)
    assert join_uri("s3://b/p?endpoint_override=127.0.0.1:9000", "k", "train") == "s3://b/p/k/train?endpoint_override=127.0.0.1:9000"


def test_a_transient_failure_is_retried_within_the_budget_never_fatal_at_once(tmp_path):
    slept: list[float] = []
    flaky = Flaky(FolderStorage(tmp_path), fail={1, 2, 3})
    s = Retrying(flaky, RetryPolicy(attempts=4, first_wait_s=0.1, max_wait_s=0.3), sleep=slept.append)
    s.put("k", b"v")                              # fails 3 times, lands on the 4th
    assert (tmp_path / "k").read_bytes() == b"v" and s.retries == 3 and slept == [0.1, 0.2, 0.3]
    flaky.fail = {5, 6, 7, 8}
    with pytest.raises(StorageError, match="failed 4 times.*injected failure on call 8") as e:
        s.get("k")
    assert isinstance(e.value, SwarmlabError)
    calls = flaky.calls
    with pytest.raises(FileNotFoundError):        # not transient: not retried
        s.get("absent")
    assert flaky.calls == calls + 1
    with pytest.raises(ValueError, match="attempts=0"):
        RetryPolicy(attempts=0)


def _cfg(make_cfg, tmp_path):
    cfg = make_cfg(out_dir=str(tmp_path / "ctrl" / "runs"), name="train", samples_per_step=1,
                   recipe={"steps": 100_000, "batch_size": 2, "schedule": "constant", "warmup_steps": 0, "eval_size": 4},
                   checkpoint={"interval": 5, "keep_last": 2})
    path = tmp_path / "ctrl" / "train.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg))
    return path


def _job(path, monkeypatch, uri, scratch):
    """The job's entrypoint in a thread of this process (its folder: `scratch`)."""
    monkeypatch.setenv(run_storage.STORAGE_ENV, uri)
    monkeypatch.setenv(run_storage.SCRATCH_ENV, str(scratch))
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("rc", run_storage.main([str(path)])), daemon=True)
    t.start()
    return t, out


def _until(pred, timeout, what, every=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if every:
            every()
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _ack(replica, cid):
    return next((r for r in read_jsonl(replica / "command_log.jsonl") if r.get("id") == cid), None)


def test_job_and_controller_meet_only_on_storage_and_a_restart_resumes_from_it(tmp_path, monkeypatch, make_cfg):
    job_and_controller_round_trip(tmp_path, monkeypatch, make_cfg, f"file://{tmp_path / 'store' / 'key' / 'train'}")


def job_and_controller_round_trip(tmp_path, monkeypatch, make_cfg, uri: str) -> None:
    """A real trainer's job (its node's scratch folder) and the controller's replica meet only on
    the storage at `uri`: rows, a command and its acknowledgement, a checkpoint, retention's delete,
    the stop; then a job on another node resumes from the newest checkpoint on the storage."""
    scratch = tmp_path / "node-b"
    replica = tmp_path / "ctrl" / "runs" / "train"          # the controller's folder: out_dir/name
    bind(replica, uri)
    assert bound_uri(replica) == uri
    t, out = _job(_cfg(make_cfg, tmp_path), monkeypatch, uri, scratch)
    sync = lambda: sync_run(replica)                        # noqa: E731
    _until(lambda: len(read_jsonl(replica / "metrics.jsonl")) >= 12, 120, "rows on the replica", sync)
    local = run_storage.scratch_dir(uri) / "train"
    assert (local / "metrics.jsonl").is_file()               # the job writes on its node's scratch …
    assert not (tmp_path / "ctrl" / "runs" / "train" / "checkpoints" / "step_0000005.pt").exists()
    # a command goes through the storage's inbox; its ack comes back the same way, and the
    # checkpoint it names is on the storage by then (its manifest on the replica, never the weights)
    cid = send_command(replica, "checkpoint", name="bt-1")
    _until(lambda: _ack(replica, cid), 60, "the checkpoint's ack", sync)
    assert _ack(replica, cid)["status"] == "applied"
    assert (replica / "checkpoints" / "bt-1.json").is_file() and not (replica / "checkpoints" / "bt-1.pt").exists()
    store = open_storage(uri)
    assert "bt-1.pt" in store.list("checkpoints") and storage_ref(replica / "checkpoints" / "bt-1.pt") == (uri, "bt-1")
    # retention deleting a manifest here deletes the checkpoint on the storage
    (replica / "checkpoints" / "bt-1.json").unlink()
    sync()
    assert "bt-1.pt" not in store.list("checkpoints") and "bt-1.json" not in store.list("checkpoints")
    stop = send_command(replica, "stop")
    _until(lambda: "rc" in out, 60, "the job to stop", sync)
    sync()
    assert out["rc"] == 0 and _ack(replica, stop)["status"] == "applied"
    assert not run_storage.scratch_dir(uri).exists()          # the scratch folder goes with the job
    hb = read_heartbeat(replica)
    rows = [r for r in read_jsonl(replica / "metrics.jsonl") if not r.get("final")]
    assert hb["state"] == "stopped_by_command" and rows[-1]["step"] == hb["step"]
    assert [r["step"] for r in rows] == list(range(1, hb["step"] + 1))   # every row once, in order
    assert (replica / "metrics_summary.json").is_file() and (replica / "config.yaml").is_file()
    stopped_at = hb["step"]

    # a restart (another node's scratch) resumes from the newest checkpoint on the storage and
    # does not apply the acknowledged stop again
    t2, out2 = _job(_cfg(make_cfg, tmp_path), monkeypatch, uri, tmp_path / "node-c")
    _until(lambda: any(e["event"] == "resume" for e in read_jsonl(replica / "events.jsonl")), 120, "the resume", sync)
    resume = [e for e in read_jsonl(replica / "events.jsonl") if e["event"] == "resume"][-1]
    assert resume["step"] == stopped_at
    _until(lambda: read_heartbeat(replica)["step"] > stopped_at + 2, 60, "steps after the resume", sync)
    send_command(replica, "stop")
    _until(lambda: "rc" in out2, 60, "the second job to stop", sync)
    assert out2["rc"] == 0


def test_the_mirror_survives_failing_storage_without_losing_or_repeating_rows(tmp_path):
    run_dir = tmp_path / "scratch" / "run"
    backing = FolderStorage(tmp_path / "store")
    flaky = Flaky(backing, every=3)                           # every third request fails
    mirror = JobMirror(run_dir, Retrying(flaky, RetryPolicy(attempts=3, first_wait_s=0.0, max_wait_s=0.0)))
    mirror.restore()
    written = 0
    with open(run_dir / "metrics.jsonl", "a") as f:
        for i in range(20):
            for _ in range(5):
                written += 1
                f.write(json.dumps({"step": written}) + "\n")
            f.write('{"step": ')                              # a torn line: not pushed until whole
            f.flush()
            mirror.sync()
            f.seek(0, 2)
            f.truncate(f.tell() - len('{"step": '))
    assert flaky.calls > 60
    # a pass where storage stays down past the budget fails, and the next one catches up
    flaky.every, flaky.fail = 0, set(range(flaky.calls + 1, flaky.calls + 4))
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": written + 1}) + "\n")
    with pytest.raises(StorageError):
        mirror.sync()
    mirror.sync()
    replica = tmp_path / "ctrl"
    rep = run_storage.Replica(replica, backing)
    rep.sync()
    rep.close()
    assert [r["step"] for r in read_jsonl(replica / "metrics.jsonl")] == list(range(1, written + 2))


def test_a_local_run_is_left_alone(tmp_path):
    d = tmp_path / "runs" / "train"
    d.mkdir(parents=True)
    assert sync_run(d) is None and bound_uri(d) is None and storage_ref(d / "checkpoints" / "x.pt") is None
    assert sorted(p.name for p in d.iterdir()) == []


def test_ray_jobs_with_storage_bind_each_run_and_say_where_its_fork_is(tmp_path, monkeypatch, make_cfg):
    """RayJobs.start with the goal's storage (no Ray: the submission is recorded): the job's local
    run folder becomes the replica of STORAGE/<run key>/<name>; an arm's stored folder is cleared,
    the live run's kept; a fork from a replica's checkpoint is fetched from that run's storage, a
    fork from any other file is put on the storage first."""
    import swarm.jobs as jobs_mod
    import trainer.launch as launch

    sent = []
    monkeypatch.setattr(launch, "submit_job", lambda head, path, **kw: sent.append(kw) or "job-x")
    root = f"file://{tmp_path / 'store'}"
    rj = jobs_mod.RayJobs("http://127.0.0.1:1", run_key="k1", storage=root)
    monkeypatch.setattr(rj, "_head", lambda: setattr(rj, "head", object()) or rj.head)
    ctrl = tmp_path / "ws" / ".swarm"

    def write(name, out, **over):
        p = tmp_path / f"{name}.yaml"
        p.write_text(yaml.safe_dump(make_cfg(name=name, out_dir=str(ctrl / out), **over)))
        return p

    live_uri = f"{root}/k1/train"
    open_storage(live_uri).put("checkpoints/bt-1.json", b"{}")   # what an earlier segment left: kept
    rj.start("train", write("train", "runs"), restart=1)
    assert sent[-1]["storage_uri"] == live_uri and sent[-1]["fork_storage"] is None
    assert bound_uri(ctrl / "runs" / "train") == live_uri and open_storage(live_uri).list("checkpoints") == ["bt-1.json"]
    arm_uri = f"{root}/k1/bt-1-candidate-s0"
    open_storage(arm_uri).put("streams/metrics.jsonl/000000000000", b"{}\n")   # a stale arm's rows: cleared
    rj.start("bt-1-candidate-s0", write("bt-1-candidate-s0", "backtests",
                                         fork_from=str(ctrl / "runs" / "train" / "checkpoints" / "bt-1.pt")))
    assert sent[-1]["storage_uri"] == arm_uri and sent[-1]["fork_storage"] == live_uri
    assert open_storage(arm_uri).list("streams/metrics.jsonl") == []
    own = tmp_path / "mine" / "warm.pt"
    own.parent.mkdir()
    own.write_bytes(b"weights")
    own.with_suffix(".json").write_text('{"name": "warm"}')
    rj.start("other", write("other", "runs", fork_from=str(own)), restart=0)
    src = sent[-1]["fork_storage"]
    assert src == f"{root}/k1/other/fork-source" and open_storage(src).get("checkpoints/warm.pt") == b"weights"
    # no storage in the goal: nothing bound, nothing more submitted than before
    plain = jobs_mod.RayJobs("http://127.0.0.1:1", run_key="k1")
    monkeypatch.setattr(plain, "_head", lambda: setattr(plain, "head", object()) or plain.head)
    plain.start("train", write("plain", "plain-runs"), restart=0)
    assert set(sent[-1]) == {"restart", "entrypoint_num_cpus", "resources", "salt"}
    assert bound_uri(ctrl / "plain-runs" / "plain") is None


def test_rows_cross_a_rolled_stream_on_both_sides(tmp_path, monkeypatch):
    """The trainer rolls its streams past Rotation.max_bytes between two mirror passes; the mirror
    finishes the rolled part before the new one, and the replica rolls its own copy."""
    from trainer.runlog import JsonlWriter, Rotation, rotated_parts

    run_dir = tmp_path / "scratch" / "run"
    store = FolderStorage(tmp_path / "store")
    mirror = JobMirror(run_dir, store)
    mirror.restore()
    w = JsonlWriter(run_dir / "samples.jsonl", Rotation(max_bytes=1024, keep=50))
    n = 0
    for _ in range(30):
        for _ in range(7):
            n += 1
            w.write({"i": n, "completion": "x" * 40})
        mirror.sync()
    w.close()
    assert len(rotated_parts(run_dir / "samples.jsonl")) > 5
    replica = tmp_path / "ctrl"
    monkeypatch.setenv("SWARMLAB_LOG_ROTATE_BYTES", "2048")
    rep = run_storage.Replica(replica, store)
    rep.sync()
    rep.close()
    assert [r["i"] for r in read_jsonl(replica / "samples.jsonl")] == list(range(1, n + 1))
    assert rotated_parts(replica / "samples.jsonl")


class Recording(Storage):
    """A storage that records every request as (operation, key) and passes it on (a scripted fake)."""

    def __init__(self, inner: Storage) -> None:
        self.inner, self.uri, self.requests = inner, inner.uri, []

    def put(self, key, data):
        self.requests.append(("put", key))
        self.inner.put(key, data)

    def get(self, key):
        self.requests.append(("get", key))
        return self.inner.get(key)

    def list(self, prefix=""):
        self.requests.append(("list", prefix))
        return self.inner.list(prefix)

    def delete(self, key):
        self.requests.append(("delete", key))
        self.inner.delete(key)

    def delete_tree(self, prefix=""):
        self.requests.append(("delete_tree", prefix))
        self.inner.delete_tree(prefix)


def test_a_replica_pass_costs_the_same_however_many_chunks_the_run_wrote(tmp_path):
    """The replica reads the job's index and asks for the chunks it names by key instead of listing
    the stream: a listing grows by a chunk per stream per mirror pass for the run's whole life (7,200
    an hour); listing the streams of a run 10,000 chunks long cost about 13 ms of CPU per pass on a
    local folder, half a controller's tick (benchmarks/results/storage_overhead.md, part c). An idle
    pass is one get of the index after 3 chunks and after 303, a pass that pulls asks for no chunk
    that is not there, and a replica started again goes on from its saved progress."""
    store = FolderStorage(tmp_path / "store")
    mirror = JobMirror(tmp_path / "scratch" / "run", store)
    mirror.restore()
    rec = Recording(store)
    rep = run_storage.Replica(tmp_path / "ctrl", rec)
    step = 0

    def train(chunks: int) -> None:   # `chunks` mirror passes, each with new rows in two streams
        nonlocal step
        for _ in range(chunks):
            step += 1
            with open(mirror.dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps({"step": step, "loss": 1.0 / step}) + "\n")
            with open(mirror.dir / "samples.jsonl", "a") as f:
                f.write(json.dumps({"step": step, "completion": "42"}) + "\n")
            mirror.sync()

    def one_pass() -> list[tuple[str, str]]:
        rec.requests.clear()
        rep.sync()
        return list(rec.requests)

    def shape(requests: list[tuple[str, str]]) -> list[tuple[str, str]]:   # a chunk's key without its number
        return [(op, k.rsplit("/", 1)[0] if k.startswith("streams/") else k) for op, k in requests]

    train(3)
    one_pass()
    idle_early = one_pass()                      # nothing new, 3 chunks per stream so far
    train(300)
    pulled = one_pass()
    idle_late = one_pass()                       # nothing new, 303 chunks per stream so far
    assert idle_early == idle_late == [("get", "index.json")], "an idle pass asks for more than the index"
    assert not [k for op, k in pulled if op == "list"]
    assert len([k for op, k in pulled if op == "get" and k.startswith("streams/")]) == 2 * 300
    rep.close()
    assert [r["step"] for r in read_jsonl(tmp_path / "ctrl" / "metrics.jsonl")] == list(range(1, step + 1))
    assert len(read_jsonl(tmp_path / "ctrl" / "samples.jsonl")) == step
    # a new replica (a controller restarted) goes on from its saved progress: no row twice
    train(2)
    again = run_storage.Replica(tmp_path / "ctrl", store)
    again.sync()
    again.close()
    assert [r["step"] for r in read_jsonl(tmp_path / "ctrl" / "metrics.jsonl")] == list(range(1, step + 1))


class Killed(BaseException):
    """The controller's process dying: nothing after it runs in that process."""


class Dying(run_storage.Replica):
    """A replica whose process dies at its `kill_at`-th chunk pulled in a pass (before writing it),
    and that is its own storage (passing requests on to `store`) to do so; `saves`: whether the
    progress it saves inside that pass (at a roll) reaches the disk before it dies."""

    def __init__(self, local_dir, store, kill_at: int, saves: bool) -> None:
        super().__init__(local_dir, store)
        self.kill_at, self.saves, self.got, self.dead = kill_at, saves, 0, False
        self.store = self
        self.inner = store

    def get(self, key):
        data = self.inner.get(key)
        if key.startswith("streams/"):
            self.got += 1
            if self.got == self.kill_at:
                self.dead = True
                raise Killed(key)
        return data

    def list(self, prefix=""):
        return self.inner.list(prefix)

    def put(self, key, data):
        self.inner.put(key, data)

    def delete(self, key):
        self.inner.delete(key)

    def _save(self, force=False):
        if not self.dead and self.saves:
            super()._save(force)


@pytest.mark.parametrize("kill_at,saves", [(1, True), (3, True), (7, True), (13, True), (20, True),
                                           (7, False), (13, False), (20, False)])
def test_a_controller_killed_inside_a_pass_pulls_every_row_once(tmp_path, monkeypatch, kill_at, saves):
    """The replica's progress is saved at most every few seconds (and when its copy of a stream
    rolls); a controller killed inside a pass has written rows of chunks its saved progress does not count.
    The next replica cuts each stream back to where the progress ends (the live file, or the part
    that was live when the stream rolled since) and pulls those chunks again: every row once, and
    the run's summary counts every row once."""
    from trainer.runlog import rotated_parts

    monkeypatch.setenv("SWARMLAB_LOG_ROTATE_BYTES", "2048")
    store = FolderStorage(tmp_path / "store")
    mirror = JobMirror(tmp_path / "scratch" / "run", store)
    mirror.restore()
    ctrl = tmp_path / "ctrl"
    step = 0

    def train(passes: int) -> None:
        nonlocal step
        for _ in range(passes):
            with open(mirror.dir / "metrics.jsonl", "a") as m, open(mirror.dir / "samples.jsonl", "a") as s:
                for _ in range(3):
                    step += 1
                    m.write(json.dumps({"step": step, "loss": 0.5, "note": "x" * 37}) + "\n")   # 70 bytes
                    s.write(json.dumps({"step": step, "completion": "42"}) + "\n")
            mirror.sync()

    train(5)
    first = run_storage.Replica(ctrl, store)
    first.sync()
    first.close()
    train(12)      # 17 chunks of 210 bytes: the replica's metrics roll once, at the 10th (2048 bytes)
    dying = Dying(ctrl, store, kill_at=kill_at, saves=saves)
    with pytest.raises(Killed):
        dying.sync()
    for w in (dying.log.metrics, dying.log.samples, dying.log.events, dying.acks):   # no summary written at a kill
        w.close()
    rolled = bool(rotated_parts(ctrl / "metrics.jsonl"))
    assert rolled == (kill_at > 5), "the lost pass was meant to roll the replica's metrics"
    again = run_storage.Replica(ctrl, store)
    again.sync()
    again.close()
    assert [r["step"] for r in read_jsonl(ctrl / "metrics.jsonl")] == list(range(1, step + 1))
    assert [r["step"] for r in read_jsonl(ctrl / "samples.jsonl")] == list(range(1, step + 1))
    summary = json.loads((ctrl / "metrics_summary.json").read_text())
    assert summary["n"] == step
    from trainer.runlog import metrics_history

    assert [r["step"] for r in metrics_history(ctrl)] == list(range(1, step + 1))


class LandsThenFails(Storage):
    """A storage whose puts numbered in `fail` store the object and then report a transient error
    (a reply lost on the way back), counting every put (a scripted fake)."""

    def __init__(self, inner: Storage, fail: set[int]) -> None:
        self.inner, self.fail, self.puts, self.uri = inner, fail, 0, inner.uri

    def put(self, key, data):
        self.puts += 1
        self.inner.put(key, data)
        if self.puts in self.fail:
            raise ConnectionResetError(f"reply to put {self.puts} lost")

    def get(self, key):
        return self.inner.get(key)

    def list(self, prefix=""):
        return self.inner.list(prefix)

    def delete(self, key):
        self.inner.delete(key)

    def delete_tree(self, prefix=""):
        self.inner.delete_tree(prefix)


def test_a_chunk_whose_put_landed_but_failed_is_put_again_unchanged(tmp_path):
    """A put that stored its chunk but failed past its retries (the reply lost) may already have
    been read by the replica: the mirror puts the same bytes under that key again, and the rows
    written since go in the next chunk, so the replica, gone on to the next key, loses none."""
    backing = FolderStorage(tmp_path / "store")
    flaky = LandsThenFails(backing, fail=set())
    mirror = JobMirror(tmp_path / "scratch" / "run", Retrying(flaky, RetryPolicy(attempts=1)))
    mirror.restore()
    rep = run_storage.Replica(tmp_path / "ctrl", backing)

    def write(*steps: int) -> None:
        with open(mirror.dir / "metrics.jsonl", "a") as f:
            f.writelines(json.dumps({"step": s}) + "\n" for s in steps)

    write(1, 2)
    mirror.sync()
    write(3, 4)
    flaky.fail = {flaky.puts + 1}          # the next put (the metrics chunk) lands and reports a failure
    with pytest.raises(StorageError):
        mirror.sync()
    rep.sync()                             # the replica has read it and asks for the next key now
    write(5)
    mirror.sync()                          # the failed chunk again, as it was
    mirror.sync()                          # the row written since (read after that pass's checkpoints)
    rep.sync()
    rep.close()
    assert [r["step"] for r in read_jsonl(tmp_path / "ctrl" / "metrics.jsonl")] == [1, 2, 3, 4, 5]
    assert backing.get("streams/metrics.jsonl/000000000001") == b'{"step": 3}\n{"step": 4}\n'


def test_the_index_is_stored_last_and_a_pass_reads_only_what_it_says_changed(tmp_path):
    """The mirror stores its index after everything it names, and only when it changed; the replica
    gets the index, then only the chunks, files and manifests the index says are new to it: a
    heartbeat rewritten with the same bytes is neither stored nor copied again, a changed one is; a
    checkpoint deleted by retention is not pulled again while the job's index still names it, and
    one the job pruned goes from the replica too. A run with no index yet pulls nothing."""
    store = FolderStorage(tmp_path / "store")
    job_rec = Recording(store)
    mirror = JobMirror(tmp_path / "scratch" / "run", job_rec)
    rec = Recording(store)
    ctrl = tmp_path / "ctrl"
    rep = run_storage.Replica(ctrl, rec)
    rep.sync()
    assert rec.requests == [("get", "index.json")] and not (ctrl / "metrics.jsonl").exists()   # no index: nothing
    mirror.restore()
    d = mirror.dir
    (d / "heartbeat.json").write_text('{"step": 1}')
    (d / "config.yaml").write_text("name: train\n")
    (d / "harnesses").mkdir()
    (d / "harnesses" / "v1.yaml").write_text("prompt: x\n")
    with open(d / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 1}) + "\n")
    job_rec.requests.clear()
    mirror.sync()
    puts = [k for op, k in job_rec.requests if op == "put"]
    assert puts[-1] == "index.json" and set(puts[:-1]) == {"streams/metrics.jsonl/000000000000", "heartbeat.json",
                                                            "config.yaml", "harnesses/v1.yaml"}
    rec.requests.clear()
    rep.sync()
    assert sorted(k for _, k in rec.requests) == sorted(["index.json", "streams/metrics.jsonl/000000000000", "heartbeat.json",
                                                         "config.yaml", "harnesses/v1.yaml"])
    assert (ctrl / "harnesses" / "v1.yaml").read_text() == "prompt: x\n" and read_heartbeat(ctrl)["step"] == 1

    # the heartbeat rewritten with the same bytes: the mirror stores nothing, not even its index
    hb_inode = (ctrl / "heartbeat.json").stat().st_ino
    time.sleep(0.01)
    (d / "heartbeat.json").write_text('{"step": 1}')
    job_rec.requests.clear()
    mirror.sync()
    assert not [k for op, k in job_rec.requests if op == "put"]
    rec.requests.clear()
    rep.sync()
    assert rec.requests == [("get", "index.json")] and (ctrl / "heartbeat.json").stat().st_ino == hb_inode
    # a new heartbeat: the index and the heartbeat, nothing else
    (d / "heartbeat.json").write_text('{"step": 2}')
    mirror.sync()
    rec.requests.clear()
    rep.sync()
    assert rec.requests == [("get", "index.json"), ("get", "heartbeat.json")] and read_heartbeat(ctrl)["step"] == 2

    # checkpoints: two written, one deleted by the controller's retention, one pruned by the job
    for name in ("step_0000005", "step_0000010"):
        data = name.encode()
        (d / "checkpoints" / f"{name}.pt").write_bytes(data)
        (d / "checkpoints" / f"{name}.json").write_text(json.dumps({"name": name, "sha256": hashlib.sha256(data).hexdigest()}))
    mirror.sync()
    rep.sync()
    assert sorted(p.name for p in (ctrl / "checkpoints").iterdir()) == ["step_0000005.json", "step_0000010.json"]
    (ctrl / "checkpoints" / "step_0000005.json").unlink()                 # retention, on the controller
    rep.sync()
    assert "step_0000005.pt" not in store.list("checkpoints")
    assert "step_0000005" in json.loads(store.get("index.json"))["checkpoints"]   # the job does not know yet
    rec.requests.clear()
    rep.sync()
    assert rec.requests == [("get", "index.json")] and not (ctrl / "checkpoints" / "step_0000005.json").exists()
    (d / "checkpoints" / "step_0000010.json").unlink()                    # the trainer prunes its checkpoints
    (d / "checkpoints" / "step_0000010.pt").unlink()
    (d / "checkpoints" / "step_0000005.json").unlink()
    (d / "checkpoints" / "step_0000005.pt").unlink()
    mirror.sync()
    rep.sync()
    assert not list((ctrl / "checkpoints").iterdir()) and json.loads(store.get("index.json"))["checkpoints"] == {}
    rep.close()
    assert json.loads((ctrl / ".replica.json").read_text())["deleted"] == {}
