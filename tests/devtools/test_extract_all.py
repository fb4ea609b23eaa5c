"""`spark_cluster.extract_all`: the bundle unpacked safely, with and without tarfile's `data` filter (Python 3.11.4
on; Debian 12's 3.11.2 lacks it)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from icefloe_dev.processes import ServiceError
from icefloe_dev.spark_cluster import extract_all


def archive(path: Path, members: list[tarfile.TarInfo]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for member in members:
            body = b"x" if member.isfile() else b""
            member.size = len(body)
            tar.addfile(member, io.BytesIO(body) if member.isfile() else None)
    return path


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


@pytest.mark.parametrize("filtered", [True, False], ids=["data-filter", "by-hand"])
def test_a_bundle_unpacks_inside_its_folder_and_a_member_escaping_it_is_refused(tmp_path, monkeypatch, filtered):
    if not filtered:  # as on Python 3.11.2
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    good = archive(tmp_path / "good.tgz", [member("lib/a.py"), member("lib/b.py", tarfile.SYMTYPE, "a.py")])
    with tarfile.open(good) as tar:
        extract_all(tar, tmp_path / "good")
    assert (tmp_path / "good" / "lib" / "a.py").read_bytes() == b"x"
    assert (tmp_path / "good" / "lib" / "b.py").read_bytes() == b"x"
    # Refused, or (the data filter, for an absolute name) put inside: never anything outside, nor a link out of it
    for name, bad in [
        ("up", [member("../escaped.py")]),
        ("absolute", [member(str(tmp_path / "escaped.py"))]),
        ("link", [member("lib/out", tarfile.SYMTYPE, "../../escaped.py")]),
    ]:
        with tarfile.open(archive(tmp_path / f"{name}.tgz", bad)) as tar:
            try:
                extract_all(tar, tmp_path / name)
            except (ServiceError, tarfile.TarError):
                pass
        assert not (tmp_path / "escaped.py").exists()
        assert not (tmp_path / name / "lib" / "out").is_symlink()
