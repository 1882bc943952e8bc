"""Run storage (trainer/storage.py, trainer/run_storage.py) on an S3-compatible server: moto's
(`moto[server]`, in the test extra) on 127.0.0.1, spoken to by pyarrow's own S3 client through
`pyarrow.fs.FileSystem.from_uri`, as a real object store is. The same checks as the local-folder
tests in tests/test_storage.py (their helpers are reused): the backend's requests, the retry wrapper
over a server that is down and then comes up, and a real trainer's job and the controller's replica
meeting only on a bucket, with a restart on another node resuming from the checkpoint there.

    .venv/bin/python -m pytest tests/test_storage_s3.py -q

Credentials, region and config files are dummies set for the module; the AWS client's look-up of
instance metadata is turned off, so no request leaves the machine.
"""
from __future__ import annotations

import itertools
import socket

import psutil
import pytest

pytest.importorskip("moto.server", reason="moto[server] is not installed (the `test` extra has it: scripts/bootstrap.sh)")
pafs = pytest.importorskip("pyarrow.fs")
if not hasattr(pafs, "S3FileSystem"):
    pytest.skip("this pyarrow is built without S3 support", allow_module_level=True)

from moto.server import ThreadedMotoServer  # noqa: E402
from test_storage import check_storage_ops, job_and_controller_round_trip  # noqa: E402

from trainer.storage import ArrowStorage, RetryPolicy, Retrying, StorageError, open_storage  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

REGION = "us-east-1"
_buckets = itertools.count()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def aws_env(tmp_path_factory):
    """Dummy credentials and region, no config file of the user's, no instance-metadata look-up."""
    home = tmp_path_factory.mktemp("aws")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                     "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true",
                     "AWS_CONFIG_FILE": str(home / "config"),
                     "AWS_SHARED_CREDENTIALS_FILE": str(home / "credentials")}.items():
            mp.setenv(k, v)
        for k in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            mp.delenv(k, raising=False)
        yield


def _start(port: int) -> ThreadedMotoServer:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    return server


def _make_bucket(port: int, name: str | None = None) -> str:
    name = name or f"runs-{next(_buckets)}"
    pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{port}", scheme="http", region=REGION,
                      allow_bucket_creation=True).create_dir(name)
    return name


def _uri(port: int, bucket: str, prefix: str) -> str:
    return f"s3://{bucket}/{prefix}?endpoint_override=127.0.0.1:{port}&scheme=http&region={REGION}"


@pytest.fixture(scope="module")
def s3_port(aws_env):
    """An S3-compatible server on 127.0.0.1 for the module; stopped after it."""
    port = _free_port()
    server = _start(port)
    try:
        yield port
    finally:
        server.stop()


@pytest.fixture
def bucket(s3_port):
    """A bucket of this test's own on the module's server: (port, name)."""
    return s3_port, _make_bucket(s3_port)



def test_the_server_listens_on_loopback_only(s3_port):
    listening = [c for c in psutil.Process().net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == s3_port]
    assert listening and all(c.laddr.ip == "127.0.0.1" for c in listening), listening


def test_s3_backend_put_get_list_delete(bucket):
    port, name = bucket
    s = open_storage(_uri(port, name, "swarmlab/key"))
    assert isinstance(s, Retrying) and isinstance(s.inner, ArrowStorage) and isinstance(s.inner.fs, pafs.S3FileSystem)
    import boto3   # moto's own dependency: a second client, to see the bucket as S3 holds it

    client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name=REGION)

    def only_the_objects_put() -> None:   # no folder markers, no temp objects
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=name).get("Contents", [])]
        assert sorted(keys) == ["swarmlab/key/a/b/x.json", "swarmlab/key/a/b/y.json"]

    check_storage_ops(s, on_put=only_the_objects_put)


def test_retrying_rides_out_a_server_that_is_down_and_then_up(aws_env):
    """With no server at all the budget runs out and the error is StorageError naming the last
    failure; then the first request meets no server (connection refused: transient, retried), the
    server comes up during the wait and the retry lands. The AWS client's own retries are off here,
    so each attempt is one connection."""
    port = _free_port()
    fs = pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{port}", scheme="http", region=REGION,
                           retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1))
    bucket = f"late-{next(_buckets)}"
    store = ArrowStorage(f"{bucket}/key", filesystem=fs)
    slept: list[float] = []
    down = Retrying(store, RetryPolicy(attempts=2, first_wait_s=0.0, max_wait_s=0.0), sleep=slept.append)
    with pytest.raises(StorageError, match="failed 2 times.*OSError"):
        down.get("heartbeat.json")
    assert down.retries == 1 and slept == [0.0]
    servers: list[ThreadedMotoServer] = []

    def server_comes_up(wait_s: float) -> None:
        if not servers:
            servers.append(_start(port))
            _make_bucket(port, bucket)

    s = Retrying(store, RetryPolicy(attempts=3, first_wait_s=0.0, max_wait_s=0.0), sleep=server_comes_up)
    try:
        s.put("heartbeat.json", b'{"step": 1}')
        assert s.retries == 1 and len(servers) == 1
        assert s.get("heartbeat.json") == b'{"step": 1}' and s.list("") == ["heartbeat.json"] and s.retries == 1
    finally:
        for srv in servers:
            srv.stop()


def test_a_job_and_the_controller_meet_only_on_a_bucket_and_a_restart_resumes_from_it(
        bucket, tmp_path, monkeypatch, make_cfg):
    job_and_controller_round_trip(tmp_path, monkeypatch, make_cfg, _uri(*bucket, "swarmlab/key/train"))
