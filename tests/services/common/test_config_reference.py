"""docs/configuration.md's reference is what the settings classes say, and says all of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common import config_reference
from services.common.config_reference import BEGIN, DOC, END, SERVICES, main, render
from services.stack.spec import StackConfig, env_variable


def test_the_committed_reference_is_current() -> None:
    text = DOC.read_text()
    assert text == render(text), "docs/configuration.md is out of date: run `make docs-config`"
    assert main(["--check"]) == 0


def test_every_flag_variable_and_default_is_listed() -> None:
    reference = config_reference.reference()
    for _, command, settings in SERVICES:
        assert f"`{command}`" in reference
        for name, field in settings.model_fields.items():
            row = config_reference.settings_table(settings)
            flag = f"--{name.replace('_', '-')}"
            assert f"| `{flag}" in row and f"`QUIRE_{name.upper()}`" in row, name
            assert field.description, f"{settings.__name__}.{name} has no description"
    for name in StackConfig.__dataclass_fields__:
        assert f"| `{env_variable(name)}` |" in reference, name
    assert "| `QUIRE_STACK_ROUTER_ADMIN_PORT` | `8001` |" in reference
    assert "| `QUIRE_NUM_KV_BLOCKS` | unset |" in reference


def test_stack_fields_carry_their_comments() -> None:
    fields = {
        name: (default, comment) for name, default, comment in config_reference.stack_fields()
    }
    assert list(fields) == list(StackConfig.__dataclass_fields__)
    assert fields["python"] == ("sys.executable", "interpreter for the Python services")
    assert all(comment for _, comment in fields.values()), fields


def test_only_the_part_between_the_markers_is_written(tmp_path: Path) -> None:
    doc = tmp_path / "configuration.md"
    doc.write_text(f"# hand-written\n\n{BEGIN}\nstale\n{END}\n\ntail\n")
    assert main(["--check", "--doc", str(doc)]) == 1
    assert main(["--doc", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("# hand-written\n\n") and text.endswith(f"{END}\n\ntail\n")
    assert "stale" not in text and "### Router" in text
    assert main(["--check", "--doc", str(doc)]) == 0
    doc.write_text("no markers\n")
    with pytest.raises(ValueError, match="lacks the markers"):
        main(["--doc", str(doc)])
