"""StreamsConfig: Kafka Streams' names, KIP-892 defaults, errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from eddyline_runtime.config import (
    CLUSTER_SETTINGS,
    CommitMode,
    IsolationLevel,
    ProcessingGuarantee,
    StreamsConfig,
    cluster_settings_schema,
)
from eddyline_runtime.errors import (
    ConfigError,
    InvalidUncommittedBytesLimitError,
    UnknownIsolationLevelError,
)


def test_defaults_follow_kip_892() -> None:
    config = StreamsConfig.from_properties({})
    assert config.statestore_uncommitted_max_bytes == 64 * 1024 * 1024
    assert config.effective_isolation_level is IsolationLevel.READ_UNCOMMITTED


def test_exactly_once_reads_committed_unless_the_user_chose() -> None:
    eos = StreamsConfig.from_properties({"processing.guarantee": "exactly_once_v2"})
    assert eos.processing_guarantee is ProcessingGuarantee.EXACTLY_ONCE_V2
    assert eos.effective_isolation_level is IsolationLevel.READ_COMMITTED
    chosen = StreamsConfig.from_properties(
        {
            "processing.guarantee": "exactly_once_v2",
            "default.state.isolation.level": "READ_UNCOMMITTED",
        }
    )
    assert chosen.effective_isolation_level is IsolationLevel.READ_UNCOMMITTED


def test_unknown_isolation_level_lists_the_accepted_ones() -> None:
    with pytest.raises(UnknownIsolationLevelError) as error:
        StreamsConfig.from_properties({"default.state.isolation.level": "SNAPSHOT"})
    message = str(error.value)
    assert '"default.state.isolation.level"' in message
    assert "'SNAPSHOT'" in message
    assert "'READ_UNCOMMITTED', 'READ_COMMITTED'" in message


def test_byte_limit_below_minus_one_is_rejected() -> None:
    with pytest.raises(InvalidUncommittedBytesLimitError, match="-1 \\(no limit\\)"):
        StreamsConfig.from_properties({"statestore.uncommitted.max.bytes": -5})


def test_bad_guarantee_and_unknown_keys_are_named() -> None:
    with pytest.raises(ConfigError) as error:
        StreamsConfig.from_properties({"processing.guarantee": "exactly_once"})
    assert '"processing.guarantee"' in str(error.value)
    assert "'at_least_once', 'exactly_once_v2'" in str(error.value)
    with pytest.raises(ConfigError, match=r"statestore\.uncommited\.max\.bytes"):
        StreamsConfig.from_properties({"statestore.uncommited.max.bytes": 5})


def test_commit_mode_is_concurrent_by_default_and_a_wrong_one_lists_the_accepted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert StreamsConfig.from_properties({}, environ={}).commit_mode is CommitMode.CONCURRENT
    monkeypatch.setenv("EDDYLINE_COMMIT_MODE", "serial")
    assert StreamsConfig.from_properties({}).commit_mode is CommitMode.SERIAL
    with pytest.raises(ConfigError) as error:
        StreamsConfig.from_properties({"commit.mode": "parallel"}, environ={})
    assert '"commit.mode"' in str(error.value)
    assert "'pipelined', 'concurrent' or 'serial'" in str(error.value)
    assert "commit.mode" not in CLUSTER_SETTINGS  # not a StreamApp's spec.config setting


def test_environment_overrides_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDDYLINE_STATESTORE_UNCOMMITTED_MAX_BYTES", "2048")
    monkeypatch.setenv("EDDYLINE_DEFAULT_STATE_ISOLATION_LEVEL", "read_committed")
    config = StreamsConfig.from_properties({})
    assert config.statestore_uncommitted_max_bytes == 2048
    assert config.effective_isolation_level is IsolationLevel.READ_COMMITTED


def test_every_setting_is_read_by_its_kafka_streams_name() -> None:
    for name, field in StreamsConfig.model_fields.items():
        kafka_name = name.replace("_", ".")
        assert field.validation_alias is not None
        assert kafka_name in field.validation_alias.choices, name  # type: ignore[union-attr]


def test_commit_interval_defaults_depend_on_the_guarantee() -> None:
    assert StreamsConfig.from_properties({}).effective_commit_interval_ms == 30_000
    eos = StreamsConfig.from_properties({"processing.guarantee": "exactly_once_v2"})
    assert eos.effective_commit_interval_ms == 100
    chosen = StreamsConfig.from_properties({"commit.interval.ms": 5})
    assert chosen.effective_commit_interval_ms == 5


def test_max_task_idle_ms_accepts_minus_one_and_rejects_less() -> None:
    assert StreamsConfig.from_properties({"max.task.idle.ms": -1}).max_task_idle_ms == -1
    with pytest.raises(ConfigError) as error:
        StreamsConfig.from_properties({"max.task.idle.ms": -2})
    assert '"max.task.idle.ms"' in str(error.value)
    assert "-2" in str(error.value)


@pytest.mark.parametrize("value", ["abc", -2, "1.5", True])
def test_an_invalid_max_task_idle_ms_says_minus_one_or_at_least_zero(value: object) -> None:
    with pytest.raises(ConfigError) as error:
        StreamsConfig.from_properties({"max.task.idle.ms": value})
    assert '"max.task.idle.ms"' in str(error.value)
    assert "-1 or >= 0" in str(error.value)
    assert StreamsConfig.from_properties({"max.task.idle.ms": "250"}).max_task_idle_ms == 250


def test_the_deprecated_cache_name_warns_and_loses_to_the_new_one() -> None:
    with pytest.warns(FutureWarning, match='"cache.max.bytes.buffering" is deprecated'):
        old_only = StreamsConfig.from_properties({"cache.max.bytes.buffering": 1000})
    assert old_only.statestore_cache_max_bytes == 1000
    for properties in (
        {"statestore.cache.max.bytes": 2000, "cache.max.bytes.buffering": 1000},
        {"cache.max.bytes.buffering": 1000, "statestore.cache.max.bytes": 2000},
    ):
        with pytest.warns(FutureWarning, match="ignored"):
            both = StreamsConfig.from_properties(properties)
        assert both.statestore_cache_max_bytes == 2000


def test_settings_load_from_a_properties_file(tmp_path: Path) -> None:
    file = tmp_path / "streams.properties"
    file.write_text(
        "# Kafka Streams style\n"
        "application.id=orders\n"
        "processing.guarantee = exactly_once_v2\n"
        "statestore.cache.max.bytes: 1024\n"
    )
    config = StreamsConfig.from_file(file, {"num.stream.threads": 2})
    assert config.application_id == "orders"
    assert config.processing_guarantee is ProcessingGuarantee.EXACTLY_ONCE_V2
    assert config.statestore_cache_max_bytes == 1024
    assert config.num_stream_threads == 2


def test_settings_load_from_yaml_and_the_environment_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "streams.yaml"
    file.write_text("max.task.idle.ms: 250\ncommit.interval.ms: 1000\n")
    monkeypatch.setenv("EDDYLINE_COMMIT_INTERVAL_MS", "50")
    config = StreamsConfig.from_file(file)
    assert config.max_task_idle_ms == 250
    assert config.commit_interval_ms == 50


def test_a_bad_settings_file_is_named(tmp_path: Path) -> None:
    file = tmp_path / "streams.properties"
    file.write_text("application.id=orders\nthis line has no separator\n")
    with pytest.raises(ConfigError, match=r"streams.properties:2.*key=value"):
        StreamsConfig.from_file(file)
    with pytest.raises(ConfigError, match="readable settings file"):
        StreamsConfig.from_file(tmp_path / "missing.properties")
    bad_value = tmp_path / "bad.yaml"
    bad_value.write_text("max.task.idle.ms: -5\n")
    with pytest.raises(ConfigError, match=r"max\.task\.idle\.ms"):
        StreamsConfig.from_file(bad_value)


def test_num_stream_threads_above_the_maximum_is_refused_naming_the_setting() -> None:
    with pytest.raises(ConfigError) as refused:
        StreamsConfig.from_properties({"num.stream.threads": 100_000})
    message = str(refused.value)
    assert "num.stream.threads" in message
    assert "64" in message, message  # the maximum, so the user knows what is accepted
    assert StreamsConfig.from_properties({"num.stream.threads": 64}).num_stream_threads == 64


def test_warm_up_settings_default_to_kafka_streams_and_bad_values_are_named() -> None:
    config = StreamsConfig.from_properties({})
    assert config.acceptable_recovery_lag == 10_000
    assert config.max_warmup_replicas == 2
    assert config.probing_rebalance_interval_ms == 600_000
    for key, value, accepted in [
        ("acceptable.recovery.lag", -1, "greater than or equal to 0"),
        ("max.warmup.replicas", 0, "greater than or equal to 1"),
        ("probing.rebalance.interval.ms", 0, "greater than or equal to 1"),
        ("rocksdb.memory.limit.share", 1.5, "less than or equal to 1"),
        ("memory.limit.bytes", -2, "greater than or equal to -1"),
    ]:
        with pytest.raises(ConfigError) as refused:
            StreamsConfig.from_properties({key: value})
        assert key in str(refused.value) and accepted in str(refused.value), str(refused.value)


def test_the_memory_limit_comes_from_the_downward_api_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert StreamsConfig.from_properties({}).memory_limit_bytes == -1
    monkeypatch.setenv("EDDYLINE_MEMORY_LIMIT_BYTES", str(512 * 1024 * 1024))
    assert StreamsConfig.from_properties({}).memory_limit_bytes == 512 * 1024 * 1024


def test_settings_validate_as_written_without_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """environ={}: what the operator uses, so a spec's validity never depends on its pod."""
    monkeypatch.setenv("EDDYLINE_NUM_STREAM_THREADS", "not a number")
    monkeypatch.setenv("EDDYLINE_COMMIT_INTERVAL_MS", "50")
    written = StreamsConfig.from_properties({"commit.interval.ms": 1000}, environ={})
    assert written.commit_interval_ms == 1000 and written.num_stream_threads == 1
    with pytest.raises(ConfigError) as refused:
        StreamsConfig.from_properties({"commit.interval.ms": 1000})
    assert refused.value.key == "EDDYLINE_NUM_STREAM_THREADS"


