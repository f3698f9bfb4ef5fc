"""Native frames from outside (``_hang/native.py``): ``py-spy dump --native`` of a process held in a
C call that keeps the GIL (tests/support/gil_holder.c, built here), the C function named; and
what a rank's file says where py-spy is not installed or cannot attach."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ray_wandb_nodes._hang import Phase, RankProgress, native
from ray_wandb_nodes._hang.evidence import RankEvidence
from ray_wandb_nodes._hang.position import RankFacts
from ray_wandb_nodes._hang.report import evidence_text

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def gil_held(gil_lib: str) -> subprocess.Popen[str]:
    lib = gil_lib
    code = f"import ctypes\nprint('ready', flush=True)\nctypes.PyDLL({str(lib)!r}).rwn_hold_gil(ctypes.c_double(60))"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.skipif(native.py_spy() is None, reason='py-spy not installed (the "native-stacks" extra)')
def test_py_spy_names_the_c_function_that_holds_the_gil(gil_held: subprocess.Popen[str]) -> None:
    ((text, why),) = native.native_dumps([gil_held.pid], timeout_s=20).values()
    assert why == "" and "rwn_hold_gil" in text, text


def test_without_py_spy_a_rank_says_how_to_get_native_frames(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "py_spy", lambda: None)
    assert native.native_dumps([1234]) == {1234: ("", native.INSTALL_HINT)}


def test_py_spy_that_cannot_attach_says_why(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "py-spy"
    fake.write_text(
        "#!/bin/sh\necho 'Error: Permission Denied: Try running again with elevated permissions' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    monkeypatch.setattr(native, "py_spy", lambda: str(fake))
    assert native.native_dumps([1234]) == {
        1234: ("", "py-spy: Error: Permission Denied: Try running again with elevated permissions (3 tries)")
    }


def test_a_dump_that_fails_once_is_tried_again_and_its_frames_kept(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """py-spy fails a dump now and then where it cannot pair a thread's native and Python frames;
    the next try reads them."""
    fake = tmp_path / "py-spy"
    fake.write_text(
        f"#!/bin/sh\nif [ ! -e {tmp_path}/tried-$4 ]; then touch {tmp_path}/tried-$4\n"
        "echo 'Error: Failed to merge native and python frames (Have 1 native and 2 python)' >&2; exit 1; fi\n"
        'echo "Thread $4 (idle)\\n    rwn_hold_gil (libgil_holder.so)"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setattr(native, "py_spy", lambda: str(fake))
    dumps = native.native_dumps([11, 12], timeout_s=20)
    assert sorted(dumps) == [11, 12]
    for pid, (text, why) in dumps.items():
        assert why == "" and f"Thread {pid} (idle)" in text and "rwn_hold_gil" in text, (text, why)


def test_a_dump_past_its_bound_is_not_tried_again(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "py-spy"
    fake.write_text(f"#!/bin/sh\necho run >> {tmp_path}/runs\nexec sleep 30\n")
    fake.chmod(0o755)
    monkeypatch.setattr(native, "py_spy", lambda: str(fake))
    assert native.native_dumps([1234], timeout_s=1) == {1234: ("", "py-spy gave nothing within 1 s")}
    assert (tmp_path / "runs").read_text() == "run\n"


def test_a_ranks_file_has_its_native_frames_after_its_stacks() -> None:
    evidence = RankEvidence(
        rank=2, pid=99, training_ident=0, native_frames="Thread 0x1 (active+gil)\n    rwn_hold_gil (libgil_holder.so)\n"
    )
    text = evidence_text(
        RankFacts(RankProgress(2, 99, 5, 5, True, 9.0, Phase.RUNNING, 9.0, 1.0, 12), evidence, "node-a", ())
    )
    assert (
        "\nnative frames (py-spy dump --native):\nThread 0x1 (active+gil)\n    rwn_hold_gil (libgil_holder.so)" in text
    )
