"""cluster/: every file loads, and every command in it is one our CLI (or dask's) accepts."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import dask
import pytest
import yaml

from l5dask.cli import main as l5dask_cli
from l5dask.core.cluster import scheduler_address

CLUSTER = Path(__file__).parent.parent / "cluster"
ROOT = CLUSTER.parent
IMAGE = "l5dask:0.1.0"


def yaml_docs():
    return {
        p.relative_to(CLUSTER).as_posix(): list(yaml.safe_load_all(p.read_text()))
        for p in sorted(CLUSTER.rglob("*.y*ml"))
    }


def commands():
    """Every (where, argv) of a container in cluster/."""
    docs = yaml_docs()
    out = []
    for name, svc in docs["docker-compose.yml"][0]["services"].items():
        if "command" in svc:
            out.append((f"compose:{name}", svc["command"], svc.get("image")))
    for file, items in docs.items():
        for doc in items:
            if not isinstance(doc, dict) or "kind" not in doc:
                continue
            for c in _containers(doc):
                out.append((f"{file}:{c['name']}", c.get("command") or c.get("args"), c.get("image")))
    return out


def _containers(obj):
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == "containers":
                yield from v
            else:
                yield from _containers(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _containers(v)


def test_every_yaml_loads():
    docs = yaml_docs()
    assert {"docker-compose.yml", "dask.yaml", "k8s/daskcluster.yaml", "k8s/nightly-cronjob.yaml"} <= set(docs)
    cluster = docs["k8s/daskcluster.yaml"][0]
    assert cluster["apiVersion"] == "kubernetes.dask.org/v1" and cluster["kind"] == "DaskCluster"
    kinds = {d["kind"] for d in docs["k8s/nightly-cronjob.yaml"]}
    assert kinds == {"CronJob", "ConfigMap"}


def test_every_image_is_ours_and_built_by_the_dockerfile():
    docker = (CLUSTER / "Dockerfile").read_text()
    assert "pip install" in docker and "COPY l5dask" in docker
    # the kernels are compiled: every file the build needs is copied into the build stage
    copied = {
        w
        for line in docker.splitlines()
        if line.startswith("COPY ") and "--from" not in line
        for w in line.split()[1:-1]
    }
    assert {"pyproject.toml", "setup.py", "MANIFEST.in", "l5dask"} <= copied
    assert all((ROOT / f).exists() for f in copied)
    assert "cluster/Dockerfile" in (CLUSTER / "README.md").read_text() and IMAGE in (CLUSTER / "README.md").read_text()
    for where, argv, image in commands():
        if argv and argv[0] in ("l5dask", "dask"):
            assert image == IMAGE or (image is None and where.startswith("compose")), where


@pytest.mark.parametrize(
    "where,argv,image",
    [c for c in commands() if c[1] and c[1][0] == "l5dask"],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_l5dask_commands_parse_with_our_cli(where, argv, image):
    ctx = l5dask_cli.make_context("l5dask", list(argv[1:2]))
    command = l5dask_cli.get_command(ctx, argv[1])
    assert command is not None, f"{where}: no l5dask command {argv[1]!r}"
    command.make_context(argv[1], list(argv[2:]))  # raises click.UsageError on an unknown flag


@pytest.mark.parametrize(
    "where,argv,image",
    [c for c in commands() if c[1] and c[1][0] == "dask"],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_dask_commands_use_flags_dask_has(where, argv, image):
    help_text = subprocess.run([sys.executable, "-m", "dask", argv[1], "--help"], capture_output=True, text=True).stdout
    for flag in [a for a in argv[2:] if a.startswith("--")]:
        assert re.search(rf"(^|\s|/){re.escape(flag)}\b", help_text), f"{where}: dask {argv[1]} has no {flag}"


def test_dask_config_is_what_the_code_reads():
    config = yaml.safe_load((CLUSTER / "dask.yaml").read_text())
    assert "scheduler-address" in config and "chunks-per-task" in config["l5dask"]
    with dask.config.set({"scheduler-address": "tcp://10.0.0.1:8786"}):
        assert scheduler_address() == "tcp://10.0.0.1:8786"
    assert scheduler_address("tcp://x:1") == "tcp://x:1"


def nightly() -> tuple[list[str], str, str]:
    """The CronJob's command line, the job file it runs (the ConfigMap's) and that file's path."""
    docs = yaml_docs()["k8s/nightly-cronjob.yaml"]
    cron = [d for d in docs if d["kind"] == "CronJob"][0]
    config = [d for d in docs if d["kind"] == "ConfigMap"][0]
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v.get("configMap", {}).get("name") == config["metadata"]["name"]]
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
    argv = pod["containers"][0]["command"]
    (name,) = config["data"]
    return argv, config["data"][name], f"{mount['mountPath']}/{name}"


