"""The package says what it is: a LICENSE file in the repository and in the installed metadata."""

import importlib.metadata
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_license_file_and_metadata():
    with open(os.path.join(ROOT, "LICENSE")) as f:
        text = f.read()
    assert "Apache License" in text and "Version 2.0" in text
    md = importlib.metadata.metadata("te_compile")
    assert "Apache-2.0" in (md.get("License-Expression"), md.get("License"))
    assert "LICENSE" in (md.get_all("License-File") or [])
