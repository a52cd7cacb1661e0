"""benchmarks/library_threads.py: three environments take turns and the ratios are printed."""

from pathlib import Path

from benchmarks import library_threads as lt


def test_one_short_round_prints_each_environment_and_the_ratios(capsys):
    assert lt.main(["--rounds", "1", "--steps", "2", "--warmup", "0", "--batch", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines if " median " in line] == list(lt.CASES), lines
    ratio = next(line for line in lines if line.startswith("ratio none/omp1 "))
    assert float(ratio.split()[2].rstrip("x")) > 0 and "off/omp1" in ratio


def test_the_environments_differ_only_in_thread_settings():
    none, omp1, off = (lt.environment(c) for c in lt.CASES)
    assert not any(v in none for v in lt.VARIABLES) and "NPDDP_THREADS" not in none
    assert all(omp1[v] == "1" for v in lt.VARIABLES) and off["NPDDP_THREADS"] == "off"
    assert str(Path(lt.__file__).resolve().parents[1]) in none["PYTHONPATH"].split(":")