def test_the_cronjob_runs_the_job_file_of_its_config_map_with_a_cache_in_a_bucket():
    from l5dask.core import jobfile
    from l5dask.jobs import SYSTEMS

    assert SYSTEMS  # (the analyses registered)
    argv, text, path = nightly()
    assert argv[:3] == ["l5dask", "run", path]
    job = jobfile.check(jobfile.parse_toml(text, "nightly.toml"))  # the schema's checks, no dataset opened
    assert job.cache is not None and job.cache["url"].startswith("s3://")
    outputs = [p for a in job.analyses.values() for k in a.kind.outputs if (p := a.params.get(k))]
    assert outputs and all(p.startswith("s3://") and "{date}/{dataset}/" in p for p in outputs)
    assert job.run["record"].startswith("s3://") and "{date}" in job.run["record"]


def test_worker_settings_everywhere(dask_cluster):
    from distributed import Client

    from l5dask.core.cluster import WORKER_CONFIG, WORKER_ENV

    config = yaml.safe_load((CLUSTER / "dask.yaml").read_text())
    assert {k: str(v) for k, v in config["distributed"]["nanny"]["pre-spawn-environ"].items()} == WORKER_ENV
    for key, value in WORKER_CONFIG.items():  # the dask settings of the workers, in the image's config
        node = config
        for part in key.split("."):
            node = node[part]
        assert node == value, key
    compose = yaml_docs()["docker-compose.yml"][0]
    assert {k: str(v) for k, v in compose["services"]["worker"]["environment"].items() if "MALLOC" in k} == WORKER_ENV
    k8s_worker = yaml_docs()["k8s/daskcluster.yaml"][0]["spec"]["worker"]["spec"]["containers"][0]
    assert {e["name"]: e["value"] for e in k8s_worker["env"] if "MALLOC" in e["name"]} == WORKER_ENV
    with Client(dask_cluster.address, set_as_default=False) as client:  # and real workers get it
        envs = client.run(lambda: {k: __import__("os").environ.get(k) for k in WORKER_ENV})
        configs = client.run(lambda: {k: __import__("dask").config.get(k) for k in WORKER_CONFIG})
    assert all(e == WORKER_ENV for e in envs.values())
    assert all(c == WORKER_CONFIG for c in configs.values())


