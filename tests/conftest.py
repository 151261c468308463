"""Shared fixtures: generated datasets and a real S3 endpoint (moto server on 127.0.0.1)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import dask
import numpy as np
import pytest

import l5dask
from l5dask.prediction import format as fmt

#: Small chunks so that scenes, frames and tracks straddle chunk boundaries.
SMALL_CHUNKS = {fmt.SCENES: 2, fmt.FRAMES: 300, fmt.AGENTS: 5_000, fmt.TL_FACES: 2_000}


#: The test modules that need only an installed l5dask, not the source tree: run against the built
#: wheel from outside the repository (``.ci/installed``; cibuildwheel's test command), as
#: ``pytest -m installed``.
INSTALLED = {
    "test_reading",
    "test_writing",
    "test_engine",
    "test_errors",
    "test_install",
    "test_layers",
    "test_xarray",
    "test_aggregate",
    "test_laziness",
    "test_perception",
}


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "installed: needs only an installed l5dask, not the source tree")


def pytest_ignore_collect(collection_path, config) -> bool | None:
    """With ``-m installed``, the other test modules are not even imported (outside the repository
    some cannot be: they read its files)."""
    name = collection_path.name
    if config.getoption("markexpr", "") == "installed" and name.startswith("test_") and name.endswith(".py"):
        return collection_path.stem not in INSTALLED or None
    return None


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if item.module is not None and item.module.__name__.rsplit(".", 1)[-1] in INSTALLED:
            item.add_marker(pytest.mark.installed)


def ctrl_c_reaches_it() -> None:
    """A ``preexec_fn`` for a child process the test will send Ctrl-C (SIGINT): its default action
    restored. A shell starts a background command with SIGINT ignored, and Python then installs no
    KeyboardInterrupt handler: a suite run from ``.ci/run &`` saw its Ctrl-C'd children run to the end."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def require(available: bool, what: str) -> None:
    """Skip a test whose reference component is missing, but fail under CI (``CI=true``), where
    ``.ci/run`` installs it: a check that never runs must not look like one that passes."""
    if available:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{what} is missing under CI; .ci/run installs it")
    pytest.skip(f"{what} is not installed (.ci/run installs it)")


def l5kit_data() -> None:
    """Make ``l5kit.data``'s modules importable (L5Kit 1.5.0, installed --no-deps).

    l5kit's package ``__init__`` imports torch and its map stack; ``l5kit.data.zarr_dataset`` and
    ``zarr_utils`` need only zarr-python 2, tqdm and sibling modules: the two packages are made
    plain namespaces, their ``__init__`` not run.
    """
    import importlib.util
    import types
    from pathlib import Path

    done = sys.modules.get("l5kit.data")
    if done is not None and getattr(done, "__file__", None) is None:
        return
    spec = importlib.util.find_spec("l5kit")
    require(
        spec is not None and bool(spec.submodule_search_locations), "l5kit 1.5.0 (pip install --no-deps l5kit==1.5.0)"
    )
    root = Path(list(spec.submodule_search_locations)[0])
    for pkg, path in (("l5kit", root), ("l5kit.data", root / "data")):
        if pkg not in sys.modules or getattr(sys.modules[pkg], "__file__", None) is not None:
            mod = types.ModuleType(pkg)
            mod.__path__ = [str(path)]
            sys.modules[pkg] = mod


def l5kit_evaluation():
    """L5Kit 1.5.0's ``evaluation.csv_utils``, ``evaluation.metrics`` and ``evaluation.extract_metrics``
    loaded from its installed source without torch: ``l5kit.evaluation``'s ``__init__`` and
    ``metrics.py`` import torch and the planning stack, which the numpy metrics never call, so
    those imports get empty stand-ins (and only for the loading)."""
    import importlib.util
    import types

    l5kit_data()
    if "l5kit.evaluation.extract_metrics" in sys.modules:
        return (
            sys.modules["l5kit.evaluation.csv_utils"],
            sys.modules["l5kit.evaluation.metrics"],
            sys.modules["l5kit.evaluation.extract_metrics"],
        )
    root = list(sys.modules["l5kit"].__path__)[0]
    ev = types.ModuleType("l5kit.evaluation")
    ev.__path__ = [os.path.join(root, "evaluation")]
    sys.modules["l5kit.evaluation"] = ev
    saved = {k: sys.modules.get(k) for k in ("torch", "l5kit.planning", "l5kit.planning.utils")}
    for k in saved:
        sys.modules[k] = types.ModuleType(k)
    sys.modules["l5kit.planning"].utils = sys.modules["l5kit.planning.utils"]
    sys.modules["torch"].Tensor = type("Tensor", (), {})  # only annotations use it
    try:
        mods = []
        for name in ("csv_utils", "metrics", "extract_metrics"):
            spec = importlib.util.spec_from_file_location(
                f"l5kit.evaluation.{name}", os.path.join(root, "evaluation", f"{name}.py")
            )
            mod = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = mod
            spec.loader.exec_module(mod)
            mods.append(mod)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return tuple(mods)


