"""Builds a store from SST files when told to, so a test can SIGKILL it at any instant."""

import json
import sys
from pathlib import Path

from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.state.sst_files import build_store_from_sst_files

plan = json.loads(Path(sys.argv[1]).read_text())
files = [(Path(path), sha256, entries) for path, sha256, entries in plan["files"]]
print("ready", flush=True)
sys.stdin.readline()
build_store_from_sst_files(
    plan["store"], Path(plan["target"]), files, {TopicPartition(plan["topic"], 0): plan["offset"]}
)
print("done", flush=True)
