"""The project's images, run as containers by the project's own engine (marker ``container``).

What the kubelet stand-in cannot show, because it runs pods as processes of the test venv: that
each image runs as its non-root user, that its commands exist in it, that the operator comes up
and answers its health endpoint, that a StreamApp pod's process writes nothing outside its
volume (read-only root file system, no network), that SIGTERM reaches the process as PID 1 and
ends in a final commit within the grace period, and that the restore image's JVM and jars run a
Spark build. The images are the ones ``make test`` builds on the stand-in bases
(tests/support/images.py).
"""

from __future__ import annotations

import base64
import collections
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from eddyline_runtime.log import SqliteLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.serde import serde_for
from tests.support.control_plane.cluster import Cluster
from tests.support.http_client import http_get
from tests.support.images import DOCKER_TIMEOUT, IMAGE_UID, REPO, Images
from tests.support.ports import free_port
from tests.support.waiting import wait_for

# The first test to run waits for a cold build of the images (minutes; the fixture's).
pytestmark = [pytest.mark.container, pytest.mark.slow, pytest.mark.timeout(1800)]

WORDCOUNT = REPO / "examples" / "wordcount"
THROTTLED = REPO / "tests" / "support" / "topologies" / "throttled_wordcount.py"
VOLUME = "/var/lib/eddyline"
# Where the pods find their manifest: the operator's ConfigMap, mounted read-only.
CONFIG = "/etc/eddyline"
LOG_URL = f"sqlite:///{VOLUME}/log.db"
WORDS = [f"w{i}" for i in range(300)]
# `docker stop`'s grace period: SIGTERM, then SIGKILL (exit code 137) after this many seconds,
# as the kubelet's terminationGracePeriodSeconds does.
GRACE_SECONDS = 30
SIGKILLED = 137
# What a pod's securityContext asks of the runtime (the chart and the operator write it).
RESTRICTED = ["--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
PROGRESS = re.compile(r"processed ([\d,]+) records")
# The host's local CA directory, which scripts/base-images copies into the stand-ins.
CA_DIR = Path("/usr/local/share/ca-certificates")


def text(count: int, seed: int = 1) -> list[str]:
    return [
        " ".join(WORDS[(seed * 7 + i * j) % len(WORDS)] for j in range(1, 6)) for i in range(count)
    ]


def expected_counts(lines: list[str]) -> dict[str, int]:
    return dict(collections.Counter(word for line in lines for word in line.lower().split()))


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    """The pod's volume: a directory only the image's user owns."""
    path = tmp_path / "volume"
    path.mkdir()
    shutil.chown(path, IMAGE_UID, IMAGE_UID)
    return path


def config_dir(tmp_path: Path, topology: str, **settings: object) -> Path:
    """A manifest as the operator's ConfigMap carries it (with a topology module beside it
    when the image lacks one), to mount read-only."""
    directory = tmp_path / "config"
    directory.mkdir(exist_ok=True)
    document = yaml.safe_load((WORDCOUNT / "streamapp.yaml").read_text(encoding="utf-8"))
    document["spec"]["topology"] = topology
    document["spec"]["log"]["url"] = LOG_URL
    document["spec"]["config"]["state.dir"] = f"{VOLUME}/state"
    document["spec"]["config"].update(settings)
    (directory / "streamapp.yaml").write_text(yaml.safe_dump(document), encoding="utf-8")
    return directory


def pod_options(volume: Path, config: Path) -> list[str]:
    return [*RESTRICTED, "-v", f"{volume}:{VOLUME}", "-v", f"{config}:{CONFIG}:ro"]


def load_input(images: Images, volume: Path, lines: list[str], partitions: int) -> None:
    """Create the input topic and produce ``lines`` with the image's own `eddyline log`."""
    options = [*RESTRICTED, "-v", f"{volume}:{VOLUME}"]
    created = images.run(
        images.examples,
        *("eddyline", "log", "--log", LOG_URL, "create-topic", "text-lines"),
        *("--partitions", str(partitions)),
        options=options,
    )
    assert created.returncode == 0, created.stderr
    produced = images.run(
        images.examples,
        *("eddyline", "log", "--log", LOG_URL, "produce", "text-lines"),
        options=options,
        stdin="".join(f"{line}\n" for line in lines),
    )
    assert produced.returncode == 0, produced.stderr


def word_counts(volume: Path) -> dict[str, int]:
    """The last count published per word, read from the log on the volume."""
    log = SqliteLog(volume / "log.db")
    try:
        string, long = serde_for("string"), serde_for("long")
        counts: dict[str, int] = {}
        for partition in range(log.topics()["word-counts"].partitions):
            fetched = log.fetch(TopicPartition("word-counts", partition), 0, 1_000_000)
            for record in fetched.records:
                assert record.key is not None and record.value is not None
                counts[string.deserialize(record.key)] = long.deserialize(record.value)
        return counts
    finally:
        log.close()


def committed_lines(volume: Path) -> int:
    log = SqliteLog(volume / "log.db")
    try:
        partitions = [
            TopicPartition("text-lines", p) for p in range(log.topics()["text-lines"].partitions)
        ]
        return sum(log.committed_offsets("wordcount", partitions).values())
    finally:
        log.close()


def owners(volume: Path) -> set[int]:
    return {path.stat().st_uid for path in volume.rglob("*")}


@pytest.fixture
def detached(images: Images) -> Iterator[list[str]]:
    """Ids of the detached containers a test starts; removed, running or not, when it ends."""
    ids: list[str] = []
    yield ids
    for container in ids:
        images.docker("rm", "--force", "--volumes", container)


def start(images: Images, detached: list[str], *run_args: str) -> str:
    """``docker run --detach``; the container's id (removed when the test ends)."""
    started = images.docker("run", "--detach", *run_args)
    assert started.returncode == 0, started.stderr
    detached.append(started.stdout.strip())
    return detached[-1]


def test_every_image_runs_as_its_non_root_user(images: Images) -> None:
    for image in (images.eddyline, images.examples, images.restore):
        configured = images.docker("image", "inspect", "-f", "{{.Config.User}}", image)
        assert configured.stdout.strip() == str(IMAGE_UID), image
        who = images.run(image, "-u", options=["--entrypoint", "id"])
        assert who.returncode == 0, who.stderr
        assert who.stdout.strip() == str(IMAGE_UID), image


def test_eddyline_help_runs_in_every_image(images: Images) -> None:
    for image in (images.eddyline, images.examples):
        shown = images.run(image)  # the image's CMD: eddyline --help
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.startswith("usage: eddyline "), shown.stdout
    # The restore image's entrypoint is `eddyline restore`.
    shown = images.run(images.restore, "--help")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("usage: eddyline restore "), shown.stdout
    operator = images.run(images.eddyline, "eddyline-operator", "--help")
    assert operator.returncode == 0, operator.stderr
    assert "Usage: eddyline-operator" in operator.stdout


def test_the_word_count_writes_only_its_volume_with_a_read_only_root_and_no_network(
    images: Images, volume: Path, tmp_path: Path
) -> None:
    lines = text(2_000)
    load_input(images, volume, lines, partitions=4)
    config = config_dir(tmp_path, "wordcount:topology")

    # No /tmp either: a write anywhere but the volume fails the run.
    ran = images.run(
        images.examples,
        *("eddyline", "run", f"{CONFIG}/streamapp.yaml", "--until-caught-up"),
        options=pod_options(volume, config),
    )

    assert ran.returncode == 0, ran.stderr
    assert "input lag 0" in ran.stderr
    assert word_counts(volume) == expected_counts(lines)
    assert owners(volume) == {IMAGE_UID}  # everything on it written by the image's user
    assert (volume / "state").is_dir()


def test_sigterm_commits_then_exits_within_the_grace_period(
    images: Images, volume: Path, tmp_path: Path, detached: list[str]
) -> None:
    # Each line costs 1 ms (throttled_wordcount), so the run is still busy when SIGTERM
    # comes, and no commit falls due on its own: whatever is committed, the shutdown did.
    total = 5_000
    lines = text(total, seed=2)
    load_input(images, volume, lines, partitions=1)
    config = config_dir(tmp_path, "throttled_wordcount:topology", **{"commit.interval.ms": 600_000})
    shutil.copy(THROTTLED, config / THROTTLED.name)
    name = start(
        images, detached, "--network", "none", *pod_options(volume, config),
        images.examples, "eddyline", "run", f"{CONFIG}/streamapp.yaml",
    )  # fmt: skip

    def processing() -> bool:
        progress = PROGRESS.findall(images.docker("logs", name).stderr)
        return bool(progress) and int(progress[-1].replace(",", "")) > 0

    wait_for(processing, "the first processed records")
    assert committed_lines(volume) == 0

    stopped = images.docker("stop", "--time", str(GRACE_SECONDS), name)
    assert stopped.returncode == 0, stopped.stderr
    state = images.docker("inspect", "-f", "{{.State.ExitCode}}", name).stdout.strip()
    output = images.docker("logs", name).stderr
    assert state != str(SIGKILLED), f"not stopped within {GRACE_SECONDS} s:\n{output}"
    assert state == "0", output
    assert "Traceback" not in output
    assert output.rstrip().splitlines()[-1].endswith("commits 1"), output  # the shutdown's
    committed = committed_lines(volume)
    assert 0 < committed < total  # stopped while busy, and what it had done is committed

    # Restarted, it goes on from that commit: every word counted exactly once.
    ran = images.run(
        images.examples,
        *("eddyline", "run", f"{CONFIG}/streamapp.yaml", "--until-caught-up"),
        options=pod_options(volume, config),
    )
    assert ran.returncode == 0, ran.stderr
    assert word_counts(volume) == expected_counts(lines)


def admin_kubeconfig(cluster: Cluster, directory: Path) -> Path:
    """The control plane's admin kubeconfig with its files inline, readable by the image's
    user (the original names key files only root may read)."""
    document = yaml.safe_load(cluster.kubeconfig.read_text(encoding="utf-8"))
    for entry, fields in (("clusters", ("certificate-authority",)),
                          ("users", ("client-certificate", "client-key"))):  # fmt: skip
        for item in document[entry]:
            section = item["cluster" if entry == "clusters" else "user"]
            for field in fields:
                data = Path(section.pop(field)).read_bytes()
                section[f"{field}-data"] = base64.b64encode(data).decode()
    path = directory / "kubeconfig"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    path.chmod(0o644)
    return path


def test_the_operator_starts_and_answers_its_health_endpoint(
    images: Images, control_plane: Cluster, tmp_path: Path, detached: list[str]
) -> None:
    kubeconfig = admin_kubeconfig(control_plane, tmp_path)
    port = free_port()
    # The host's network: the tests' API server listens on loopback. /tmp as the chart's
    # emptyDir; nothing else is writable.
    name = start(
        images, detached, "--network", "host", *RESTRICTED,
        "--tmpfs", "/tmp", "-v", f"{kubeconfig}:{CONFIG}/kubeconfig:ro",
        "-e", f"KUBECONFIG={CONFIG}/kubeconfig",
        "-e", f"EDDYLINE_OPERATOR_LIVENESS=http://127.0.0.1:{port}/healthz",
        "-e", "WATCH_NAMESPACES=eddyline-container-test",
        images.eddyline, "eddyline-operator",
    )  # fmt: skip

    def healthy() -> bool:
        running = images.docker("inspect", "-f", "{{.State.Running}}", name).stdout.strip()
        assert running == "true", images.docker("logs", name).stderr
        return http_get(f"127.0.0.1:{port}", "/healthz").status == 200

    wait_for(healthy, "the operator's /healthz answering 200", timeout=120, interval=0.5)
    top = images.docker("top", name, "-o", "pid,uid,cmd")
    assert top.returncode == 0, top.stderr
    assert all(row.split()[1] == str(IMAGE_UID) for row in top.stdout.splitlines()[1:]), top.stdout

    stopped = images.docker("stop", "--time", str(GRACE_SECONDS), name)
    assert stopped.returncode == 0, stopped.stderr
    state = images.docker("inspect", "-f", "{{.State.ExitCode}}", name).stdout.strip()
    assert state != str(SIGKILLED), images.docker("logs", name).stderr


def test_the_restore_image_builds_a_store_with_its_jvm(
    images: Images, volume: Path, tmp_path: Path
) -> None:
    # Spark's Kubernetes support comes with PySpark's own jars; the Kafka connector is the
    # image's addition (docs/containers.md).
    jars = images.run(
        images.restore,
        "-c",
        "ls $(python -c 'import pyspark, os; print(os.path.dirname(pyspark.__file__))')/jars "
        "$EDDYLINE_SPARK_KAFKA_JARS; java -version",
        options=["--entrypoint", "sh"],
    )
    assert jars.returncode == 0, jars.stderr
    assert re.search(r"^spark-kubernetes_2\.13-[\d.]+\.jar$", jars.stdout, re.MULTILINE)
    assert re.search(r"^spark-sql-kafka-0-10_2\.13-[\d.]+\.jar$", jars.stdout, re.MULTILINE)
    assert 'version "17.' in jars.stderr

    # A small changelog: the word count run to the end in the examples image.
    lines = text(400, seed=3)
    load_input(images, volume, lines, partitions=2)
    config = config_dir(tmp_path, "wordcount:topology")
    ran = images.run(
        images.examples,
        *("eddyline", "run", f"{CONFIG}/streamapp.yaml", "--until-caught-up"),
        options=pod_options(volume, config),
    )
    assert ran.returncode == 0, ran.stderr
    # The restore image carries no examples: the build imports the topology (to find the
    # store's changelog) from beside the manifest.
    shutil.copy(WORDCOUNT / "wordcount.py", config / "wordcount.py")

    # As the restore Job's pod: read-only root, /tmp an emptyDir, no network (local[2]), and a
    # hostname that resolves, as the kubelet's /etc/hosts gives every pod.
    built = images.run(
        images.restore,
        *("build", "--manifest", f"{CONFIG}/streamapp.yaml", "--store", "word-counts"),
        *("--output", f"{VOLUME}/restore", "--master", "local[2]"),
        *("--conf", "spark.ui.showConsoleProgress=false"),
        options=[
            *pod_options(volume, config), "--tmpfs", "/tmp",
            "--hostname", "restore", "--add-host", "restore:127.0.0.1",
        ],
    )  # fmt: skip

    assert built.returncode == 0, built.stderr
    summary = json.loads(built.stdout.strip().splitlines()[-1])
    assert summary["partitions"] == 2
    assert summary["keys"] == len(expected_counts(lines))
    manifests = list((volume / "restore").glob("wordcount/word-counts/*/*.manifest.json"))
    assert len(manifests) == 2, manifests
    assert owners(volume) == {IMAGE_UID}


@pytest.mark.parametrize(
    ("kind", "stands_in_for"),
    [("python", "python:3.11-slim"), ("maven", "maven:3.9-eclipse-temurin-17")],
)
def test_a_stand_in_base_is_built_once_per_content_and_says_what_it_stands_in_for(
    images: Images, kind: str, stands_in_for: str
) -> None:
    again = subprocess.run(
        [REPO / "scripts" / "base-images", kind],
        capture_output=True,
        text=True,
        timeout=DOCKER_TIMEOUT,
        check=False,
    )
    assert again.returncode == 0, again.stderr
    assert "built" not in again.stderr  # the images fixture built it; its inputs are unchanged
    reference = again.stdout.strip()
    labels = json.loads(
        images.docker("image", "inspect", "-f", "{{json .Config.Labels}}", reference).stdout
    )
    assert labels["dev.eddyline.content-hash"] == reference.rpartition(":")[2]
    assert labels["dev.eddyline.stands-in-for"].startswith(f"{stands_in_for}: ")
    # The machine's egress CA is in the stand-in's trust store (and only the stand-ins').
    local_cas = sorted(p.name for p in CA_DIR.glob("*.crt")) if CA_DIR.is_dir() else []
    listed = images.run(reference, "ls", "/usr/local/share/ca-certificates")
    assert sorted(listed.stdout.split()) == local_cas