def l5kit_select_agents():
    """L5Kit 1.5.0's ``dataset/select_agents.py`` (and its ``ChunkedDataset``) without torch:
    ``l5kit.dataset``'s ``__init__`` imports torch, and ``l5kit.geometry``'s the map stack; the
    module needs only ``angular_distance`` (``geometry/angle.py``), loaded on its own."""
    import importlib.util
    import types

    l5kit_data()
    if "l5kit.dataset.select_agents" in sys.modules:
        return sys.modules["l5kit.dataset.select_agents"]
    root = list(sys.modules["l5kit"].__path__)[0]
    from l5kit.data.zarr_dataset import ChunkedDataset

    sys.modules["l5kit.data"].ChunkedDataset = ChunkedDataset

    def load(name: str, path: str):
        spec = importlib.util.spec_from_file_location(name, os.path.join(root, path))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return mod

    if "l5kit.geometry" not in sys.modules:
        geo = types.ModuleType("l5kit.geometry")
        geo.__path__ = [os.path.join(root, "geometry")]
        sys.modules["l5kit.geometry"] = geo
        geo.angular_distance = load("l5kit.geometry.angle", "geometry/angle.py").angular_distance
    pkg = types.ModuleType("l5kit.dataset")
    pkg.__path__ = [os.path.join(root, "dataset")]
    sys.modules.setdefault("l5kit.dataset", pkg)
    return load("l5kit.dataset.select_agents", "dataset/select_agents.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def small_ds(tmp_path_factory) -> str:
    """5 scenes, many small chunks (read-only: do not modify)."""
    path = str(tmp_path_factory.mktemp("data") / "small.zarr")
    l5dask.synthesize(path, num_scenes=5, seed=7, chunk_rows=SMALL_CHUNKS)
    return path


@pytest.fixture(scope="session")
def default_ds(tmp_path_factory) -> str:
    """3 scenes with L5Kit's own chunk sizes (read-only)."""
    path = str(tmp_path_factory.mktemp("data") / "default.zarr")
    l5dask.synthesize(path, num_scenes=3, seed=3)
    return path


def read_all(path: str) -> dict[str, np.ndarray]:
    """Every array of a dataset, decoded by zarr-python 2 (L5Kit's reader stack): the reference."""
    import zarr

    root = zarr.open_group(path, mode="r")
    return {name: root[name][:] for name in fmt.ARRAY_NAMES if name in root}


class S3Server:
    """A moto S3 server on 127.0.0.1 with IAM authentication switched on (``auth=False``: off;
    moto with IAM answers presigned URLs with a 500, without it, as S3 does)."""

    def __init__(self, auth: bool = True) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, AWS_DEFAULT_REGION="us-east-1")
        if auth:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "3"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 30
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1)
                break
            except Exception:
                if time.time() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.2)
        import boto3

        iam = boto3.client(
            "iam",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="bootstrap",
            aws_secret_access_key="bootstrap",
        )
        iam.create_user(UserName="l5dask")
        iam.put_user_policy(
            UserName="l5dask",
            PolicyName="s3",
            PolicyDocument=json.dumps(
                {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
            ),
        )
        key = iam.create_access_key(UserName="l5dask")["AccessKey"]
        self.key, self.secret = key["AccessKeyId"], key["SecretAccessKey"]

    def storage_options(self, key: str | None = None, secret: str | None = None) -> dict:
        return {
            "key": key or self.key,
            "secret": secret or self.secret,
            "client_kwargs": {"endpoint_url": self.endpoint, "region_name": "us-east-1"},
            "skip_instance_cache": True,
        }

    def environment(self) -> dict:
        """This process's environment with the endpoint and its credentials as AWS_* variables
        (how a user without ``-o`` options points l5dask at it)."""
        return dict(
            os.environ,
            AWS_ACCESS_KEY_ID=self.key,
            AWS_SECRET_ACCESS_KEY=self.secret,
            AWS_ENDPOINT_URL=self.endpoint,
            AWS_DEFAULT_REGION="us-east-1",
        )

    def make_bucket(self, name: str) -> None:
        import boto3

        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=self.key,
            aws_secret_access_key=self.secret,
        )
        try:
            client.create_bucket(Bucket=name)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass

    def s3fs(self):
        import s3fs

        return s3fs.S3FileSystem(**self.storage_options())

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture(scope="session")
def s3():
    server = S3Server()
    yield server
    server.close()


