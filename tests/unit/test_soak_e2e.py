"""``make soak-e2e`` (tests/soak/soak_e2e.py): per-module passes and failures, an exit code
that says whether anything failed, and a CPU hog that never outlives its bound."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.soak import soak_e2e


@pytest.mark.slow  # four pytest processes
def test_each_module_counts_its_passes_and_failures_and_any_failure_fails_the_soak(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "test_good.py").write_text("def test_good():\n    pass\n", encoding="utf-8")
    (tmp_path / "test_bad.py").write_text(
        "def test_bad(tmp_path):\n    (tmp_path / 'pod.log').write_text('why')\n    assert False\n",
        encoding="utf-8",
    )
    monkeypatch.setattr(
        soak_e2e,
        "MODULES",
        {"good": str(tmp_path / "test_good.py"), "bad": str(tmp_path / "test_bad.py")},
    )
    code = soak_e2e.main(
        ["--rounds", "2", "--modules", "good", "bad", "--no-hog", "--out", str(tmp_path / "out")]
    )
    out = capsys.readouterr().out
    assert code == 1
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["failures"] == 2
    assert {m: (v["passes"], v["failures"]) for m, v in summary["modules"].items()} == {
        "good": (2, 0),
        "bad": (0, 2),
    }
    assert "round 2/2 bad: failed (exit 1)" in out
    kept = Path(summary["modules"]["bad"]["failed_runs"][0])
    assert "assert False" in kept.read_text(encoding="utf-8")
    # A failed run's temporary directory stays (its pods' logs), a passed run's goes.
    (pod_log,) = (tmp_path / "out" / "round-01-bad-tmp").rglob("pod.log")
    assert pod_log.read_text(encoding="utf-8") == "why"
    assert not (tmp_path / "out" / "round-01-good-tmp").exists()


def test_the_hog_ends_by_itself_at_its_bound_and_when_its_parent_is_gone() -> None:
    with soak_e2e.cpu_hog(1, 0.2) as hogs:
        assert hogs[0].wait(30) == 0  # its bound passed: it stopped on its own
    # A hog whose parent died (a soak killed with SIGKILL) stops too: its parent here is a
    # shell that exits at once, so it sees another parent on its first check.
    orphan = subprocess.run(
        [
            "sh",
            "-c",
            f"{sys.executable} -c '{soak_e2e._HOG}' 3600 $$ & echo $!",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(orphan.stdout.strip())
    for _ in range(300):  # a bound for a broken hog, not an expectation
        if not Path(f"/proc/{pid}").exists() or _zombie(pid):
            break
        subprocess.run(["sleep", "0.1"], check=True)
    else:
        subprocess.run(["kill", str(pid)], check=False)
        pytest.fail("a hog outlived its parent")


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True
