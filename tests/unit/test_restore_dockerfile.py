"""The restore-job image (restore.Dockerfile), checked without a Docker engine: it fetches
Spark's Kafka source with the pom `make spark-kafka-jars` uses, at the PySpark version it
installs (pyproject's pin), prunes it as the script does, and points
``EDDYLINE_SPARK_KAFKA_JARS`` at the directory the jars land in, so ``eddyline restore
build`` of a kafka:// changelog finds them inside the image."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from eddyline_runtime.restore.spark.kafka_source import JARS_ENV
from tests.support.images import build_images_script

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "restore.Dockerfile"


def instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    found = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            keyword, _, rest = stripped.partition(" ")
            found.append((keyword.upper(), " ".join(rest.split())))
    return found


def stages() -> dict[str, list[tuple[str, str]]]:
    """Each stage's instructions by name (the last, unnamed one is "final")."""
    found: dict[str, list[tuple[str, str]]] = {"preamble": []}
    current = "preamble"
    for keyword, rest in instructions():
        if keyword == "FROM":
            current = rest.split(" AS ")[1] if " AS " in rest else "final"
            found[current] = []
        found[current].append((keyword, rest))
    return found


def pinned_pyspark() -> str:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    pins = [dep for dep in extras["spark"] if dep.startswith("pyspark==")]
    assert len(pins) == 1, extras["spark"]
    return pins[0].removeprefix("pyspark==")


def test_copied_sources_exist_and_are_not_ignored() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    copies = [rest for keyword, rest in instructions() if keyword == "COPY"]
    assert copies
    for rest in copies:
        if rest.startswith("--from="):
            assert rest.split()[0].removeprefix("--from=") in stages()
            continue
        *sources, _destination = rest.split()
        for source in sources:
            assert (ROOT / source).is_file(), f"COPY {source}: no such file in the build context"
            assert source.split("/")[0] not in ignored, f"COPY {source}: in .dockerignore"


def test_the_connector_is_fetched_with_the_projects_pom_at_the_pinned_spark_version() -> None:
    args = [rest for keyword, rest in stages()["preamble"] if keyword == "ARG"]
    assert f"SPARK_VERSION={pinned_pyspark()}" in args
    fetch = stages()["spark-kafka"]
    assert ("COPY", "tools/spark-kafka/pom.xml /build/pom.xml") in fetch
    (mvn,) = [rest for keyword, rest in fetch if keyword == "RUN" and "mvn" in rest]
    assert "-f /build/pom.xml dependency:copy-dependencies" in mvn
    assert "-Dspark.version=${SPARK_VERSION}" in mvn
    # The same scope and output the checkout's script asks for.
    script = (ROOT / "scripts" / "spark-kafka-jars").read_text()
    assert "-DincludeScope=runtime" in script and "-DincludeScope=runtime" in mvn
    assert "-DoutputDirectory=/build/jars" in mvn
    spark = stages()["spark"]
    assert ("ARG", "SPARK_VERSION") in spark
    assert any(
        keyword == "RUN" and '"pyspark==${SPARK_VERSION}"' in rest for keyword, rest in spark
    ), "the image's PySpark must be the connector's version"


def test_the_build_stage_base_is_an_argument_defaulting_to_the_maven_temurin_image() -> None:
    args = [rest for keyword, rest in stages()["preamble"] if keyword == "ARG"]
    assert "MAVEN_BASE=maven:3.9-eclipse-temurin-17" in args
    assert stages()["spark-kafka"][0] == ("FROM", "${MAVEN_BASE} AS spark-kafka")
    assert build_images_script().IMAGES["restore"].bases == {"MAVEN_BASE": "maven"}


def test_the_jars_are_pruned_in_a_stage_and_land_where_the_env_var_points() -> None:
    # Pruned on top of the image's PySpark (prune_jars.py compares with PySpark's own jars),
    # as root, in a stage of its own so the dropped jars never become a layer of the image.
    pruned = stages()["spark-kafka-pruned"]
    assert pruned[0] == ("FROM", "spark AS spark-kafka-pruned")
    assert stages()["spark"][0] == ("FROM", "${BASE} AS spark")
    assert ("USER", "root") in stages()["spark"]
    (copied,) = [
        rest.split()[-1]
        for keyword, rest in pruned
        if keyword == "COPY" and rest.startswith("--from=spark-kafka /build/jars ")
    ]
    prune = [rest for keyword, rest in pruned if keyword == "RUN" and "prune_jars.py" in rest]
    assert prune and prune[0].endswith(f"prune_jars.py {copied}")
    assert "tools/spark-kafka/prune_jars.py" in (ROOT / "scripts" / "spark-kafka-jars").read_text()

    final = stages()["final"]
    assert final[0] == ("FROM", "spark")
    assert ("COPY", f"--from=spark-kafka-pruned {copied} {copied}") in final
    envs = dict(rest.split("=", 1) for keyword, rest in final if keyword == "ENV" and "=" in rest)
    assert envs.get(JARS_ENV) == copied, f"{JARS_ENV} must name {copied}"
    order = [f"{keyword} {rest}" for keyword, rest in final]
    assert order[-2] == "USER 10001"
    assert re.fullmatch(r'ENTRYPOINT \["eddyline", "restore"\]', order[-1])