def test_the_environment_goes_over_validated_settings_once() -> None:
    written = StreamsConfig.from_properties({"num.standby.replicas": 1}, environ={})
    assert written.overridden_by({"UNRELATED": "1"}) is written  # nothing to apply: itself
    pod = written.overridden_by({"EDDYLINE_STATE_DIR": "/var/lib/eddyline/state"})
    assert pod.state_dir == Path("/var/lib/eddyline/state")
    assert pod.num_standby_replicas == 1
    with pytest.raises(ConfigError) as refused:
        written.overridden_by({"EDDYLINE_MAX_TASK_IDLE_MS": "-5"})
    message = str(refused.value)
    assert "EDDYLINE_MAX_TASK_IDLE_MS" in message and "-1 or >= 0" in message
    assert 'it overrides "max.task.idle.ms"' in message


def test_an_empty_state_dir_is_refused_as_the_crd_refuses_it() -> None:
    with pytest.raises(ConfigError, match=r'"state\.dir".*a directory path'):
        StreamsConfig.from_properties({"state.dir": ""}, environ={})


def test_every_cluster_setting_is_described_and_named_once() -> None:
    schema = cluster_settings_schema()
    assert tuple(schema) == CLUSTER_SETTINGS
    for key, node in schema.items():
        assert node.get("description"), key
    # What the operator sets itself, or a StreamApp gives, is not for spec.config.
    for key in ("application.id", "memory.limit.bytes", "restore.build.dir", "restore.wait.ms"):
        assert key not in CLUSTER_SETTINGS


