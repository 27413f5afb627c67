"""The trtllm-build contract: the exact argv per precision × tp × pp, flags that exist in 1.2.x, failures with
their stderr, engine directory validation, the environment check and the engine stage end to end.

``trtllm-build`` cannot run here (no GPU, no tensorrt_llm); a fake on PATH records its argv and writes a 1.2.1
engine directory (tests/build/conftest.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fakes import FakeTrtllmBuild, h100_machine

from trtllm_kit.artifact.machine import Machine, engine_problem, version_tuple
from trtllm_kit.build_limits import Limits
from trtllm_kit.checkpoint.trtllm_config import checkpoint_config
from trtllm_kit.cli import run
from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.gpus import gpu_from_table
from trtllm_kit.mapping import Mapping
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.models.hf_config import read_hf_config
from trtllm_kit.models.registry import family_for
from trtllm_kit.plan import make_plan
from trtllm_kit.precision import Precision
from trtllm_kit.spec.build_flags import FLAGS_1_2, check_flag, parse_overrides
from trtllm_kit.targets import choose_target
from trtllm_kit.trtllm_build.compile import effective_settings, run_trtllm_build, validate_engine_dir
from trtllm_kit.trtllm_build.recipe import build_command

# shared/ lies beside the checkout (in CI too); the spec's flag table is the contract the recipe is checked against
SPEC = Path(__file__).resolve().parents[3] / "shared" / "specs" / "trtllm-checkpoint.md"
LIMITS = Limits(max_batch_size=8, max_input_len=64, max_seq_len=128, max_num_tokens=256, tokens_per_block=32)
SQ = "W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN"
# quant_algo, GPU → gemm_plugin, use_fp8_context_fmha, use_fused_mlp, gemm_swiglu_plugin
RECIPE = {
    (None, "H100-80GB"): ("auto", "disable", "enable", "disable"),
    ("W8A16", "H100-80GB"): ("auto", "disable", "disable", "disable"),  # fused MLP is off for non-FP8 quant
    (SQ, "H100-80GB"): ("auto", "disable", "disable", "disable"),
    ("FP8", "H100-80GB"): ("fp8", "enable", "enable", "fp8"),            # Hopper: FP8 GEMMs, FMHA, GEMM-SwiGLU
    ("FP8", "L40S"): ("auto", "disable", "enable", "disable"),           # Ada: FP8 weights, no Hopper kernels
}
LAYOUTS = [(1, 1), (2, 1), (1, 2), (2, 2)]


def expected_argv(quant: str | None, gpu: str, tp: int, pp: int, num_gpus: int, cache: Path) -> list[str]:
    gemm, fp8_fmha, fused_mlp, swiglu = RECIPE[(quant, gpu)]
    return [
        "trtllm-build", "--checkpoint_dir", "checkpoint", "--output_dir", "engines",
        "--max_batch_size", "8", "--max_input_len", "64", "--max_seq_len", "128", "--max_num_tokens", "256",
        "--max_beam_width", "1", "--logits_dtype", "float32",
        "--gpt_attention_plugin", "auto", "--gemm_plugin", gemm, "--nccl_plugin", "auto",
        "--context_fmha", "enable", "--use_paged_context_fmha", "enable", "--use_fp8_context_fmha", fp8_fmha,
        "--remove_input_padding", "enable", "--kv_cache_type", "paged", "--tokens_per_block", "32",
        "--use_fused_mlp", fused_mlp, "--gemm_swiglu_plugin", swiglu, "--low_latency_gemm_plugin", "disable",
        "--reduce_fusion", "enable" if tp > 1 else "disable", "--user_buffer", "disable",
        "--norm_quant_fusion", "disable", "--multiple_profiles", "enable", "--streamingllm", "disable",
        "--pp_reduce_scatter", "disable", "--profiling_verbosity", "layer_names_only",
        "--workers", str(min(tp * pp, num_gpus)), "--log_level", "info", "--output_timing_cache", str(cache),
    ]


@pytest.fixture(scope="module")
def tiny() -> tuple:
    hf = read_hf_config(builtin_dir("tiny-llama"))
    return hf, family_for(hf, "builtin:tiny-llama")


def checkpoint_dir(root: Path, tiny: tuple, tp: int, pp: int) -> Path:
    hf, family = tiny
    (root / "checkpoint").mkdir(parents=True)
    config = checkpoint_config(hf, family, Mapping(tp, pp), "bfloat16")
    (root / "checkpoint" / "config.json").write_text(json.dumps(config))
    return root


@pytest.mark.parametrize(("quant", "gpu"), list(RECIPE), ids=[f"{q or 'none'}-{g}" for q, g in RECIPE])
@pytest.mark.parametrize(("tp", "pp"), LAYOUTS, ids=[f"tp{t}pp{p}" for t, p in LAYOUTS])
def test_argv_per_precision_and_layout(quant: str | None, gpu: str, tp: int, pp: int, tiny: tuple, tmp_path: Path,
                                       fake_trtllm_build: FakeTrtllmBuild) -> None:
    hf, family = tiny
    kv = "FP8" if quant == "FP8" else ("INT8" if quant == SQ else None)
    board = gpu_from_table(gpu)
    plan = make_plan(hf, family, Mapping(tp, pp), Precision("bfloat16", quant, kv), board, LIMITS)
    cache = tmp_path / "timing.cache"
    command = build_command(plan, board, Path("checkpoint"), Path("engines"), workers=min(tp * pp, 2),
                            timing_cache=cache)
    assert command.argv == expected_argv(quant, gpu, tp, pp, 2, cache)

    work = checkpoint_dir(tmp_path / "artifact", tiny, tp, pp)
    result = run_trtllm_build(command, work, work / "logs", tp * pp)
    [call] = fake_trtllm_build.calls
    assert (call["argv"], call["cwd"]) == (command.argv[1:], str(work))
    assert sorted(p.name for p in (work / "engines").iterdir()) == ["config.json"] + [f"rank{r}.engine"
                                                                                      for r in range(tp * pp)]
    settings = effective_settings(result.engine_config)
    assert (settings["version"], settings["tokens_per_block"], settings["max_batch_size"]) == ("1.2.1", 32, 8)
    assert settings["use_fused_mlp"] == command.value("use_fused_mlp")
    assert (work / "logs" / "trtllm-build.log").read_text().startswith("[TensorRT-LLM] TensorRT-LLM version")
    assert (work / "logs" / "trtllm-build.cmd").read_text() == command.line + "\n"


def spec_flags() -> set[str]:
    """Every ``--flag`` named in docs/trtllm-checkpoint.md §7.1–7.2 (trtllm-build 1.2.x)."""
    text = SPEC.read_text()
    section = text[text.index("## 7. Building engines"):text.index("### 7.3")]
    return set(re.findall(r"`--([a-z_0-9]+)", section)) | set(re.findall(r"--([a-z_0-9]+) <", section))


@pytest.mark.skipif(not SPEC.is_file(), reason="the spec is not next to this checkout")
def test_every_flag_the_kit_passes_is_in_the_spec_flag_table(tiny: tuple, tmp_path: Path) -> None:
    hf, family = tiny
    documented = spec_flags()
    assert {"gemm_plugin", "use_paged_context_fmha", "reduce_fusion", "tokens_per_block"} <= documented
    assert set(FLAGS_1_2) <= documented, sorted(set(FLAGS_1_2) - documented)
    for quant, gpu in RECIPE:
        for tp, pp in LAYOUTS:
            plan = make_plan(hf, family, Mapping(tp, pp), Precision("bfloat16", quant), gpu_from_table(gpu), LIMITS)
            command = build_command(plan, gpu_from_table(gpu), Path("c"), Path("e"), workers=1,
                                    timing_cache=tmp_path / "t.cache")
            passed = {a[2:] for a in command.argv if a.startswith("--")}
            assert passed <= documented, sorted(passed - documented)
            for name, value in command.flags:
                check_flag(name, value)


def test_timing_cache_is_read_once_it_exists(tiny: tuple, tmp_path: Path) -> None:
    hf, family = tiny
    board = gpu_from_table("H100")
    plan = make_plan(hf, family, Mapping(1, 1), Precision("bfloat16"), board, LIMITS)
    cache = tmp_path / "timing.cache"
    first = build_command(plan, board, Path("c"), Path("e"), workers=1, timing_cache=cache)
    cache.write_bytes(b"tactics")
    second = build_command(plan, board, Path("c"), Path("e"), workers=1, timing_cache=cache)
    assert "--input_timing_cache" not in first.argv
    assert second.argv[-4:] == ["--input_timing_cache", str(cache), "--output_timing_cache", str(cache)]


@pytest.mark.parametrize(("pairs", "message"), [
    (["gemm_plugin=disable", "--reduce_fusion=enable"], None),
    (["gemm_plugin"], "--build-flag 'gemm_plugin' is not NAME=VALUE (e.g. gemm_plugin=disable)."),
    (["gemm_plugn=auto"], "--build-flag gemm_plugn is not a trtllm-build 1.2 flag that takes a value; known: "),
    (["use_fused_mlp=on"], "--build-flag use_fused_mlp=on is not one of enable, disable."),
    (["max_beam_width=two"], "--build-flag max_beam_width=two needs a non-negative integer."),
])
def test_overrides_are_checked_against_the_flag_table(pairs: list[str], message: str | None) -> None:
    if message is None:
        assert parse_overrides(pairs) == {"gemm_plugin": "disable", "reduce_fusion": "enable"}
        return
    with pytest.raises(KitUsageError) as exc:
        parse_overrides(pairs)
    assert str(exc.value).startswith(message)


def test_overrides_replace_the_recipe_but_not_the_plan(tiny: tuple) -> None:
    hf, family = tiny
    board = gpu_from_table("H100")
    plan = make_plan(hf, family, Mapping(2, 1), Precision("bfloat16"), board, LIMITS)
    command = build_command(plan, board, Path("c"), Path("e"), workers=2,
                            overrides={"gemm_plugin": "disable", "reduce_fusion": "disable"})
    assert (command.value("gemm_plugin"), command.value("reduce_fusion")) == ("disable", "disable")
    with pytest.raises(KitUsageError, match=r"^--build-flag max_batch_size is set from --max-batch-size and the "):
        build_command(plan, board, Path("c"), Path("e"), workers=1, overrides={"max_batch_size": "2048"})


def test_failure_shows_the_stderr_tail(tiny: tuple, tmp_path: Path, fake_trtllm_build: FakeTrtllmBuild) -> None:
    hf, family = tiny
    board = gpu_from_table("H100")
    plan = make_plan(hf, family, Mapping(1, 1), Precision("bfloat16"), board, LIMITS)
    command = build_command(plan, board, Path("checkpoint"), Path("engines"), workers=1)
    work = checkpoint_dir(tmp_path / "artifact", tiny, 1, 1)
    fake_trtllm_build.fail()
    with pytest.raises(KitError) as exc:
        run_trtllm_build(command, work, work / "logs", 1)
    lines = str(exc.value).splitlines()
    assert lines[0].startswith("trtllm-build exited with code 3 after ")
    assert lines[0].endswith(" s; the last lines of its stderr:")
    assert lines[1:13] == [f"  [TensorRT-LLM][INFO] building layer {i}" for i in range(19, 30)] + [
        "  [TensorRT-LLM][ERROR] CUDA out of memory while building rank 0"]
    assert lines[13] == f"(full logs were in logs/; rerun with: {command.line})"
    assert "building layer 0" in (work / "logs" / "trtllm-build.stderr.log").read_text()


def test_missing_trtllm_build_is_one_sentence(tiny: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hf, family = tiny
    board = gpu_from_table("H100")
    plan = make_plan(hf, family, Mapping(1, 1), Precision("bfloat16"), board, LIMITS)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(KitError, match=r"^trtllm-build is not on PATH; install tensorrt-llm>=0.17,<1.3 "):
        run_trtllm_build(build_command(plan, board, Path("c"), Path("e"), workers=1), tmp_path, tmp_path / "l", 1)


def write_engine_dir(path: Path, ranks: list[int], world: int, *, fmt: str = "new") -> Path:
    path.mkdir(parents=True)
    mapping = {"world_size": world, "tp_size": world, "pp_size": 1}
    config = ({"version": "1.2.1", "pretrained_config": {"mapping": mapping}, "build_config": {}} if fmt == "new"
              else {"builder_config": {"tensor_parallel": world}, "plugin_config": {}})
    (path / "config.json").write_text(json.dumps(config))
    for rank in ranks:
        (path / f"rank{rank}.engine").write_bytes(b"x")
    return path


@pytest.mark.parametrize(("ranks", "config_world", "world", "fmt", "message"), [
    ([0, 1], 2, 2, "new", None),
    ([0], 2, 2, "new", "engines/ holds rank engines [0], expected rank0..rank1.engine (missing [1]); the build is "
                       "incomplete."),
    ([0, 1, 2], 2, 2, "new", "engines/ holds rank engines [0, 1, 2], expected rank0..rank1.engine (unexpected [2]); "
                             "the build is incomplete."),
    ([0, 1], 2, 4, "new", "engines/config.json describes 2 rank(s), the checkpoint has 4."),
    ([0], 1, 1, "old", "engines/config.json lacks build_config/pretrained_config (found builder_config (a pre-0.8 "
                       "engine)); rebuild the engine with TensorRT-LLM 0.12–1.2."),
], ids=["ok", "missing-rank", "extra-rank", "world-mismatch", "pre-0.8-format"])
def test_engine_dir_validation(ranks: list[int], config_world: int, world: int, fmt: str, message: str | None,
                               tmp_path: Path) -> None:
    engine_dir = write_engine_dir(tmp_path / "engines", ranks, config_world, fmt=fmt)
    if message is None:
        assert validate_engine_dir(engine_dir, world)["version"] == "1.2.1"
        return
    with pytest.raises(KitError) as exc:
        validate_engine_dir(engine_dir, world)
    assert str(exc.value).endswith(message)


def test_engine_dir_without_config_is_refused(tmp_path: Path) -> None:
    (tmp_path / "engines").mkdir()
    with pytest.raises(KitError, match=r"^trtllm-build exited with 0 but engines/config.json is missing"):
        validate_engine_dir(tmp_path / "engines", 1)


@pytest.mark.parametrize(("machine", "problem"), [
    (h100_machine(), None),
    (h100_machine(tensorrt_llm="0.17.0"), None),
    (h100_machine(tensorrt_llm="1.3.0rc1"), "tensorrt_llm 1.3.0rc1 is installed, but engines need >=0.17,<1.3 (1.3 "
                                            "removed the TensorRT engine backend); install tensorrt-llm==1.2.1 or "
                                            "build with --target cpu."),
    (h100_machine(tensorrt_llm="0.16.0"), "tensorrt_llm 0.16.0 is installed, but engines need >=0.17,<1.3 (1.3 "
                                          "removed the TensorRT engine backend); install tensorrt-llm==1.2.1 or "
                                          "build with --target cpu."),
    (Machine(None, None, None, None, ()), "tensorrt_llm is not installed; engines need tensorrt-llm>=0.17,<1.3 and "
                                          "an NVIDIA GPU (install the kit's gpu extra or use the TensorRT-LLM 1.2.1 "
                                          "container), or build with --target cpu."),
    (Machine("1.2.1", "10.14.1.48", None, None, ()), "no NVIDIA GPU is visible (NVML found none); build engines on "
                                                     "a GPU machine or use --target cpu."),
    (Machine("1.2.1", "10.14.1.48", "13.0", "580", h100_machine().gpus, has_trtllm_build=False),
     "trtllm-build is not on PATH although tensorrt_llm is installed; activate its environment."),
], ids=["1.2.1", "0.17", "1.3rc", "0.16", "no-trtllm", "no-gpu", "no-trtllm-build"])
def test_environment_check(machine: Machine, problem: str | None) -> None:
    assert engine_problem(machine) == problem


def test_version_tuple_and_target_choice() -> None:
    assert [version_tuple(v) for v in ("1.2.0rc2", "0.17.0.post1", "1.3.0rc1", "garbage")] == [
        (1, 2, 0), (0, 17, 0), (1, 3, 0), ()]
    target, reason = choose_target("auto", h100_machine())
    assert (target.name, reason) == (
        "engine", "target auto → engine: tensorrt_llm 1.2.1 and 2 GPU(s) (NVIDIA H100 80GB HBM3) found")
    cpu_only = Machine(None, None, None, None, ())
    target, reason = choose_target("auto", cpu_only)
    assert (target.name, reason.split(";")[0]) == ("cpu", "target auto → cpu: tensorrt_llm is not installed")
    assert choose_target("cpu", h100_machine())[0].name == "cpu"
    with pytest.raises(KitError, match=r"^tensorrt_llm is not installed"):
        choose_target("engine", cpu_only)
    target, reason = choose_target("engine", cpu_only, plan_only=True)  # a plan runs no tool
    assert target.name == "engine"
    assert reason.startswith("target engine (plan only; a build here would stop: tensorrt_llm is not installed")
    with pytest.raises(KitUsageError, match=r"^target 'tpu' is not one of engine, cpu, llmapi\.$"):
        choose_target("tpu", cpu_only)


# --- the engine stage in a build ------------------------------------------------------------------------------


def test_build_compiles_engines_with_the_recorded_command(tmp_path: Path, fake_trtllm_build: FakeTrtllmBuild,
                                                         gpu_host: Machine, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = run(["build", "builtin:tiny-llama", "--tp", "2", "--pp", "2", "--until", "engine", "--no-verify",
                "--max-batch-size", "8", "--max-seq-len", "128", "--out", str(out), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    [call] = fake_trtllm_build.calls
    manifest = json.loads((out / "manifest.json").read_text())
    engine = manifest["summary"]["engine"]
    assert json.loads(captured.out)["engine"] == engine
    assert engine["reason"] == "target auto → engine: tensorrt_llm 1.2.1 and 2 GPU(s) (NVIDIA H100 80GB HBM3) found"
    assert engine["command"] == ["trtllm-build", *call["argv"]]
    flags = dict(zip(call["argv"][0::2], call["argv"][1::2], strict=True))
    assert (flags["--workers"], flags["--max_batch_size"], flags["--max_seq_len"]) == ("2", "8", "128")  # 2 GPUs
    assert (flags["--reduce_fusion"], flags["--max_input_len"], flags["--max_num_tokens"]) == ("enable", "64", "1024")
    assert {k: engine[k] for k in ("dir", "world_size", "tensorrt_llm", "tensorrt", "gpu", "compute_capability")} == {
        "dir": "engines", "world_size": 4, "tensorrt_llm": "1.2.1", "tensorrt": "10.14.1.48",
        "gpu": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}
    assert engine["effective"]["tokens_per_block"] == 32
    assert manifest["machine"] == {"tensorrt_llm": "1.2.1", "tensorrt": "10.14.1.48", "cuda": "13.0",
                                   "driver": "580.65.06", "gpu": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0",
                                   "num_gpus": 2}
    assert {f"engines/rank{r}.engine" for r in range(4)} | {"engines/config.json", "logs/trtllm-build.log"} <= set(
        manifest["outputs"])
    assert "timings_s" in manifest and "engine" in manifest["timings_s"]


def test_failed_compile_leaves_nothing_and_exits_1(tmp_path: Path, fake_trtllm_build: FakeTrtllmBuild,
                                                   gpu_host: Machine, capsys: pytest.CaptureFixture[str]) -> None:
    fake_trtllm_build.fail()
    out = tmp_path / "out"
    code = run(["build", "builtin:tiny-llama", "--until", "engine", "--no-verify", "--max-seq-len", "128", "--out",
                str(out)])
    err = capsys.readouterr().err
    assert code == 1
    assert "Error: trtllm-build exited with code 3" in err
    assert "CUDA out of memory while building rank 0" in err
    assert not out.exists() and list(tmp_path.glob(".out*")) == []


def test_incomplete_engine_dir_fails_the_build(tmp_path: Path, fake_trtllm_build: FakeTrtllmBuild,
                                               gpu_host: Machine, capsys: pytest.CaptureFixture[str]) -> None:
    fake_trtllm_build.write_ranks(1)
    code = run(["build", "builtin:tiny-llama", "--tp", "2", "--until", "engine", "--no-verify", "--max-seq-len", "128",
                "--out", str(tmp_path / "out")])
    assert code == 1
    assert ("Error: engines/ holds rank engines [0], expected rank0..rank1.engine (missing [1]); the build is "
            "incomplete.") in capsys.readouterr().err


def test_infeasible_plan_is_refused_before_converting(tmp_path: Path, gpu_host: Machine,
                                                      fake_trtllm_build: FakeTrtllmBuild,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    code = run(["build", "builtin:tiny-llama", "--until", "engine", "--gpu-memory", "0.001", "--out",
                str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert "Error: the build does not fit on 0.001 GiB GPU (0.0 GiB per GPU): rank 0 needs " in err
    assert fake_trtllm_build.calls == [] and not (tmp_path / "out").exists()


def test_target_engine_on_a_cpu_machine_is_refused_early(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("trtllm_kit.build.pipeline.detect_machine", lambda: Machine(None, None, None, None, ()))
    code = run(["build", "builtin:tiny-llama", "--target", "engine", "--until", "engine", "--out",
                str(tmp_path / "out")])
    assert code == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        "Error: tensorrt_llm is not installed; engines need tensorrt-llm>=0.17,<1.3 and an NVIDIA GPU (install the "
        "kit's gpu extra or use the TensorRT-LLM 1.2.1 container), or build with --target cpu.")
    assert not (tmp_path / "out").exists()


def test_target_cpu_records_the_command_it_would_run(tmp_path: Path, gpu_host: Machine,
                                                     fake_trtllm_build: FakeTrtllmBuild) -> None:
    out = tmp_path / "out"
    assert run(["build", "builtin:tiny-llama", "--target", "cpu", "--until", "engine", "--no-verify", "--gpu", "L4",
                "--max-seq-len", "128", "--out", str(out)]) == 0
    engine = json.loads((out / "manifest.json").read_text())["summary"]["engine"]
    assert engine["target"] == "cpu" and engine["reason"].startswith("target cpu: no engine compile")
    assert engine["command"][:5] == ["trtllm-build", "--checkpoint_dir", "checkpoint", "--output_dir", "engines"]
    assert fake_trtllm_build.calls == [] and not (out / "engines").exists()


def test_fp8_on_a_pre_ada_gpu_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = run(["plan", "builtin:tiny-llama", "--gpu", "A100-80GB", "--quant", "fp8", "--kv-cache", "fp8",
                "--out", str(tmp_path / "out")])
    assert code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "Error: --quant fp8 and --kv-cache fp8 need an Ada or Hopper GPU (SM 8.9+), but A100-80GB is SM 8.0; use "
        "--quant int8-wo or int8-sq and --kv-cache int8, or an FP8-capable GPU.")


def test_kit_owned_flags_cannot_be_overridden_even_without_a_gpu(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code = run(["build", "builtin:tiny-llama", "--build-flag", "max_batch_size=2048", "--out", str(tmp_path / "o")])
    assert code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "Error: --build-flag max_batch_size is set from --max-batch-size and the memory plan; it cannot be "
        "overridden.")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("overrides", "why"), [
    ({"opt_num_tokens": "64"}, "opt_num_tokens cannot be set with multiple_profiles enable; add --build-flag "
                               "multiple_profiles=disable"),
    ({"user_buffer": "enable"}, "user_buffer enable needs reduce_fusion enable"),
    ({"streamingllm": "enable"}, "streamingllm is no longer supported by trtllm-build 1.2"),
    ({"pp_reduce_scatter": "enable"}, "pp_reduce_scatter is supported for Mixtral only"),
])
def test_combinations_trtllm_build_rejects_are_refused_up_front(overrides: dict[str, str], why: str,
                                                                tiny: tuple) -> None:
    hf, family = tiny
    board = gpu_from_table("H100")
    plan = make_plan(hf, family, Mapping(1, 1), Precision("bfloat16"), board, LIMITS)
    with pytest.raises(KitUsageError) as exc:
        build_command(plan, board, Path("c"), Path("e"), workers=1, overrides=overrides)
    assert str(exc.value) == f"these trtllm-build flags would fail the build: {why}."
    fine = build_command(plan, board, Path("c"), Path("e"), workers=1,
                         overrides={"opt_num_tokens": "64", "multiple_profiles": "disable"})
    assert fine.argv[-2:] == ["--opt_num_tokens", "64"]
