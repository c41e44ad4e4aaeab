"""tools/worker_timeline.py: each worker's files, busy time and idle tail, and CPU per file."""

from __future__ import annotations

from pathlib import Path

from tools.worker_timeline import report


def test_the_report_says_each_workers_idle_tail_and_where_the_cpu_went(tmp_path: Path) -> None:
    (tmp_path / "gw0.tsv").write_text(
        "100.0\t160.0\t50.00\t4.00\ttests/test_long.py::test_a\n"
        "160.0\t200.0\t10.00\t1.00\ttests/test_short.py::test_b\n"
    )
    (tmp_path / "gw1.tsv").write_text(  # the format before CPU was recorded still reads
        "100.0\t150.0\ttests/test_old.py::test_c[with\ttab]\n"
    )
    said = report(tmp_path)
    lines = said.splitlines()
    assert lines[0] == "wall (first test start to last test end): 100 s"
    assert "gw0: busy 100 s, idle at the end 0 s" in lines
    assert "gw1: busy 50 s, idle at the end 50 s" in lines
    assert "    last: test_short.py (ended 100 s in)" in lines
    cpu = lines.index("CPU: 60 s in test processes and what they started, 5 s in the session "
                      "Prefect servers")  # fmt: skip
    assert lines[cpu + 1] == "    test_long.py 50+4, test_short.py 10+1, test_old.py 0+0"
    files = lines.index("files by seconds (the 3 longest): seconds, worker, start")
    assert lines[files + 1 :] == [
        "    test_long.py 60 (gw0, 0 s in)",
        "    test_old.py 50 (gw1, 0 s in)",
        "    test_short.py 40 (gw0, 60 s in)",
    ]


def test_an_empty_folder_says_so(tmp_path: Path) -> None:
    assert report(tmp_path) == f"no timeline files (*.tsv) in {tmp_path}"