# -- records that cannot be processed (KIP-1033, KIP-1034) ---------------------------------


def test_exception_handlers_default_to_log_and_fail_without_a_dead_letter_topic() -> None:
    config = StreamsConfig.from_properties({}, environ={})
    assert config.deserialization_exception_handler == "log-and-fail"
    assert config.processing_exception_handler == "log-and-fail"
    assert config.production_exception_handler == "log-and-fail"
    assert config.errors_dead_letter_queue_topic_name is None


@pytest.mark.parametrize(
    ("key", "value", "canonical"),
    [
        (
            "deserialization.exception.handler",
            "org.apache.kafka.streams.errors.LogAndContinueExceptionHandler",
            "log-and-continue",
        ),
        ("processing.exception.handler", "LogAndFailProcessingExceptionHandler", "log-and-fail"),
        (
            "production.exception.handler",
            "org.apache.kafka.streams.errors.DefaultProductionExceptionHandler",
            "log-and-fail",
        ),
        ("processing.exception.handler", "my_app.errors:to_dlq", "my_app.errors:to_dlq"),
    ],
)
def test_kafkas_handler_class_names_and_user_functions_are_accepted(
    key: str, value: str, canonical: str
) -> None:
    config = StreamsConfig.from_properties({key: value}, environ={})
    assert getattr(config, key.replace(".", "_")) == canonical


def test_a_kafka_handler_for_another_kind_of_failure_is_refused_naming_its_setting() -> None:
    with pytest.raises(ConfigError, match=r"set it as deserialization\.exception\.handler"):
        StreamsConfig.from_properties(
            {"processing.exception.handler": "LogAndContinueExceptionHandler"}, environ={}
        )
    with pytest.raises(ConfigError, match="'log-and-continue', 'log-and-fail'"):
        StreamsConfig.from_properties({"processing.exception.handler": "skip"}, environ={})


@pytest.mark.parametrize("kind", ["deserialization", "production"])
def test_the_deprecated_default_handler_names_warn_and_lose_to_the_new_ones(kind: str) -> None:
    old, new = f"default.{kind}.exception.handler", f"{kind}.exception.handler"
    with pytest.warns(FutureWarning, match=f'"{old}" is deprecated; rename it to "{new}"'):
        config = StreamsConfig.from_properties({old: "log-and-continue"}, environ={})
    assert getattr(config, new.replace(".", "_")) == "log-and-continue"
    with pytest.warns(FutureWarning, match="ignored here"):
        both = StreamsConfig.from_properties(
            {old: "log-and-continue", new: "log-and-fail"}, environ={}
        )
    assert getattr(both, new.replace(".", "_")) == "log-and-fail"
