"""Bad input to the ``eddyline`` command ends in one clear line, never a traceback.

Each row of :data:`CASES` is a real invocation (its own process, as a user
types it) with something wrong: a log URL, a file that is not a log, a count
of 0, a serde that does not fit, bytes that are not text, a manifest that is
a directory, a garbage member file, a bad address, user code that raises, a
bad environment override, a state directory that is a file. Each must exit
non-zero with exactly one ``error:`` line naming the input, and no traceback.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_processor"
ENVIRONMENT = {name: value for name, value in os.environ.items() if not name.startswith("EDDYLINE")}

RAISING_TOPOLOGY = """\
def topology():
    raise RuntimeError("no topology today")
"""
BROKEN_MODULE = "def topology(:\n"
FAILING_PROCESSOR = """\
from custom_processor import DeduplicateProcessor, topology as example_topology


class Failing(DeduplicateProcessor):
    def process(self, key, value):
        raise ZeroDivisionError("user code divided by zero")


def topology():
    built = example_topology()
    built.nodes["deduplicate"].supplier = Failing
    return built
"""


@dataclass(frozen=True)
class Case:
    name: str
    args: tuple[str, ...]
    expected: tuple[str, ...]  # all in the one error line ({d} is the test's directory)
    stdin: bytes = b""
    env: dict[str, str] = field(default_factory=dict)


CASES = [
    Case("log url scheme", ("log", "--log", "redis://cache:6379", "topics"), ("redis://cache",)),
    Case(
        "log url without scheme", ("log", "--log", "log.db", "topics"), ("'log.db'", "sqlite:///")
    ),
    Case(
        "log file that is not sqlite",
        ("log", "--log", "sqlite:///{d}/notes.txt", "topics"),
        ("{d}/notes.txt", "is not an eddyline log"),
    ),
    Case(
        "log path that is a directory",
        ("log", "--log", "sqlite:///{d}/manifests", "topics"),
        ("{d}/manifests", "is not an eddyline log"),
    ),
    Case(
        "log url under a file",
        ("log", "--log", "sqlite:///{d}/a-file/log.db", "topics"),
        ("{d}/a-file/log.db", "cannot create the directory", "writable directory"),
    ),
    Case(
        "log url under an unwritable directory",
        ("log", "--log", "sqlite:////sys/eddyline-log/log.db", "topics"),
        ("/sys/eddyline-log", "cannot create the directory"),
    ),
    Case(
        "zero partitions",
        ("log", "--log", "{log}", "create-topic", "t0", "--partitions", "0"),
        ("--partitions", "'0'", "at least 1"),
    ),
    Case(
        "empty topic name",
        ("log", "--log", "{log}", "create-topic", ""),
        ("invalid topic name ''", "letters, digits"),
    ),
    Case(
        "topic name with a space",
        ("log", "--log", "{log}", "create-topic", "my topic"),
        ("invalid topic name 'my topic'",),
    ),
    Case(
        "zero records",
        ("log", "--log", "{log}", "consume", "events", "--max", "0"),
        ("--max", "'0'", "at least 1"),
    ),
    Case(
        "serde that does not fit",
        ("log", "--log", "{log}", "consume", "events", "--value-serde", "long"),
        ('--value-serde "long"', "record 0 of events-0", "8 bytes"),
    ),
    Case(
        "serde that does not exist",
        ("log", "--log", "{log}", "consume", "events", "--key-serde", "nosuch:Serde"),
        ('"--key-serde"', "'nosuch:Serde'"),
    ),
    Case(
        "partition that does not exist",
        ("log", "--log", "{log}", "consume", "events", "--partition", "7"),
        ("events-7",),
    ),
    Case(
        "produce to a missing topic",
        ("log", "--log", "{log}", "produce", "nope"),
        ('"nope"', "create it first"),
        stdin=b"a line\n",
    ),
    Case(
        "non-utf-8 input",
        ("log", "--log", "{log}", "produce", "events"),
        ("stdin line 2 is not UTF-8", "0xff"),
        stdin=b"fine\n\xff\xfe bytes\n",
    ),
    Case(
        "manifest that is a directory",
        ("run", "{d}/manifests"),
        ('manifest "{d}/manifests" is a directory', "streamapp.yaml"),
    ),
    Case("manifest that does not exist", ("run", "{d}/missing.yaml"), ("{d}/missing.yaml",)),
    Case("manifest that is not yaml", ("run", "{d}/broken.yaml"), ("{d}/broken.yaml", "YAML")),
    Case(
        "garbage member file",
        ("run", "{d}/streamapp.yaml", "--member-file", "{d}/garbage.json"),
        ('member file "{d}/garbage.json"', "eddyline run"),
    ),
    Case(
        "member file with a wrong shape",
        ("run", "{d}/streamapp.yaml", "--member-file", "{d}/shapeless.json"),
        ('member file "{d}/shapeless.json"',),
    ),
    Case(
        "application.server without a port",
        ("run", "{d}/nohostport.yaml", "--until-caught-up"),
        ('"application.server"', "'nohostport'", "host:port"),
    ),
    Case(
        "topology function that raises",
        ("run", "{d}/raising.yaml", "--until-caught-up"),
        ('"raising_topology:topology"', "RuntimeError: no topology today", "raising_topology.py:2"),
    ),
    Case(
        "topology module that does not parse",
        ("run", "{d}/broken_module.yaml", "--until-caught-up"),
        ('"broken_module:topology"', "SyntaxError", "broken_module.py:1"),
    ),
    Case(
        "topology module that exits",
        ("run", "{d}/exiting_module.yaml", "--until-caught-up"),
        ('"exiting_module:topology"', "sys.exit(3)"),
    ),
    Case(
        "topology function that exits",
        ("run", "{d}/exiting_function.yaml", "--until-caught-up"),
        ('"exiting_function:topology"', "sys.exit(4)"),
    ),
    Case(
        "logs dir that is a file",
        ("run", "{d}/two_replicas.yaml", "--logs-dir", "{d}/a-file"),
        ("--logs-dir {d}/a-file is a file",),
    ),
    Case(
        "processor that raises",
        ("run", "{d}/failing.yaml", "--until-caught-up"),
        ("ZeroDivisionError: user code divided by zero", "events-0 at offset 0"),
    ),
    Case(
        "state dir that is a file",
        ("run", "{d}/state_file.yaml", "--until-caught-up"),
        ('"state.dir"', "{d}/a-file", "it is a file"),
    ),
    Case(
        "state dir that cannot be created",
        ("run", "{d}/unwritable.yaml", "--until-caught-up"),
        ('"state.dir"', "/sys/eddyline-state", "make it writable"),
    ),
    Case(
        "bad environment override",
        ("run", "{d}/streamapp.yaml", "--until-caught-up"),
        ("EDDYLINE_COMMIT_INTERVAL_MS", "'soon'", '"commit.interval.ms"'),
        env={"EDDYLINE_COMMIT_INTERVAL_MS": "soon"},
    ),
    Case(
        "config file that does not exist",
        ("run", "{d}/streamapp.yaml", "--config", "{d}/missing.properties"),
        ("{d}/missing.properties",),
    ),
    Case(
        "query address without a port",
        ("query", "--bootstrap", "nohostport", "counts", "k"),
        ("nohostport",),
    ),
]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A log with an ``events`` topic holding one text record, and manifests to break."""
    directory = tmp_path_factory.mktemp("bad-input")
    log = SqliteLog(directory / "log.db")
    log.create_topic("events", 1)
    log.produce(TopicPartition("events", 0), [Record(b"e1", b"{}", 0)])
    log.close()
    shutil.copy(EXAMPLE / "custom_processor.py", directory / "custom_processor.py")
    (directory / "raising_topology.py").write_text(RAISING_TOPOLOGY, encoding="utf-8")
    (directory / "broken_module.py").write_text(BROKEN_MODULE, encoding="utf-8")
    (directory / "failing_processor.py").write_text(FAILING_PROCESSOR, encoding="utf-8")
    (directory / "exiting_module.py").write_text("import sys\nsys.exit(3)\n", encoding="utf-8")
    (directory / "exiting_function.py").write_text(
        "import sys\n\ndef topology():\n    sys.exit(4)\n", encoding="utf-8"
    )
    (directory / "notes.txt").write_text("these are notes, not a log\n" * 100, encoding="utf-8")
    (directory / "manifests").mkdir()
    (directory / "broken.yaml").write_text("spec: [unclosed\n", encoding="utf-8")
    (directory / "garbage.json").write_text("not json at all", encoding="utf-8")
    (directory / "shapeless.json").write_text('{"generation": 1}', encoding="utf-8")
    (directory / "a-file").write_text("", encoding="utf-8")

    def manifest(name: str, topology: str = "custom_processor:topology", **config: str) -> None:
        document = yaml.safe_load((EXAMPLE / "streamapp.yaml").read_text(encoding="utf-8"))
        document["spec"]["topology"] = topology
        document["spec"]["log"]["url"] = f"sqlite:///{directory / 'log.db'}"
        document["spec"]["config"]["state.dir"] = str(directory / f"state-{name}")
        document["spec"]["config"]["commit.interval.ms"] = 100
        document["spec"]["config"].update(config)
        (directory / f"{name}.yaml").write_text(yaml.safe_dump(document), encoding="utf-8")

    manifest("streamapp")
    manifest("nohostport", **{"application.server": "nohostport"})
    manifest("raising", topology="raising_topology:topology")
    manifest("broken_module", topology="broken_module:topology")
    manifest("failing", topology="failing_processor:topology")
    manifest("exiting_module", topology="exiting_module:topology")
    manifest("exiting_function", topology="exiting_function:topology")
    manifest("two_replicas")
    two = yaml.safe_load((directory / "two_replicas.yaml").read_text(encoding="utf-8"))
    two["spec"]["replicas"] = 2
    (directory / "two_replicas.yaml").write_text(yaml.safe_dump(two), encoding="utf-8")
    manifest("state_file", **{"state.dir": str(directory / "a-file")})
    manifest("unwritable", **{"state.dir": "/sys/eddyline-state"})
    return directory


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_bad_input_ends_in_one_error_line_naming_it_and_no_traceback(
    workspace: Path, case: Case
) -> None:
    if "/sys/" in " ".join(case.expected) and not Path("/sys").is_dir():
        pytest.skip("needs a read-only /sys")

    def filled(text: str) -> str:
        return text.replace("{d}", str(workspace)).replace(
            "{log}", f"sqlite:///{workspace / 'log.db'}"
        )

    result = subprocess.run(
        [sys.executable, "-m", "eddyline_runtime.cli", *(filled(a) for a in case.args)],
        cwd=workspace,
        env={**ENVIRONMENT, **case.env},
        input=case.stdin,
        capture_output=True,
        timeout=60,
        check=False,
    )
    stderr = result.stderr.decode(errors="replace")
    assert result.returncode != 0, stderr
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, stderr
    for expected in case.expected:
        assert filled(expected) in errors[0], (expected, errors[0])
    assert "unexpected" not in errors[0], errors[0]  # a message we wrote, not the last resort


