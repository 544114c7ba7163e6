"""A model folder is checked before anything loads it: a config that is not JSON or weights cut short (a download
or copy that stopped) had passed, and the engine's start, `profile` and `analyze` failed with a library's
traceback instead of naming the file (exit 2 where the CLI takes the folder)."""

import json
import shutil

import pytest

from fleetserve.engine.demo import ModelSourceError
from fleetserve.engine.sources import check_model_dir
from tests.helpers import fleetserve


@pytest.fixture
def copy(tiny_model, tmp_path):
    def make(name: str):
        folder = tmp_path / name
        shutil.copytree(tiny_model, folder)
        return folder
    return make


def test_a_whole_model_passes(tiny_model):
    assert check_model_dir(tiny_model) == tiny_model


def test_a_config_that_is_not_json_is_named(copy):
    folder = copy("config")
    (folder / "config.json").write_text("{")
    with pytest.raises(ModelSourceError, match="config.json is not valid JSON"):
        check_model_dir(folder)
    (folder / "config.json").write_text("[1]")
    with pytest.raises(ModelSourceError, match="config.json is not a JSON object"):
        check_model_dir(folder)
    (folder / "config.json").write_text("{}")  # transformers: "Should have a model_type key", a traceback
    with pytest.raises(ModelSourceError, match="config.json names no model_type"):
        check_model_dir(folder)


def test_bytes_after_the_tensors_are_named(copy):
    """safetensors refuses a file its tensors do not cover whole ("incomplete metadata"): it had passed here."""
    folder = copy("trailing")
    with open(folder / "model.safetensors", "ab") as f:
        f.write(b"\0" * 5000)
    with pytest.raises(ModelSourceError, match="bytes after its tensors"):
        check_model_dir(folder)


@pytest.mark.parametrize("keep", ["nothing", "half the header", "the header only"])
def test_weights_cut_short_are_named(copy, keep):
    folder = copy(keep.replace(" ", "-"))
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    header = 8 + int.from_bytes(data[:8], "little")
    cut = {"nothing": 0, "half the header": header // 2, "the header only": header + 16}[keep]
    weights.write_bytes(data[:cut])
    with pytest.raises(ModelSourceError, match="model.safetensors is not a whole safetensors file"):
        check_model_dir(folder)


def test_a_shard_the_index_names_must_be_there(copy):
    folder = copy("sharded")
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(ModelSourceError, match="missing model-00002-of-00002.safetensors"):
        check_model_dir(folder)


def test_profile_names_the_broken_file_with_exit_2(copy):
    folder = copy("cli")
    (folder / "config.json").write_text("{")
    result = fleetserve("profile", "--model", str(folder), "--max-prompt", "64", "--repeats", "1")
    assert result.returncode == 2 and "--model" in result.stderr and "config.json is not valid JSON" in result.stderr
    assert "Traceback" not in result.stderr


def test_weights_that_do_not_fit_the_config_are_named(copy):
    """A config.json of another size: a traceback ending "For details look at the above report!", which is all
    `up` and `status` showed of why the replica crash-looped."""
    from fleetserve.engine.runner import ModelRunner

    folder = copy("resized")
    config = json.loads((folder / "config.json").read_text())
    config["hidden_size"] *= 2
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelSourceError, match="its weights do not match its config.json"):
        ModelRunner(folder, threads=1)


def test_a_symlink_loop_an_empty_source_and_a_tokenizer_config_alone_are_named(copy, tmp_path):
    """A symlink loop was a traceback (exit 1) in model prepare, profile and validate; "" read the current folder;
    a folder with tokenizer_config.json and no tokenizer passed, and the engine died at its start."""
    from fleetserve.engine.sources import resolve_source

    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(ModelSourceError, match="ymlink loop"):
        resolve_source(str(tmp_path / "a"))
    with pytest.raises(ModelSourceError, match="the model source is empty"):
        resolve_source("")
    folder = copy("half-tokenizer")
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ModelSourceError, match=r"missing tokenizer \(tokenizer.json or tokenizer.model"):
        check_model_dir(folder)
    looped = fleetserve("model", "prepare", str(tmp_path / "a"))
    assert looped.returncode == 2 and "Traceback" not in looped.stderr, looped.stderr


def test_model_tiny_refuses_an_empty_path_an_odd_head_size_and_sizes_it_cannot_build(tmp_path):
    for args, said in ((["model", "tiny", ""], "is empty"),
                       (["model", "tiny", str(tmp_path / "m"), "--hidden-size", "12", "--heads", "4"], "odd head size"),
                       (["model", "tiny", str(tmp_path / "m"), "--layers", "100000"], "less than or equal to 128")):
        r = fleetserve(*args)
        assert r.returncode == 2 and said in " ".join(r.stderr.replace("│", " ").split()), (args, r.stderr)
    assert not (tmp_path / "m").exists()


def test_model_tiny_refuses_a_folder_that_is_not_empty_unless_forced(copy):
    """`model tiny` into a real model's folder replaced its config.json and weights without a word."""
    folder = copy("real")
    before = (folder / "config.json").read_bytes()
    r = fleetserve("model", "tiny", str(folder), "--hidden-size", "32")
    assert r.returncode == 2 and "is not empty" in " ".join(r.stderr.replace("│", " ").split()), r.stderr
    assert (folder / "config.json").read_bytes() == before
    forced = fleetserve("model", "tiny", str(folder), "--hidden-size", "32", "--force")
    assert forced.returncode == 0, forced.stderr
    assert json.loads((folder / "config.json").read_text())["hidden_size"] == 32
