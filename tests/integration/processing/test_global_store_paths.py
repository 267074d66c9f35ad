"""A global store on every state path: several members and standbys, KIP-816 relocation,
Spark restore builds and ingest, the member report.

A global store has no task, so it takes none of the paths a task's store takes: each
member holds it whole (no standby copies, nothing handed over when tasks move),
relocation never moves it, and a Spark build or ingest is refused, saying why.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from eddyline_runtime.assignor import Member, assign
from eddyline_runtime.cli import main
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.engine.topics import resolve_topics, store_homes
from eddyline_runtime.log import SqliteLog
from eddyline_runtime.partitions import TaskId
from eddyline_runtime.query.layout import member_report
from eddyline_runtime.query.server import QueryServer
from eddyline_runtime.state import global_store_directory, store_directory
from eddyline_runtime.state.relocation import relocate_state
from tests.integration.processing.test_global_tables import (
    STORE,
    config,
    create_topics,
    outputs,
    produce_orders,
    produce_rates,
    topology,
)
from tests.support.http_client import http_get
from tests.support.ports import free_port

TIMEOUT = 60
APP = "global-tables"  # test_global_tables.config's application.id


def test_every_member_holds_the_whole_global_store_and_none_keeps_a_standby(
    tmp_path: Path,
) -> None:
    """Two members, ``num.standby.replicas: 1``: each runs its share of the stream's
    tasks against its own whole copy of the global store, any member answers any key of
    it, and neither reports a task copy (active or standby) of it."""
    log = SqliteLog(tmp_path / "log.db")
    create_topics(log)
    produce_rates(log, {"EUR": "1.10", "GBP": "1.27", "JPY": "0.0067"})
    members = [Member(m, address=f"127.0.0.1:{free_port()}") for m in ("a", "b")]
    layout = resolve_topics(topology(), APP, log)
    assignment = assign(layout.tasks(), members, 1, stateful=layout.stateful_tasks())
    assert assignment.active["a"] and assignment.active["b"]  # the stream's tasks are shared
    assert not any(assignment.standby.values())  # no task store: nothing to keep standby
    instances, servers = [], []
    try:
        for member in members:
            assert member.address is not None
            settings = {"num.standby.replicas": 1, "application.server": member.address}
            instance = StreamsInstance(
                topology(),
                config(tmp_path / f"state-{member.id}", **settings),
                SqliteLog(tmp_path / "log.db"),
                instance_id=member.id,
                member=member,
                assignment=assignment,
            )
            instance.start()
            instances.append(instance)
            server = QueryServer(instance, "127.0.0.1", int(member.address.rpartition(":")[2]))
            server.start()
            servers.append(server)
        orders = [(f"o{i}", ("EUR", "GBP", "JPY")[i % 3], i) for i in range(12)]
        produce_orders(log, orders)
        for instance in instances:
            instance.wait_until_caught_up(TIMEOUT)
        joined = outputs(log)
        assert sorted(joined) == sorted(order_id for order_id, _, _ in orders)
        for member, instance in zip(members, instances, strict=True):
            assert member.address is not None
            assert instance.processed < len(orders)  # each ran only its own partitions
            for currency, rate in (("EUR", "1.10"), ("JPY", "0.0067")):
                body = http_get(member.address, f"/v1/stores/{STORE}/keys/{currency}").json()
                assert body["value"] == rate and body["global"] is True
            report = member_report(instance)
            assert STORE not in report.stores and STORE not in report.store_owners
            assert report.global_stores[STORE].bootstrapped
            assert report.ready
            assert global_store_directory(tmp_path / f"state-{member.id}", STORE).is_dir()
    finally:
        for server in servers:
            server.stop()
        for instance in instances:
            instance.close(TIMEOUT)
            instance.log.close()
        log.close()


def test_relocation_never_moves_a_global_store(tmp_path: Path) -> None:
    """KIP-816: a store of the global store's name in a task directory (an older topology
    had it as a task store) is left alone, saying why; the global store stays put."""
    state = tmp_path / "state"
    old_copy = store_directory(state, TaskId(0, 0), STORE)
    old_copy.mkdir(parents=True)
    (old_copy / "CURRENT").write_text("an older topology's task store\n")
    global_copy = global_store_directory(state, STORE)
    global_copy.mkdir(parents=True)
    (global_copy / "CURRENT").write_text("the global store\n")

    report = relocate_state(state, store_homes(topology()))
    assert report.moves == ()
    [left] = report.left_alone
    assert left.store == STORE and "global store" in left.reason
    assert (old_copy / "CURRENT").exists() and (global_copy / "CURRENT").exists()


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    """A StreamApp manifest whose topology has the global table (its module beside it)."""
    (tmp_path / "global_app.py").write_text(
        "from tests.integration.processing.test_global_tables import topology\n"
    )
    (tmp_path / "streamapp.yaml").write_text(
        f"""apiVersion: eddyline.dev/v1alpha1
kind: StreamApp
metadata:
  name: {APP}
spec:
  topology: global_app:topology
  image: example/image:1
  log:
    url: sqlite:///{tmp_path}/log.db
  config:
    state.dir: {tmp_path}/state
"""
    )
    SqliteLog(tmp_path / "log.db").close()
    return tmp_path


@pytest.mark.parametrize("action", ["build", "ingest"])
def test_spark_restore_refuses_a_global_store(
    app_dir: Path, action: str, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = str(app_dir / "streamapp.yaml")
    args = ["restore", action, "--manifest", manifest, "--store", STORE]
    if action == "build":
        args += ["--output", str(app_dir / "builds")]
    else:
        args += ["--partition", "0", "--from", str(app_dir / "builds")]
    assert main(args) == 1
    error = capsys.readouterr().err
    assert f'store "{STORE}" is a global store' in error
    assert "no Spark restore build serves it" in error
