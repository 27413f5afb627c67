"""The command line: exit codes, exact ``Error:`` sentences, help examples, JSON outputs and the manifest."""

from __future__ import annotations

import hashlib
import json
import shlex
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from click.testing import CliRunner, Result

from trtllm_kit import __version__
from trtllm_kit.cli import cli, run
from trtllm_kit.option import declared
from trtllm_kit.spec import STAGES, BuildOptions, BuildSpec

HIDDEN, INTER, NUM_HEADS, NUM_KV_HEADS, NUM_LAYERS, VOCAB = 64, 128, 4, 2, 3, 67
HEAD_DIM = HIDDEN // NUM_HEADS
BUILD_KEYS = [d.name for d in declared(BuildOptions, "build")]
BASE_SPEC_KEYS = ["tp", "pp", "dtype", "until", "target", "verify", "allow_pickle", "force"]
ENGINE_SPEC = {"gpu": None, "gpu_memory": None, "kv_cache_fraction": 0.9, "max_batch_size": None,
               "max_input_len": None, "max_seq_len": None, "max_num_tokens": None, "tokens_per_block": 32,
               "build_flags": {}, "archive": None}


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=HIDDEN, num_attention_heads=NUM_HEADS, num_key_value_heads=NUM_KV_HEADS,
                         intermediate_size=INTER, num_hidden_layers=NUM_LAYERS, vocab_size=VOCAB,
                         max_position_embeddings=128)
    path = tmp_path_factory.mktemp("tiny") / "tiny-llama"
    LlamaForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def truncated_llama(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("truncated") / "truncated-llama"
    path.mkdir()
    (path / "config.json").write_bytes((tiny_llama / "config.json").read_bytes())
    weights = (tiny_llama / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(weights[:len(weights) // 2])
    return path


@pytest.fixture(scope="module")
def checkpoint(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("built") / "out"
    assert run(["build", str(tiny_llama), "--out", str(out), "--tp", "2", "--no-verify", "--json"]) == 0
    return out / "checkpoint"


def invoke(*argv: str) -> Result:
    return CliRunner().invoke(cli, list(argv))


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("Error:")]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- one table: what each command line prints and exits with ---------------------------------------------
# Success rows give a line that stdout must contain; error rows the exact `Error:` line on stderr.
# {model}, {truncated}, {ckpt} and {tmp} are filled in per test.

ROWS = [
    # success
    (["--version"], 0, f"trtllm-kit, version {__version__}"),
    (["models"], 0, "  builtin:tiny-qwen2 "),
    (["inspect", "{model}", "--tp", "2"], 0, "Build: float16, tp=2 pp=1, 1 KV head(s) per rank, lm_head vocab padded "
     "to 68"),
    (["build", "{model}", "--out", "{tmp}/out", "--no-verify"], 0,
     "wrote {tmp}/out (manifest: {tmp}/out/manifest.json)"),
    (["verify", "{ckpt}", "--against", "{model}"], 0, "top-1 agreement 100.00%"),
    # usage errors: exit 2
    (["nosuch"], 2, "Error: No such command 'nosuch'."),
    (["build", "{model}", "--out", "{tmp}/out", "--dtype", "fp8"], 2,
     "Error: Invalid value for '--dtype': 'fp8' is not one of 'auto', 'float16', 'bfloat16', 'float32'."),
    (["inspect", "{model}", "--dtype", "int4"], 2,
     "Error: Invalid value for '--dtype': 'int4' is not one of 'auto', 'float16', 'bfloat16', 'float32'."),
    (["build", "{model}", "--out", "{tmp}/out", "--tp", "two"], 2,
     "Error: Invalid value for '--tp': 'two' is not a valid integer."),
    (["build", "{model}", "--out", "{tmp}/out", "--until", "compile"], 2,
     "Error: Invalid value for '--until': 'compile' is not one of 'checkpoint', 'engine', 'repo'."),
    (["build", "{model}", "--out", "{tmp}/out", "--target", "gpu"], 2,
     "Error: Invalid value for '--target': 'gpu' is not one of 'auto', 'cpu', 'engine', 'llmapi'."),
    (["build", "{model}", "--out", "{tmp}/out", "--tokens-per-block", "48"], 2,
     "Error: tokens_per_block must be a power of two (32 and 64 are common), got 48."),
    (["build", "{model}", "--out", "{tmp}/out", "--build-flag", "gemm_plugin=fast"], 2,
     "Error: --build-flag gemm_plugin=fast is not one of auto, float16, bfloat16, float32, int32, disable, fp8, "
     "nvfp4."),
    (["build", "{model}", "--out", "{tmp}/out", "--gpu", "H800"], 2,
     "Error: --gpu 'H800' is not a known GPU; known: B200, H200, GH200, H100-80GB, H100-NVL, A100-80GB, A100-40GB, "
     "L40S, L40, L4, A10G, A10, RTX-4090, RTX-6000-ADA, T4, V100-32GB; or pass --gpu-memory GiB instead."),
    (["build", "--out", "{tmp}/out"], 2, 'Error: no model given; pass MODEL or set model = "..." in the config file.'),
    (["build", "{model}"], 2,
     'Error: no output directory given; pass --out DIR or set out = "..." in the config file.'),
    (["build", "{model}", "--out", "{tmp}/out", "--tp", "0"], 2, "Error: tp must be a positive integer, got 0."),
    (["build", "{model}", "--out", "{tmp}/out", "--pp", "-1"], 2, "Error: pp must be a positive integer, got -1."),
    (["build", "{model}", "--out", "{tmp}/out", "--config", "{tmp}/missing.toml"], 2,
     "Error: config file {tmp}/missing.toml does not exist."),
    (["plan", "{model}", "--batch-scheduler-policy", "static"], 2,
     "Error: Invalid value for '--batch-scheduler-policy': 'static' is not one of 'guaranteed_no_evict', "
     "'max_utilization'."),
    (["build", "{model}", "--out", "{tmp}/out", "--per-channel"], 2,
     "Error: --per-channel and --per-token apply to --quant int8-sq only, not --quant none."),
    (["build", "{model}", "--out", "{tmp}/out", "--max-queue-size", "-1"], 2,
     "Error: max_queue_size must be an integer >= 0, got -1."),
    (["serve"], 2, 'Error: no build to serve; pass OUT or set out = "..." in the --config file.'),
    (["serve", "{tmp}/out", "--http-port", "70000"], 2, "Error: http_port must be a port in 1..65535, got 70000."),
    (["serve", "{tmp}/out", "--config", "{tmp}/missing.toml"], 2,
     "Error: config file {tmp}/missing.toml does not exist."),
    (["inspect", "{model}", "--tp", "3"], 2,
     "Error: num_attention_heads 4 is not divisible by tp_size 3; choose a tp_size that divides 4."),
    (["inspect", "{model}", "--pp", "5"], 2,
     "Error: pp_size 5 is larger than the model's 3 layers; choose pp_size <= 3."),
    (["verify", "{ckpt}"], 0, "top-1 agreement 100.00%"),  # the source model is read from the build's manifest
    (["verify", "{ckpt}", "--against", "{model}", "--compute-dtype", "int8"], 2,
     "Error: Invalid value for '--compute-dtype': 'int8' is not one of 'float32', 'bfloat16', 'float16'."),
    # failures: exit 1
    (["inspect", "{truncated}"], 1,
     "Error: {truncated}/model.safetensors is truncated: its header describes 478464 bytes of data but the file "
     "holds 237696; download or copy it again."),
]


@pytest.mark.parametrize(("argv", "exit_code", "expected"), [pytest.param(*row, id=" ".join(row[0])) for row in ROWS])
def test_command_line(argv: list[str], exit_code: int, expected: str, tiny_llama: Path, truncated_llama: Path,
                      checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def fill(text: str, tmp: Path) -> str:
        return text.format(model=tiny_llama, truncated=truncated_llama, ckpt=checkpoint, tmp=tmp)

    for_runner, for_run = tmp_path / "runner", tmp_path / "run"
    result = invoke(*(fill(arg, for_runner) for arg in argv))

    assert result.exit_code == exit_code, result.output
    assert "Traceback" not in result.output
    if exit_code == 0:
        assert fill(expected, for_runner) in result.stdout
        assert error_lines(result.stderr) == []
    else:
        assert error_lines(result.stderr) == [fill(expected, for_runner)]
        assert result.stdout == ""

    assert run([fill(arg, for_run) for arg in argv]) == exit_code
    captured = capsys.readouterr()
    assert error_lines(captured.err) == ([] if exit_code == 0 else [fill(expected, for_run)])


# --- help, version, models --------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [None, *sorted(cli.commands)])
def test_help_shows_an_example_that_parses(command: str | None) -> None:
    result = invoke(*([command] if command else []), "--help")
    assert result.exit_code == 0
    prefix = f"trtllm-kit {command} " if command else "trtllm-kit "
    examples = [line.strip() for line in result.stdout.splitlines() if line.strip().startswith(prefix)]
    assert examples, result.stdout
    for example in examples:
        name, *args = shlex.split(example.removeprefix("trtllm-kit "))
        with cli.commands[name].make_context(name, args):  # parses and validates every option of the example
            pass


def test_short_help_option() -> None:
    assert invoke("-h").stdout == invoke("--help").stdout


def test_models_json_lists_builtins_and_families() -> None:
    result = invoke("models", "--json")
    assert result.exit_code == 0
    listing = json.loads(result.stdout)
    assert sorted(listing["builtin"]) == ["builtin:smollm2-135m-instruct", "builtin:tiny-llama",
                                          "builtin:tiny-mistral", "builtin:tiny-phi3", "builtin:tiny-qwen2"]
    assert all(isinstance(d, str) and d for d in listing["builtin"].values())
    assert listing["families"] == {"llama": ["LlamaForCausalLM"], "mistral": ["MistralForCausalLM"],
                                   "qwen2": ["Qwen2ForCausalLM"], "phi3": ["Phi3ForCausalLM"]}


def test_models_text_lists_the_same() -> None:
    stdout = invoke("models").stdout
    for name in ("builtin:tiny-llama", "builtin:tiny-mistral", "builtin:tiny-qwen2", "LlamaForCausalLM",
                 "MistralForCausalLM", "Qwen2ForCausalLM"):
        assert name in stdout


# --- inspect ----------------------------------------------------------------------------------------------


def rank_bytes(tp: int, pp_rank: int, pp: int, num_layers: int) -> int:
    """float16 bytes of one rank file of the tiny Llama, written out from the shapes."""
    q_heads, kv_heads = NUM_HEADS // tp, max(NUM_KV_HEADS // tp, 1)
    per_layer = (2 * HIDDEN  # input and post-attention norms
                 + (q_heads + 2 * kv_heads) * HEAD_DIM * HIDDEN  # fused qkv
                 + HIDDEN * q_heads * HEAD_DIM  # attention dense
                 + 3 * HIDDEN * INTER // tp)  # fc, gate, proj
    numel = num_layers * per_layer
    if pp_rank == 0:
        numel += VOCAB * HIDDEN  # embedding, replicated
    if pp_rank == pp - 1:
        numel += HIDDEN + -(-VOCAB // tp) * HIDDEN  # final norm and this rank's rows of the padded lm_head
    return 2 * numel


def data_bytes(path: Path) -> int:
    with path.open("rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
    return path.stat().st_size - 8 - header_len


@pytest.mark.parametrize(("tp", "pp", "layers"), [(2, 1, [[0, 2]]), (2, 2, [[0, 1], [2, 2]])])
def test_inspect_json_plans_what_build_writes(tp: int, pp: int, layers: list[list[int]], tiny_llama: Path,
                                              tmp_path: Path) -> None:
    result = invoke("inspect", str(tiny_llama), "--tp", str(tp), "--pp", str(pp), "--json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)["build"]

    assert (plan["tp_size"], plan["pp_size"], plan["world_size"]) == (tp, pp, tp * pp)
    assert (plan["dtype"], plan["padded_vocab_size"], plan["kv_heads_per_rank"]) == ("float16", 68, 1)
    assert [r["rank"] for r in plan["ranks"]] == list(range(tp * pp))
    for r in plan["ranks"]:
        first, last = layers[r["pp_rank"]]
        assert (r["tp_rank"], r["layers"]) == (r["rank"] % tp, [first, last])
        assert r["bytes"] == rank_bytes(tp, r["pp_rank"], pp, last - first + 1)

    out = tmp_path / "out"
    assert run(["build", str(tiny_llama), "--out", str(out), "--tp", str(tp), "--pp", str(pp), "--no-verify"]) == 0
    written = [data_bytes(out / "checkpoint" / f"rank{r['rank']}.safetensors") for r in plan["ranks"]]
    assert written == [r["bytes"] for r in plan["ranks"]]


# --- build --json and the manifest ------------------------------------------------------------------------


def test_build_json_points_at_a_manifest_that_matches_the_disk(tiny_llama: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = invoke("build", str(tiny_llama), "--out", str(out), "--json")  # verify runs: the model is tiny
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)

    manifest_path = Path(summary["manifest"])
    assert manifest_path == out / "manifest.json"
    assert summary["checkpoint"] == {"dir": "checkpoint", "dtype": "float16", "world_size": 1, "tp_size": 1,
                                     "pp_size": 1}
    assert summary["verify"]["passed"] is True
    manifest = json.loads(manifest_path.read_text())
    assert manifest["schema_version"] == 2
    assert (manifest["target"], manifest["layout"]["world_size"], manifest["precision"]["weights"]) == (
        "cpu", 1, "float16")
    spec = manifest["spec"]
    assert sorted(spec) == ["build", "model", "out", "quant", "repo", "serve", "speculative"]
    assert (spec["model"], spec["out"]) == (str(tiny_llama), str(out))
    assert {k: spec["build"][k] for k in BASE_SPEC_KEYS} == {"tp": 1, "pp": 1, "dtype": "auto", "until": STAGES[-1],
                                                             "target": "auto", "verify": None, "allow_pickle": False,
                                                             "force": False}
    assert {k: spec["build"][k] for k in ENGINE_SPEC} == ENGINE_SPEC
    assert BuildSpec.from_dict(spec).to_dict() == spec
    assert manifest["inputs"] == {name: sha256(tiny_llama / name) for name in ("config.json", "model.safetensors")}
    tools = manifest["tools"]
    public_torch = torch.__version__.split("+")[0]  # the wheel's local part (+cu128, +cpu) is not in its metadata
    assert (tools["trtllm_kit"], tools["torch"].split("+")[0], tools["transformers"]) == (__version__, public_torch,
                                                                                          transformers.__version__)
    on_disk = {str(p.relative_to(out)): sha256(p) for p in out.rglob("*") if p.is_file() and p != manifest_path}
    assert "checkpoint/rank0.safetensors" in on_disk
    assert manifest["outputs"] == on_disk


# --- trtllm-kit.toml --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("flags", "tp", "pp"), [
    (["--pp", "2"], 2, 2),  # tp from the file, pp from the flag
    (["--tp", "1"], 1, 3),  # a flag equal to its default still overrides the file
], ids=["pp-flag", "tp-flag-at-default"])
def test_config_file_with_flags_overriding_it(flags: list[str], tp: int, pp: int, tiny_llama: Path,
                                              tmp_path: Path) -> None:
    out = tmp_path / "out"
    config = tmp_path / "trtllm-kit.toml"
    config.write_text(f'model = "{tiny_llama}"\nout = "{out}"\n\n[build]\ntp = 2\npp = 3\nverify = false\n')

    result = invoke("build", "--config", str(config), *flags)

    assert result.exit_code == 0, result.output
    spec = json.loads((out / "manifest.json").read_text())["spec"]
    assert (spec["model"], spec["out"], spec["build"]["tp"], spec["build"]["pp"], spec["build"]["verify"]) == (
        str(tiny_llama), str(out), tp, pp, False)
    mapping = json.loads((out / "checkpoint" / "config.json").read_text())["mapping"]
    assert (mapping["tp_size"], mapping["pp_size"], mapping["world_size"]) == (tp, pp, tp * pp)
    assert sorted(p.name for p in (out / "checkpoint").glob("rank*")) == [f"rank{r}.safetensors"
                                                                         for r in range(tp * pp)]


@pytest.mark.parametrize(("toml", "message"), [
    ("[build]\nquantize = true\n", "{path}: unknown key quantize in [build]; did you mean [quant] quant?"),
    ("[build]\ntensor_parallel = 2\n",
     "{path}: unknown key tensor_parallel in [build]; the keys of [build] are " + ", ".join(BUILD_KEYS) + "."),
    ("[build]\nmax_batch = 8\n", "{path}: unknown key max_batch in [build]; did you mean max_batch_size?"),
    ("tp = 2\n", "{path}: unknown key tp at the top level; it belongs in [build]."),
    ("[repo]\ngpu = 'L4'\n", "{path}: unknown key gpu in [repo]; it belongs in [build]."),
    ("[engine]\ngpu = 'L4'\n[engine.build_flags]\ngemm_plugin = 'auto'\n",
     "{path}: the [engine] table is no longer read; its keys (gpu, [engine.build_flags]) belong in [build]: rename "
     "[engine] to [build] (and [engine.build_flags] to [build.build_flags])."),
    ("[buld]\ntp = 2\n", "{path}: unknown table [buld]; did you mean [build]?"),
    ("build = 2\n", "{path}: build must be a table ([build]), got 2."),
    ("[build]\ntp = '2'\n", "tp must be a positive integer, got '2'."),
    ("[build]\ndtype = 'fp8'\n", "dtype 'fp8' is not one of auto, float16, bfloat16, float32."),
    ("[repo]\nbatch_scheduler_policy = 'static'\n",
     "batch_scheduler_policy 'static' is not one of guaranteed_no_evict, max_utilization."),
    ("tp = 2\ntp = 3\n", "{path} is not valid TOML (Cannot overwrite a value (at line 2, column 7))."),
], ids=["key-of-another-table", "no-near-key", "near-key", "top-level-key", "wrong-table", "engine-table",
        "misspelt-table", "table-as-value", "tp-as-string", "bad-dtype", "runtime-only-policy", "invalid-toml"])
def test_bad_config_file(toml: str, message: str, tiny_llama: Path, tmp_path: Path) -> None:
    config = tmp_path / "trtllm-kit.toml"
    config.write_text(toml)
    result = invoke("build", str(tiny_llama), "--out", str(tmp_path / "out"), "--config", str(config))
    assert (result.exit_code, error_lines(result.stderr)) == (2, ["Error: " + message.format(path=config)])
    assert not (tmp_path / "out").exists()


def test_misspelt_table_in_config_file_is_named(tiny_llama: Path, tmp_path: Path) -> None:
    config = tmp_path / "trtllm-kit.toml"
    config.write_text("[biuld]\ntp = 2\n")
    result = invoke("build", str(tiny_llama), "--out", str(tmp_path / "out"), "--config", str(config),
                    "--no-verify")
    assert result.exit_code == 2
    assert "biuld" in "\n".join(error_lines(result.stderr))


# --- verify input errors ----------------------------------------------------------------------------------


def test_verify_of_a_missing_checkpoint_says_it_does_not_exist(tiny_llama: Path, tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    result = invoke("verify", str(missing), "--against", str(tiny_llama))
    assert result.exit_code == 2
    assert error_lines(result.stderr) == [f"Error: {missing} does not exist; pass a TensorRT-LLM checkpoint "
                                          "directory or a build's --out."]


def test_verify_says_when_the_unquantized_reference_came_from_the_cache(tiny_llama: Path, checkpoint: Path,
                                                                        tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRTLLM_KIT_CACHE", str(tmp_path / "cache"))  # empty: the first verify computes the reference
    said = "the unquantized model's answers came from the kit's cache (verify-reference/)"
    first, second = (invoke("verify", str(checkpoint), "--against", str(tiny_llama)) for _ in range(2))
    assert first.exit_code == second.exit_code == 0
    assert said not in first.stdout and second.stdout.splitlines()[0] == said
    assert second.stdout.splitlines()[1:] == first.stdout.splitlines()  # the same figures


def test_verify_of_a_build_directory_checks_its_checkpoint(tiny_llama: Path, checkpoint: Path) -> None:
    by_build = invoke("verify", str(checkpoint.parent), "--against", str(tiny_llama), "--json")
    by_checkpoint = invoke("verify", str(checkpoint), "--against", str(tiny_llama), "--json")
    assert by_build.exit_code == by_checkpoint.exit_code == 0
    assert json.loads(by_build.stdout) == json.loads(by_checkpoint.stdout)


# --- unexpected errors and --debug ------------------------------------------------------------------------


def test_unexpected_error_is_one_line_without_debug(tiny_llama: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr("trtllm_kit.build.pipeline.run_build", broken)
    argv = ["build", str(tiny_llama), "--out", str(tmp_path / "out")]
    expected = ["Error: unexpected RuntimeError: boom (rerun with --debug for the traceback)."]

    result = invoke(*argv)
    assert (result.exit_code, error_lines(result.stderr)) == (1, expected)
    assert "Traceback" not in result.output

    assert run(argv) == 1
    assert error_lines(capsys.readouterr().err) == expected

    for debug in (invoke("--debug", *argv), CliRunner(env={"TRTLLM_KIT_DEBUG": "1"}).invoke(cli, argv)):
        assert isinstance(debug.exception, RuntimeError)  # let through to Python, which prints the traceback


BROKEN_MAIN = """
import sys
import trtllm_kit.build.pipeline

def broken(*args, **kwargs):
    raise RuntimeError("boom")

trtllm_kit.build.pipeline.run_build = broken
from trtllm_kit.cli import main
sys.argv[0] = "trtllm-kit"
main()
"""


@pytest.mark.parametrize("shows_traceback", [False, True], ids=["no-debug", "--debug"])
def test_traceback_only_with_debug(shows_traceback: bool, tiny_llama: Path, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The real ``main()`` in a subprocess, with the build replaced by one that raises RuntimeError."""
    monkeypatch.delenv("TRTLLM_KIT_DEBUG", raising=False)
    argv = [*(["--debug"] if shows_traceback else []), "build", str(tiny_llama), "--out", str(tmp_path / "out")]
    done = subprocess.run([sys.executable, "-c", BROKEN_MAIN, *argv], capture_output=True, text=True, timeout=120)

    assert done.returncode == 1
    assert ("Traceback (most recent call last)" in done.stderr) is shows_traceback
    if shows_traceback:
        assert done.stderr.rstrip().endswith("RuntimeError: boom")
    else:
        assert error_lines(done.stderr) == ["Error: unexpected RuntimeError: boom (rerun with --debug for the "
                                            "traceback)."]


def test_debug_shows_the_traceback_of_an_expected_error_too(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    result = invoke("--debug", "inspect", str(missing))
    assert result.exit_code == 2
    assert "Traceback (most recent call last)" in result.stderr
    assert "trtllm_kit.errors.ModelError" in result.stderr
    assert error_lines(result.stderr) == [f"Error: {missing} does not exist; give a Hugging Face model directory, a "
                                          "GGUF file, a repo id present in the local HF cache, or a built-in model "
                                          "(see `trtllm-kit models`)."]



def test_serving_and_reading_an_artifact_import_no_torch() -> None:
    """serve, stop, artifact verify, validate and deploy start without torch (seconds to import): only what computes
    with it loads it, e.g. the first adapter a running frontend is asked to load."""
    modules = ("trtllm_kit.cli", "trtllm_kit.targets", "trtllm_kit.serve.service", "trtllm_kit.deploy.render",
               "trtllm_kit.artifact.integrity", "trtllm_kit.lora.store")
    code = f"import sys, {', '.join(modules)}; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.strip() == "False"


def test_a_command_ends_without_the_compiler_modules_exit_listing() -> None:
    """torch._dynamo imports OpenAI Triton where it is installed; its module lists its live objects when the
    interpreter ends, after the command's own output."""
    pytest.importorskip("triton")
    code = ("import sys, torch._dynamo, trtllm_kit.__main__ as entry; sys.argv = ['trtllm-kit', 'models']; "
            "entry.main()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "builtin:tiny-llama" in done.stdout
    assert "nanobind" not in done.stderr and "leaked" not in done.stderr, done.stderr[-2000:]