#: A child process that frees 32 MB of heap (blocks under the mmap threshold, the last at the top)
#: and takes them again, ten times: the page faults of the nine rounds after the first.
_REFAULTS = """
import ctypes, resource, sys
from l5dask.core.policy import tune_malloc
print(tune_malloc() if sys.argv[1] == "tuned" else "untouched")
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def round_():
    blocks = [libc.malloc(4 << 20) for _ in range(8)]
    for b in blocks:
        ctypes.memset(b, 1, 4 << 20)
    for b in reversed(blocks):
        libc.free(b)
round_()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(9):
    round_()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_the_cli_sets_its_malloc_thresholds_in_its_own_process():
    """``tune_malloc`` applies LOCAL_ENV through glibc's mallopt (a child process: the setting is
    process-wide): 32 MB of temporaries freed and taken again are not faulted in again (the
    workers' 8 MB trim threshold gives them back: about 8,000 faults a round); an environment that
    sets one of them is left alone."""
    import os

    from l5dask.core.cluster import WORKER_ENV
    from l5dask.core.policy import LOCAL_ENV

    assert LOCAL_ENV == {**WORKER_ENV, "MALLOC_TRIM_THRESHOLD_": str(256 << 20), "MALLOC_ARENA_MAX": "1"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}

    def child(kind: str, environ: dict) -> tuple[str, int]:
        r = subprocess.run(
            [sys.executable, "-c", _REFAULTS, kind], capture_output=True, text=True, env=environ, check=True
        )
        applied, faults = r.stdout.split()
        return applied, int(faults)

    applied, tuned = child("tuned", env)
    assert applied == "True" and tuned < 1000, tuned
    applied, workers = child("tuned", {**env, **WORKER_ENV})  # (the workers' settings, from the environment)
    assert applied == "False" and workers > 9 * 4000, workers


def test_a_pass_on_local_threads_sets_the_allocator_thresholds_once_unless_configured_not_to(small_ds):
    """``local_malloc``: the first pass of a library's caller on local threads (or "sync") sets
    ``tune_malloc``'s thresholds, not its heaps (a child process: the setting is process-wide); with
    ``l5dask.tune-malloc`` false, or a ``MALLOC_*`` variable set, the allocator is left alone; a
    cluster's client never sets it here."""
    import os

    code = """
import sys, dask
from l5dask.core import policy
with dask.config.set({"l5dask.tune-malloc": sys.argv[1] == "on"}):
    print(policy._MALLOC, end=" ")
    print(policy.compute(dask.delayed(sum)([1, 2]), scheduler=sys.argv[2]), policy._MALLOC)
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}

    def child(*args: str, environ: dict = env) -> str:
        return subprocess.run(
            [sys.executable, "-c", code, *args], capture_output=True, text=True, env=environ, check=True
        ).stdout.strip()

    assert child("on", "threads") == "None 3 True"
    assert child("on", "sync") == "None 3 True"
    assert child("off", "threads") == "None 3 None"
    assert child("on", "threads", environ={**env, "MALLOC_ARENA_MAX": "4"}) == "None 3 False"
    # opening a dataset sets them (a dask collection of it may be computed by dask itself)
    opened = (
        "import sys, l5dask; from l5dask.core import policy; l5dask.open_dataset(sys.argv[1]); print(policy._MALLOC)"
    )
    assert (
        subprocess.run(
            [sys.executable, "-c", opened, small_ds], capture_output=True, text=True, env=env, check=True
        ).stdout.strip()
        == "True"
    )


def test_the_cli_keeps_the_collector_off_its_imports_before_each_local_pass(small_ds, tmp_path):
    """``tune_gc`` (the command line's own process): a pass on local threads first freezes the
    objects alive (``gc.freeze``); without it, or on another scheduler, nothing is frozen (a child
    process: the collector is process-wide)."""
    code = """
import gc, sys
import dask
from dask.threaded import get
from l5dask.core import policy
if sys.argv[1] == "tuned":
    policy.tune_gc()
before = gc.get_freeze_count()
assert policy.compute(dask.delayed(sum)([1, 2]), scheduler="sync") == 3
after_sync = gc.get_freeze_count()
assert policy.compute(dask.delayed(sum)([1, 2]), scheduler=get) == 3
print(before, after_sync, gc.get_freeze_count() > 10_000)
"""
    tuned = subprocess.run([sys.executable, "-c", code, "tuned"], capture_output=True, text=True, check=True)
    assert tuned.stdout.split() == ["0", "0", "True"]
    plain = subprocess.run([sys.executable, "-c", code, "plain"], capture_output=True, text=True, check=True)
    assert plain.stdout.split() == ["0", "0", "False"]
    # the command line tunes its own process: its report's passes froze the imports
    cli = """
import gc, sys
import l5dask.cli
l5dask.cli.main.main(["stats", sys.argv[1], "-q", "-o", sys.argv[2]], standalone_mode=False)
print(gc.get_freeze_count() > 10_000)
"""
    out = subprocess.run(
        [sys.executable, "-c", cli, small_ds, str(tmp_path / "r.json")], capture_output=True, text=True, check=True
    )
    assert out.stdout.split()[-1] == "True"
    assert json.loads((tmp_path / "r.json").read_text())["counts"]["agents"] > 0


def test_the_cli_takes_arrows_buffers_from_glibcs_heap_unless_the_environment_names_a_pool(small_ds, tmp_path):
    """``tune_arrow`` (the command line's own process): Arrow's default pool is the system's, so a
    Parquet output's buffers come from the pass's heap; a pool the environment names is kept, and
    a library's caller (pyarrow imported first) keeps its own (child processes: the pool is
    process-wide)."""
    cli = """
import sys
import l5dask.cli
l5dask.cli.main.main(["catalog", sys.argv[1], "-q", "-o", sys.argv[2]], standalone_mode=False)
import pyarrow as pa
print(pa.default_memory_pool().backend_name)
"""
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    out = tmp_path / "c.parquet"
    got = subprocess.run([sys.executable, "-c", cli, small_ds, str(out)], capture_output=True, text=True, env=env)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split()[-1] == "system" and out.exists()
    named = subprocess.run(
        [sys.executable, "-c", cli, small_ds, str(tmp_path / "d.parquet")],
        capture_output=True,
        text=True,
        env={**env, "ARROW_DEFAULT_MEMORY_POOL": "mimalloc"},
    )
    assert named.stdout.split()[-1] == "mimalloc", named.stderr
    first = "import pyarrow as pa, sys\nfrom l5dask.core import policy\npolicy.tune_arrow()\nprint(pa.default_memory_pool().backend_name)"
    caller = subprocess.run([sys.executable, "-c", first], capture_output=True, text=True, env=env, check=True)
    assert caller.stdout.split()[-1] == pa_default_backend(env)


def pa_default_backend(env: dict) -> str:
    """The pool pyarrow picks by itself in a fresh process (mimalloc or jemalloc, as built)."""
    code = "import pyarrow as pa; print(pa.default_memory_pool().backend_name)"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout.strip()