def test_an_unexpected_error_is_one_line_too_and_traceback_shows_it(tmp_path: Path) -> None:
    """The last resort: an error we did not foresee is still one line; --traceback prints it."""
    manifest = tmp_path / "streamapp.yaml"
    manifest.write_bytes(b"\xff\xfe not text")  # the manifest reader expects UTF-8
    command = [sys.executable, "-m", "eddyline_runtime.cli"]
    plain = subprocess.run(
        [*command, "run", str(manifest)],
        env=ENVIRONMENT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert plain.returncode == 1
    assert "Traceback" not in plain.stderr
    assert len(plain.stderr.strip().splitlines()) == 1, plain.stderr
    verbose = subprocess.run(
        [*command, "--traceback", "run", str(manifest)],
        check=False,
        env=ENVIRONMENT,
        capture_output=True,
        text=True,
    )
    assert verbose.returncode == 1
    assert "Traceback" in verbose.stderr


@pytest.mark.slow
def test_a_corrupted_sst_is_reported_as_store_corruption_with_the_operator_action(
    tmp_path: Path,
) -> None:
    """Not "fix the topology (or the record)": the store's files are at fault."""
    shutil.copy(EXAMPLE / "custom_processor.py", tmp_path / "custom_processor.py")
    document = yaml.safe_load((EXAMPLE / "streamapp.yaml").read_text(encoding="utf-8"))
    document["spec"]["log"]["url"] = f"sqlite:///{tmp_path / 'log.db'}"
    document["spec"]["config"]["state.dir"] = str(tmp_path / "state")
    manifest = tmp_path / "streamapp.yaml"
    manifest.write_text(yaml.safe_dump(document), encoding="utf-8")
    log = SqliteLog(tmp_path / "log.db")
    events = TopicPartition("events", 0)
    log.create_topic("events", 1)
    log.produce(events, [Record(f"e{i}".encode(), b"{}", i) for i in range(20_000)])
    command = [sys.executable, "-m", "eddyline_runtime.cli", "run", str(manifest)]

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*command, "--until-caught-up"],
            cwd=tmp_path,
            env=ENVIRONMENT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    first = run()
    assert first.returncode == 0, first.stderr
    store = tmp_path / "state" / "0_0" / "seen-event-ids"
    tables = sorted(store.glob("*.sst"), key=lambda p: p.stat().st_size)
    assert tables, sorted(p.name for p in store.iterdir())
    damaged = bytearray(tables[-1].read_bytes())
    for position in range(1_000, min(len(damaged) - 4_096, 120_000), 7):
        damaged[position] ^= 0xFF
    tables[-1].write_bytes(bytes(damaged))
    # Seen ids again: the processor reads them back from the damaged table.
    log.produce(events, [Record(f"e{i}".encode(), b"{}", 20_000 + i) for i in range(100)])
    log.close()

    second = run()
    assert second.returncode == 1, second.stderr
    assert "Traceback" not in second.stderr
    errors = [line for line in second.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, second.stderr
    assert 'state store "seen-event-ids"' in errors[0] and "is corrupted" in errors[0]
    assert f"delete the directory {store}" in errors[0]
    assert "fix the topology" not in errors[0]
