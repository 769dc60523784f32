"""docs/testing.md's table of per-file times names every test file, as the last whole run measured them."""
import json

import file_times


def test_the_table_names_every_test_file_and_adds_up():
    text = file_times.DOC.read_text()
    assert file_times.BEGIN in text and file_times.END in text
    rows = [line.split("|")[1:4] for line in text.split(file_times.BEGIN, 1)[1].split(file_times.END, 1)[0].splitlines()
            if line.startswith("| tests/")]
    named = {name.strip() for name, _, _ in rows}
    files = {f"tests/{p.name}" for p in file_times.ROOT.joinpath("tests").glob("test_*.py")}
    assert files <= named, f"not in docs/testing.md (run the suite, then python tests/file_times.py): {sorted(files - named)}"
    ran = [(tests, seconds) for _, tests, seconds in rows if "not run" not in seconds]
    assert ran and all(float(seconds) >= 0 and int(tests.replace(",", "")) > 0 for tests, seconds in ran)
    assert all("cuda" in line for line in text.splitlines() if "not run" in line)  # only the GPU checks sit out


def test_the_table_is_written_from_a_run_record(tmp_path, monkeypatch):
    """A record written as the plugin writes it becomes a table sorted slowest first, its shares adding to 100 %."""
    times = {"finished": "2026-11-28 00:00", "wall_s": 300.0, "workers": 2,
             "files": {"tests/test_a.py": {"seconds": 30.0, "tests": 3}, "tests/test_b.py": {"seconds": 90.0, "tests": 1}}}
    lines = file_times.table(times).splitlines()
    assert "5.0 min of wall clock with 2 pytest-xdist worker(s); 2.0 min of test time" in lines[0]
    assert lines[-2:] == ["| tests/test_b.py | 1 | 90.0 | 75.0% |", "| tests/test_a.py | 3 | 30.0 | 25.0% |"]
    record, doc = tmp_path / "times.json", tmp_path / "testing.md"
    record.write_text(json.dumps(times))
    doc.write_text(f"# x\n{file_times.BEGIN}\nold\n{file_times.END}\nafter\n")
    monkeypatch.setattr(file_times, "TIMES", record)
    monkeypatch.setattr(file_times, "DOC", doc)
    assert file_times.main() == 0
    assert "old" not in doc.read_text() and doc.read_text().endswith(f"{file_times.END}\nafter\n")
