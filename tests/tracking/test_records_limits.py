"""The limits of reading results files: one file of more than 64 MiB is refused without reading it, one at the
limit is read; a directory of more results files than the limit is refused as a whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kubesweep.tracking import records
from kubesweep.tracking.records import (
    MAX_RESULTS_BYTES,
    ResultsDirError,
    ResultsFileError,
    from_results_dir,
    parse_results,
    read_results_file,
)
from tests.support.results_docs import results_doc


def _padded(path: Path, size: int) -> Path:
    """A valid results file of `size` bytes: the document, then spaces (JSON's whitespace)."""
    body = json.dumps(results_doc()).encode()
    path.write_bytes(body + b" " * (size - len(body)))
    assert path.stat().st_size == size
    return path


def test_a_results_file_over_64_mib_is_refused_naming_the_file(tmp_path: Path) -> None:
    # valid but for its size: without the limit it would be read whole
    assert MAX_RESULTS_BYTES == 64 * 2**20
    big = _padded(tmp_path / "results.json", MAX_RESULTS_BYTES + 1)
    with pytest.raises(ResultsFileError) as err:
        read_results_file(big)
    assert str(big) in str(err.value) and "\n" not in str(err.value)


def test_a_results_file_of_exactly_64_mib_is_read(tmp_path: Path) -> None:
    at_limit = _padded(tmp_path / "results.json", MAX_RESULTS_BYTES)
    assert read_results_file(at_limit).outcome.value == "succeeded"


def test_a_directory_of_more_results_files_than_the_limit_is_refused(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    assert records.MAX_RESULTS_FILES == 100_000
    monkeypatch.setattr(records, "MAX_RESULTS_FILES", 3)  # 100,001 files would take the test minutes
    for i in range(3):
        (tmp_path / f"t{i}").mkdir()
        (tmp_path / f"t{i}" / "results.json").write_text(json.dumps(results_doc()))
    assert len(from_results_dir(tmp_path)) == 3  # at the limit: read
    (tmp_path / "t3").mkdir()
    (tmp_path / "t3" / "results.json").write_text(json.dumps(results_doc()))
    with pytest.raises(ResultsDirError, match=r"4 results files, more than 3"):
        from_results_dir(tmp_path)


def test_a_results_file_larger_than_the_limit_is_refused_by_its_size_before_a_byte_is_read(tmp_path: Path) -> None:
    # a sparse file of 1 GiB: its size is what the refusal names (the whole of it, not the 64 MiB + 1 read)
    huge = tmp_path / "results.json"
    with huge.open("wb") as out:
        out.truncate(2**30)
    with pytest.raises(ResultsFileError) as err:
        read_results_file(huge)
    assert str(err.value) == f"{huge}: {2**30:,} bytes, more than a results file has ({MAX_RESULTS_BYTES:,})"


def test_a_results_document_over_64_mib_is_refused_however_it_came() -> None:
    # the bytes of an artifact or a log, not a file: the same limit, naming where they came from
    body = json.dumps(results_doc()).encode()
    assert parse_results(body + b" " * (MAX_RESULTS_BYTES - len(body)), "run r's results.json").outcome.value \
        == "succeeded"
    with pytest.raises(ResultsFileError) as err:
        parse_results(body + b" " * (MAX_RESULTS_BYTES + 1 - len(body)), "run r's results.json")
    assert str(err.value) == (f"run r's results.json: {MAX_RESULTS_BYTES + 1:,} bytes, more than a results file has "
                              f"({MAX_RESULTS_BYTES:,})")
