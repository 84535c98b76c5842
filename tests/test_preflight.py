"""Every path-like and value-like flag is checked before any model loads: the commands are run with loading
replaced by a failure, so an error that came only from loading would show as that failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerneltriage.cli.main import main
from kerneltriage.engine import sources
from kerneltriage.engine.preflight import check_model_spec
from kerneltriage.core.errors import InputError
from tiny_gguf import write_tiny_gguf


@pytest.fixture()
def no_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    def load(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a model was loaded: {args}")

    monkeypatch.setattr(sources, "load_checkpoint", load)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("preflight")
    (root / "notes.txt").write_text("not a model")
    (root / "empty-folder").mkdir()
    return {"text": root / "notes.txt", "folder": root / "empty-folder", "absent": root / "absent.gguf",
            "head": root / "no-head.safetensors"}


CASES = [
    (["--spec", "draft:{absent}"], "--spec 'draft:{absent}': model file {absent}: not found"),
    (["--spec", "draft:{text}"], "is not a GGUF file"),
    (["--spec", "eagle:{head}"], "--spec eagle:{head}: no such head file"),
    (["--dtype", "fp8"], "--dtype 'fp8': expected auto or one of float32"),
    (["--device", "tpu"], "--device 'tpu': expected auto, cuda, cuda:N or cpu"),
    (["--device", "cuda:x"], "--device 'cuda:x'"),
]


@pytest.mark.parametrize(("flags", "needle"), CASES)
@pytest.mark.parametrize("command", ["generate", "bench", "triage"])
def test_a_bad_flag_fails_before_loading(command: str, flags: list[str], needle: str, files: dict[str, Path],
                                         no_loading: None, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [command, "--model", "smollm2-135m", "--backend", "torch",
            *(flag.format(**files) for flag in flags), *(["--prompt", "hi"] if command == "generate" else [])]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kerneltriage: error: ") and "\n" not in err
    assert needle.format(**files) in err


def test_ab_checks_both_sides_before_loading(files: dict[str, Path], no_loading: None,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ab", "--model", "smollm2-135m", "--b", f"spec=draft:{files['absent']}"]) == 2
    assert f"--spec 'draft:{files['absent']}': model file" in capsys.readouterr().err
    assert main(["ab", "--model", "smollm2-135m", "--dtype", "fp8", "--b", "levers=graphs"]) == 2
    assert "--dtype 'fp8'" in capsys.readouterr().err


@pytest.mark.parametrize(("spec", "needle"), [
    ("", "--model '': expected 'default', a preset"),
    ("{folder}", "has no config.json; expected a Hugging Face folder"),
    ("{text}", "is not a GGUF file (magic b'not '"),
    ("{absent}", "absent.gguf: not found"),
])
def test_a_model_spec_that_names_nothing_is_refused_before_reading(spec: str, needle: str, files: dict[str, Path],
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """load_checkpoint's first check (`--model ''` read the current folder and said "config.json: not found")."""
    assert main(["generate", "--model", spec.format(**files), "--prompt", "hi"]) == 2
    assert needle.format(**files) in capsys.readouterr().err


def test_good_specs_pass(tmp_path: Path) -> None:
    check_model_spec("default")
    check_model_spec("smollm2-135m")
    check_model_spec(str(write_tiny_gguf(tmp_path / "t.gguf")))
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")  # its contents are the loader's to judge
    check_model_spec(str(tmp_path / "hf"))
    with pytest.raises(InputError, match="^--spec 'draft:x': expected 'default'"):
        check_model_spec("x", "--spec 'draft:x'")
