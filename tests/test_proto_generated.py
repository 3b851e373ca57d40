"""The committed gRPC code must be what grpc_tools generates from the committed .proto."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO_ROOT

GENERATED = ("ingest_pb2.py", "ingest_pb2.pyi", "ingest_pb2_grpc.py")


def test_generated_code_matches_proto(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I",
            str(REPO_ROOT / "agent"),
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            str(REPO_ROOT / "agent" / "smon" / "v1" / "ingest.proto"),
        ],
        check=True,
    )
    for name in GENERATED:
        fresh = (tmp_path / "smon" / "v1" / name).read_text()
        committed = (REPO_ROOT / "agent" / "smon" / "v1" / name).read_text()
        assert fresh == committed, f"agent/smon/v1/{name} is stale: run `make proto` and commit"