@pytest.fixture(scope="session")
def s3_open():
    """A moto S3 server without IAM authentication: it takes presigned URLs."""
    server = S3Server(auth=False)
    yield server
    server.close()


@pytest.fixture(scope="session")
def s3_small(s3, small_ds) -> str:
    """``small_ds`` uploaded to s3://l5-test/small.zarr."""
    s3.make_bucket("l5-test")
    fs = s3.s3fs()
    fs.put(small_ds, "l5-test/small.zarr", recursive=True)
    return "s3://l5-test/small.zarr"


class DaskCluster:
    """A real ``dask scheduler`` and ``dask worker`` processes (with nannies) on 127.0.0.1."""

    def __init__(self, n_workers: int = 2, threads: int = 1, env: dict | None = None) -> None:
        import tempfile

        self.port = free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        # logs go to a file: a pipe nobody reads could fill up and block a chatty worker
        self.log = tempfile.TemporaryFile()
        self.scheduler = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dask",
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--no-dashboard",
            ],
            stdout=subprocess.DEVNULL,
            stderr=self.log,
        )
        from l5dask.core.cluster import WORKER_ENV

        env = dict(
            os.environ,
            **WORKER_ENV,
            **(env or {}),
            DASK_CONFIG=os.path.join(os.path.dirname(__file__), "..", "cluster"),
        )
        self.workers = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "dask",
                    "worker",
                    self.address,
                    "--nthreads",
                    str(threads),
                    "--host",
                    "127.0.0.1",
                    "--no-dashboard",
                    "--memory-limit",
                    "2GB",
                ],
                stdout=subprocess.DEVNULL,
                stderr=self.log,
                env=env,
            )
            for _ in range(n_workers)
        ]
        from distributed import Client

        with Client(self.address, timeout="30s", set_as_default=False) as client:
            client.wait_for_workers(n_workers, timeout=60)

    def close(self) -> None:
        for p in [*self.workers, self.scheduler]:
            if p.poll() is None:
                p.terminate()
        for p in [*self.workers, self.scheduler]:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()

    def logs(self) -> str:
        """What the scheduler and the workers logged."""
        self.log.seek(0)
        return self.log.read().decode(errors="replace")


@pytest.fixture(scope="session")
def dask_cluster():
    cluster = DaskCluster()
    yield cluster
    cluster.close()


NOTEBOOK_ENV = {
    "01_quickstart.ipynb": {"L5DASK_SCENES": "4"},
    "04_custom_aggregations.ipynb": {"L5DASK_SCENES": "6"},
}


@pytest.fixture(scope="session")
def executed_notebooks(tmp_path_factory, s3, s3_small, dask_cluster):
    """Each notebook of notebooks/ run top to bottom once (a real kernel), in a folder of its own
    (``DIR/<name>/``), executed copy at ``DIR/<name>.ipynb`` with its outputs: the notebook
    tests check these runs and the documentation renders them. Committed notebooks hold no outputs."""
    import nbformat
    from nbclient import NotebookClient

    out = tmp_path_factory.mktemp("notebooks")
    s3_env = {
        "L5DASK_SCHEDULER": dask_cluster.address,
        "L5DASK_S3_URL": s3_small,
        "L5DASK_S3_ENDPOINT": s3.endpoint,
        "AWS_ACCESS_KEY_ID": s3.key,
        "AWS_SECRET_ACCESS_KEY": s3.secret,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    for path in sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"{path.name}: outputs committed"
        env = NOTEBOOK_ENV.get(path.name, s3_env if "s3" in path.name else {})
        cwd = out / path.stem
        cwd.mkdir()
        with pytest.MonkeyPatch.context() as mp:  # (the kernel inherits this process's environment)
            for k, v in env.items():
                mp.setenv(k, v)
            NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
        nbformat.write(nb, out / path.name)
    return out


# --- shared guards -------------------------------------------------------------------------


class _Raising:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, dsk, keys, **kwargs):
        self.calls += 1
        raise RuntimeError("a dask computation while nothing should compute")


@contextlib.contextmanager
def raise_if_dask_computes():
    scheduler = _Raising()
    with dask.config.set(scheduler=scheduler):
        yield scheduler
    assert scheduler.calls == 0


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
    "--virtual-time-budget=5000",
]


def chromium(args, tmp_path, timeout=120):
    """Headless chromium (Debian's package) run on ``args``, with a profile of its own in ``tmp_path``."""
    require(CHROMIUM is not None, "chromium (Debian's package)")
    return subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
