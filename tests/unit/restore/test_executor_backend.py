"""``eddyline restore executor``: the executor JVM's command from the pod's environment, and
why a failed driver failed, from its output."""

from __future__ import annotations

from pathlib import Path

import pytest

from eddyline_runtime import cli
from eddyline_runtime.restore.spark.executor_backend import (
    BACKEND_CLASS,
    ExecutorStartError,
    executor_command,
)
from eddyline_runtime.restore.spark.job_runner import driver_reason, judge_build

# What a Spark 4.2 driver put in an executor pod's environment (names as Spark sets them).
SPARK_ENV = {
    "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@10.244.1.5:7078",
    "SPARK_EXECUTOR_ID": "2",
    "SPARK_EXECUTOR_CORES": "1",
    "SPARK_APPLICATION_ID": "spark-application-1",
    "SPARK_EXECUTOR_POD_IP": "10.244.2.7",
    "SPARK_RESOURCE_PROFILE_ID": "0",
    "SPARK_EXECUTOR_POD_NAME": "eddyline-restore-totals-exec-2",
    "SPARK_EXECUTOR_MEMORY": "1024m",
    "SPARK_JAVA_OPT_10": "-Dten",
    "SPARK_JAVA_OPT_2": "-Dtwo",
    "SPARK_JAVA_OPT_0": "-Dspark.driver.port=7078",
}


def test_the_command_is_the_kubernetes_executor_backend_with_the_drivers_settings() -> None:
    command = executor_command(SPARK_ENV, home=Path("/spark"), java="/usr/bin/java")
    assert command[:6] == [
        "/usr/bin/java",
        "-Dspark.driver.port=7078",
        "-Dtwo",
        "-Dten",  # numeric order, as the driver numbered them
        "-Xms1024m",
        "-Xmx1024m",
    ]
    assert command[6:9] == ["-cp", "/spark/conf:/spark/jars/*", BACKEND_CLASS]
    arguments = dict(zip(command[9::2], command[10::2], strict=True))
    assert arguments == {
        "--driver-url": SPARK_ENV["SPARK_DRIVER_URL"],
        "--executor-id": "2",
        "--cores": "1",
        "--app-id": "spark-application-1",
        "--hostname": "10.244.2.7",
        "--resourceProfileId": "0",
        "--podName": "eddyline-restore-totals-exec-2",
    }


def test_outside_an_executor_pod_it_names_what_is_missing_and_where_it_runs() -> None:
    env = {k: v for k, v in SPARK_ENV.items() if k != "SPARK_DRIVER_URL"}
    with pytest.raises(ExecutorStartError, match=r"SPARK_DRIVER_URL not set.*executor pod"):
        executor_command(env, home=Path("/spark"), java="/usr/bin/java")


def test_the_cli_refuses_by_hand_without_a_manifest(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in SPARK_ENV:
        monkeypatch.delenv(name, raising=False)
    assert cli.main(["restore", "executor"]) == 1
    assert "SPARK_DRIVER_URL" in capsys.readouterr().err


# The lines a Spark 4.2 driver printed when its ServiceAccount had lost its RoleBinding
# (fabric8's message, shortened in the middle as Spark prints it on one line).
FORBIDDEN = [
    "26/11/27 20:10:01 INFO SparkContext: Running Spark version 4.2.0\n",
    'Exception in thread "main" org.apache.spark.SparkException: Failed to get driver pod\n',
    "Caused by: io.fabric8.kubernetes.client.KubernetesClientException: Failure executing: GET "
    'at: https://kubernetes.default.svc/api/v1/namespaces/ns/pods/d-1. Message: pods "d-1" is '
    'forbidden: User "system:serviceaccount:ns:counts-restore" cannot get resource "pods" in '
    'API group "" in the namespace "ns".\n',
]


def test_a_failed_driver_is_judged_with_the_line_that_says_why(tmp_path: Path) -> None:
    reason = driver_reason(FORBIDDEN)
    assert reason is not None
    assert reason.startswith('pods "d-1" is forbidden: User "system:serviceaccount:ns:')
    result = judge_build(
        tmp_path, application="a", store="s", partitions=[0], before=set(),
        driver_exit_code=1, driver_error=reason,
    )  # fmt: skip
    assert result.message.startswith('the Spark driver exited with status 1: pods "d-1"')
    unreachable = ["java.net.UnknownHostException: kubernetes.default.svc: Name or service\n"]
    assert driver_reason(unreachable) == (
        "java.net.UnknownHostException: kubernetes.default.svc: Name or service"
    )
    assert driver_reason(["INFO all fine\n"]) is None


def test_a_driver_that_cannot_reach_its_master_is_judged_naming_the_address() -> None:
    """An API server address that drops every packet: Spark 4.2's client gives up after its
    connection timeout and says where it tried (lines as a driver printed them, in a network
    namespace whose route to the address led nowhere)."""
    lines = [
        "26/11/28 06:26:40 ERROR SparkContext: Error initializing SparkContext.\n",
        "org.apache.spark.SparkException: External scheduler cannot be instantiated\n",
        "Caused by: java.lang.reflect.InvocationTargetException\n",
        "Caused by: io.fabric8.kubernetes.client.KubernetesClientException: The timeout of "
        "10000 ms has been exceeded when getting a connection to 10.245.255.254:443\n",
        "Caused by: io.vertx.core.impl.NoStackTraceTimeoutException: The timeout of 10000 ms "
        "has been exceeded when getting a connection to 10.245.255.254:443\n",
    ]
    reason = driver_reason(lines)
    assert reason == (
        "io.vertx.core.impl.NoStackTraceTimeoutException: The timeout of 10000 ms has been "
        "exceeded when getting a connection to 10.245.255.254:443"
    )
    result = judge_build(
        Path("/nonexistent"), application="a", store="s", partitions=[0], before=set(),
        driver_exit_code=1, driver_error=reason, master="k8s://https://10.245.255.254:443",
    )  # fmt: skip
    assert result.message.startswith(
        "the Spark driver (master k8s://https://10.245.255.254:443) exited with status 1: "
        "io.vertx.core.impl.NoStackTraceTimeoutException"
    ), result.message
