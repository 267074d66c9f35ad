"""Issue 23, item 9: the cluster quickstart with the embedded log works as documented.

On the real control plane: the word count applied before its input topic exists crashes,
and the StreamApp's Degraded condition says why (the container's termination message);
then the commands of docs/operator.md ("Input topics of the embedded log") run verbatim
through bash and the real ``kubectl``, and the app becomes Ready.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.control_plane.client import wait_until
from tests.support.control_plane.operator import Operator
from tests.support.control_plane.operator_fixture import operator_fixture

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "operator.md"
NAMESPACE = "quickstart"
APP = "wordcount"
# Bounds for a broken run on a loaded 2-core machine, not expectations.
TIMEOUT = 300
# The documented commands carry their own waits (120 s for the topic pod, 300 s for Ready,
# plus the deletes' grace periods): the script's bound must not be shorter than theirs.
# (CI once hit the old 360 s bound: not a slow run but `kubectl delete pod -l ...` waiting
# forever, see test_the_documented_restart_does_not_wait_for_recreated_pods.)
SCRIPT_TIMEOUT = 600


def documented_commands() -> list[str]:
    """The shell lines between the markers of docs/operator.md, continuations joined."""
    text = DOCS.read_text(encoding="utf-8")
    found = re.search(
        r"<!-- embedded-log-topics:begin -->\n```sh\n(.*?)```\n<!-- embedded-log-topics:end -->",
        text,
        re.DOTALL,
    )
    assert found, "docs/operator.md lost its embedded-log-topics block"
    commands: list[str] = []
    pending = ""
    for line in found.group(1).splitlines():
        pending += line + "\n"
        if line.endswith("\\") or pending.count("'") % 2:
            continue  # a continued line, or inside the quoted --overrides
        commands.append(pending)
        pending = ""
    assert not pending
    return commands


operator = operator_fixture(NAMESPACE, directory="operator-quickstart")


def shell(operator: Operator, script: str, home: Path) -> str:
    """``script`` through bash, with the admin's kubeconfig set to the test's namespace."""
    kubeconfig = home / "kubeconfig"
    if not kubeconfig.exists():
        home.mkdir(parents=True, exist_ok=True)
        shutil.copy(operator.cluster.kubeconfig, kubeconfig)
        operator.kubectl.env["KUBECONFIG"] = str(kubeconfig)
        operator.kubectl("config", "set-context", "--current", f"--namespace={NAMESPACE}")
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "KUBECONFIG": str(kubeconfig)}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=SCRIPT_TIMEOUT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{script}\nexited {done.returncode}:\n{done.stderr}"
    return done.stdout


def test_the_documented_restart_does_not_wait_for_recreated_pods() -> None:
    """The StatefulSet recreates a deleted pod at once under its name. ``kubectl delete``
    then waits for the old pod with a GET followed by a list+watch by name: when the old pod
    is gone and the new one there in between, it waits for the new one to be deleted, for
    ever (CI: the script hung until its bound, the app long Ready). The documented restart
    must not wait; the documented ``kubectl wait ... Ready`` after it does."""
    deletes = [c for c in documented_commands() if c.startswith("kubectl delete pod -l")]
    assert deletes, "docs/operator.md no longer restarts the app's pods"
    for command in deletes:
        assert "--wait=false" in command, command


@pytest.mark.timeout(1000)
def test_the_documented_topic_step_makes_the_crashing_quickstart_ready(
    operator: Operator, tmp_path: Path
) -> None:
    commands = documented_commands()
    apply, rest = commands[0], commands[1:]
    assert apply.startswith("kubectl apply -f examples/wordcount/streamapp.cluster.yaml")
    shell(operator, apply, tmp_path / "home")

    def crash_explained() -> bool:
        degraded = operator.condition(APP, "Degraded")
        return bool(
            degraded
            and degraded["reason"] == "CrashLoopBackOff"
            and "text-lines do not exist" in degraded["message"]
        )

    try:
        wait_until(crash_explained, "Degraded=CrashLoopBackOff naming text-lines", TIMEOUT)
    except TimeoutError:
        print(operator.describe_failure(APP))
        raise
    message = str((operator.condition(APP, "Degraded") or {})["message"])
    assert "exit code 1" in message and "create-topic" in message, message
    shell(operator, "".join(rest), tmp_path / "home")

    def ready() -> bool:
        # The restart does not wait for the old pods to go: a Ready read by the script's
        # `kubectl wait` just before the operator saw them deleted is followed by Ready again.
        condition = operator.condition(APP, "Ready")
        return condition is not None and condition["status"] == "True"

    wait_until(ready, "Ready=True after the documented commands", TIMEOUT)
    assert operator.get("", "pods", f"{APP}-topics") is None
