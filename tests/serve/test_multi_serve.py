"""Several artifacts on one server: the merged repository, the memory check across them, and a real tritonserver
serving two tiny Llamas (CPU runtime) behind one OpenAI frontend that routes by ``model``, with the gateway's
per-key ``models`` applied to the routed names."""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
from google.protobuf import text_format
from kit_server import BuildKey, Builds, KitServer
from tritonclient.grpc import model_config_pb2 as mc

from trtllm_kit.cli import run
from trtllm_kit.errors import KitUsageError
from trtllm_kit.serve.fleet.fit import Need, check_fit, memory_need
from trtllm_kit.serve.fleet.members import plan_members
from trtllm_kit.serve.fleet.merge import copy_models
from trtllm_kit.serve.gateway.keys import add_key
from trtllm_kit.serve.options import parse_names
from trtllm_kit.serve.servable import servable
from trtllm_kit.serve.server.launcher import free_port
from trtllm_kit.serve.server.state import read_state, run_dir, serving_pid
from trtllm_kit.serve.service import ServeOptions, stop_serving

pytestmark = pytest.mark.slow

MODEL = "builtin:tiny-llama"
BIG = BuildKey.of(max_batch_size=4)  # max_seq_len: the tiny model's 1024 positions
SMALL = BuildKey.of(max_batch_size=4, max_seq_len=256)


@pytest.fixture(scope="module")
def outs(kit_builds: Builds, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("multi")  # copies: the serve below writes its state into both
    return kit_builds.copy(BIG, root / "big"), kit_builds.copy(SMALL, root / "small")


def config(repo: Path, name: str) -> mc.ModelConfig:
    return text_format.Parse((repo / name / "config.pbtxt").read_text(), mc.ModelConfig())


def test_merged_repository_renames_every_reference_and_shares_identical_tokenizers(outs, tmp_path) -> None:
    big, small = outs
    other = tmp_path / "other-repo"
    shutil.copytree(small / "repo", other)
    (other / "preprocessing" / "tokenizer" / "tokenizer_config.json").write_text("{}")  # another tokenizer
    into = tmp_path / "merged"
    into.mkdir()
    shared: dict[str, str] = {}
    first = copy_models(big / "repo", into, "a__", shared)
    second = copy_models(small / "repo", into, "b__", shared)
    third = copy_models(other, into, "c__", shared)
    assert sorted(p.name for p in into.iterdir()) == sorted(
        [f"{p}__{m}" for p in "abc" for m in ("ensemble", "tensorrt_llm", "tensorrt_llm_bls")] +
        ["a__preprocessing", "a__postprocessing", "c__preprocessing"])
    assert second.names["preprocessing"] == "a__preprocessing" and second.names["postprocessing"] == \
        "a__postprocessing"
    assert third.names["preprocessing"] == "c__preprocessing" and third.names["postprocessing"] == \
        "a__postprocessing"
    assert first.ordered()[0] == "a__tensorrt_llm" and first.ordered()[-1] == "a__ensemble"
    for prefix, copied in (("b", second), ("c", third)):
        assert config(into, f"{prefix}__tensorrt_llm").name == f"{prefix}__tensorrt_llm"
        steps = [s.model_name for s in config(into, f"{prefix}__ensemble").ensemble_scheduling.step]
        assert steps == [copied.names["preprocessing"], f"{prefix}__tensorrt_llm", copied.names["postprocessing"]]
        params = {k: v.string_value for k, v in config(into, f"{prefix}__tensorrt_llm_bls").parameters.items()}
        assert params["tensorrt_llm_model_name"] == f"{prefix}__tensorrt_llm"
        assert params["preprocessing_model_name"] == copied.names["preprocessing"]
        assert params["postprocessing_model_name"] == copied.names["postprocessing"]


def test_served_names_default_to_the_model_source_made_unique(outs) -> None:
    big, small = outs
    targets = [servable(big), servable(small), servable(big)]
    assert [m.name for m in plan_members(targets, {})] == [MODEL, f"{MODEL}-2", f"{MODEL}-3"]
    members = plan_members(targets[:2], parse_names(("small=" + str(small),)))
    assert [(m.name, m.prefix) for m in members] == [(MODEL, "builtin_tiny-llama__"), ("small", "small__")]
    assert [m.prefix for m in plan_members([servable(big)], {})] == [""]  # one OUT: the names as built
    with pytest.raises(KitUsageError, match=r"--name 'small' is not NAME=OUT"):
        parse_names(("small",))


def test_cpu_memory_check_says_how_much_is_missing(outs) -> None:
    needs = [memory_need("a", servable(outs[0])), memory_need("b", servable(outs[1]))]
    assert needs[0].bytes_per_device[-1] > 2_299_136 * 4  # the tiny Llama's weights in float32, plus its KV pool
    total = sum(n.bytes_per_device[-1] for n in needs)
    check_fit(needs, available_bytes=total)
    with pytest.raises(KitUsageError, match=r"^the models do not fit in this machine's memory: they need "
                       r"[\d.]+ MiB \(a [\d.]+ MiB, b [\d.]+ MiB\) and [\d.]+ MiB is available, 1\.0 MiB missing; "):
        check_fit(needs, available_bytes=total - 1024**2)


def test_gpu_memory_check_adds_up_bytes_and_kv_fractions_per_gpu() -> None:
    gib = 1024**3
    a = Need("a", {0: 50 * gib}, 0.5, {0: 80 * gib, 1: 80 * gib})
    b = Need("b", {1: 70 * gib}, 0.9, {1: 80 * gib})
    check_fit([a, b])  # on different GPUs
    with pytest.raises(KitUsageError, match=r"do not fit on GPU 0: they need 100\.00 GiB \(a 50\.00 GiB, c "
                       r"50\.00 GiB\) of its 80\.00 GiB, 20\.00 GiB missing"):
        check_fit([a, Need("c", {0: 50 * gib}, 0.4, {0: 80 * gib})])
    with pytest.raises(KitUsageError, match=r"share GPU 0 with KV-cache fractions adding up to 1\.2 \(a 0\.5, "
                       r"d 0\.7\), 0\.2 more than the whole"):
        check_fit([a, Need("d", {0: 10 * gib}, 0.7, {0: 80 * gib})])


@pytest.fixture(scope="module")
def served(outs, tmp_path_factory: pytest.TempPathFactory):
    torch.set_num_threads(1)
    big, small = outs
    keys = tmp_path_factory.mktemp("keys") / "keys.json"
    secrets = {"only_small": add_key(keys, "only_small", models=("small",))[0], "any": add_key(keys, "any")[0]}
    server = KitServer(big, more=(small,), names=(f"small={small}",), api_keys=keys).start()
    yield server.port, secrets, server.state
    if serving_pid(big) is not None:
        stop_serving(small, 30)  # any served OUT stops the serve


def post(port: int, key: str, body: dict) -> tuple[int, dict, dict[str, str]]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), dict(exc.headers)


@pytest.mark.integration
def test_two_artifacts_on_one_server_route_by_model(served, outs) -> None:
    port, secrets, state = served
    big, small = outs
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models",
                                     headers={"Authorization": f"Bearer {secrets['any']}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert [m["id"] for m in json.loads(response.read())["data"]] == [MODEL, "small"]
    for name in (MODEL, "small"):
        for prompt in ("Hello there", [5, 6, 7]):
            status, body, headers = post(port, secrets["any"], {"model": name, "prompt": prompt, "max_tokens": 2})
            assert status == 200, body
            assert body["model"] == name and body["system_fingerprint"] == f"{name}-v1"
            assert headers["x-trtllm-kit-model"] == name and headers["x-trtllm-kit-model-version"] == "1"
            assert body["usage"]["completion_tokens"] == 2
    status, body, _ = post(port, secrets["any"], {"model": "small", "prompt": [1] * 250, "max_tokens": 10})
    assert status == 400 and "maximum context length is 256 tokens" in body["error"]["message"]  # small's own
    assert post(port, secrets["any"], {"model": MODEL, "prompt": [1] * 250, "max_tokens": 10})[0] == 200
    status, body, _ = post(port, secrets["any"], {"model": "nope", "prompt": "x", "max_tokens": 1})
    assert status == 404 and body["error"]["message"] == \
        f"The model 'nope' does not exist; this server has '{MODEL}', 'small'."
    assert post(port, secrets["only_small"], {"model": "small", "prompt": "x", "max_tokens": 1})[0] == 200
    status, body, _ = post(port, secrets["only_small"], {"model": MODEL, "prompt": "x", "max_tokens": 1})
    assert status == 403 and body["error"]["code"] == "model_not_allowed"
    # the first OUT owns the run directory; both are marked served and carry the state
    assert serving_pid(small) == serving_pid(big) == state["pid"]
    assert read_state(small)["run_dir"] == str(run_dir(big))
    assert [r["name"] for r in read_state(small)["routes"]] == [MODEL, "small"]
    assert run(["build", MODEL, "--out", str(small), "--target", "cpu"]) == 2  # a served OUT is not rebuilt


def test_command_line_with_several_outs_names_and_aliases(outs, tmp_path, capsys) -> None:
    from trtllm_kit.cli import cli
    from trtllm_kit.commands.serve import serve_options

    big, small = outs
    args = [str(big), str(small), "--name", f"s={small}", "--alias", "chat=s:1,builtin:tiny-llama:3"]
    ctx = cli.commands["serve"].make_context("serve", list(args))
    options = serve_options(ctx, big, None, None, more=(small,), names=(f"s={small}",),
                            aliases=("chat=s:1,builtin:tiny-llama:3",))
    assert (options.out, options.more, options.outs) == (big, (small,), [big, small])
    assert ServeOptions(out=big, names=(f"s={small}", f"b={big}")).outs == [big, small]  # --name adds an OUT
    assert run(["serve", *args]) == 2  # an alias needs the OpenAI frontend, refused before anything starts
    assert "--alias needs the OpenAI frontend; add --openai-port PORT." in capsys.readouterr().err
    assert run(["serve", str(big), str(small), "--alias", "chat=nope:1,s:1", "--name", f"s={small}",
                "--openai-port", str(free_port())]) == 2
    assert "--alias chat names nope, which this server does not serve; it serves builtin:tiny-llama, s." in \
        capsys.readouterr().err


def test_gpu_need_comes_from_the_plan_and_gpu_device_ids(outs, tmp_path) -> None:
    from dataclasses import replace

    from trtllm_kit.artifact import EngineRecord
    from trtllm_kit.gpus import GPU
    from trtllm_kit.plan import BuildPlan, RankPlan
    from trtllm_kit.precision import Precision
    from trtllm_kit.serve.servable import Servable
    from trtllm_kit.targets import get_target

    gib = 1024**3
    ranks = tuple(RankPlan(rank, rank, 0, 3, 10 * gib, 1024, 32768, 2 * gib, gib, 67 * gib, 30 * gib, 100, 3200, 4,
                           True) for rank in range(2))
    plan = BuildPlan(gpu=GPU("H100-80GB", 80 * gib, (9, 0), "table"), precision=Precision("bfloat16"), tp_size=2,
                     pp_size=1, max_batch_size=4, max_input_len=1024, max_seq_len=2048, max_num_tokens=2048,
                     tokens_per_block=32, kv_cache_fraction=0.45, derived=(), ranks=ranks)
    out = tmp_path / "engine-out"
    shutil.copytree(outs[0] / "repo", out / "repo")
    trtllm = config(out / "repo", "tensorrt_llm")
    trtllm.parameters["gpu_device_ids"].string_value = "2,3"
    (out / "repo" / "tensorrt_llm" / "config.pbtxt").write_text(text_format.MessageToString(trtllm))
    artifact = servable(outs[0]).artifact
    records = replace(artifact.records, engine=EngineRecord("engine", "planned", plan=plan))
    target = Servable(replace(artifact, path=out, records=records), get_target("engine"), 2, None, ("ensemble",))
    need = memory_need("e", target)
    assert need.on_gpu and need.bytes_per_device == {2: 43 * gib, 3: 43 * gib} and need.kv_fraction == 0.45
    check_fit([need, replace(need, name="f", bytes_per_device={0: 43 * gib, 1: 43 * gib},
                             device_bytes={0: 80 * gib, 1: 80 * gib})])  # on other GPUs
    with pytest.raises(KitUsageError, match=r"do not fit on GPU 2: they need 86\.00 GiB \(e 43\.00 GiB, f "
                       r"43\.00 GiB\) of its 80\.00 GiB, 6\.00 GiB missing"):
        check_fit([need, replace(need, name="f")])


@pytest.mark.integration
def test_reload_of_one_route_keeps_the_shared_models_of_the_other(served, outs, kit_builds, tmp_path,
                                                                  capsys) -> None:
    port, secrets, _ = served
    big = outs[0]
    small2 = kit_builds.copy(SMALL, tmp_path / "small2")
    assert run(["reload", "small", str(small2), "--out", str(big)]) == 0
    assert capsys.readouterr().out.startswith(f"small: version 1 -> 2 ({small2}); switched after ")
    routes = {r["name"]: r for r in read_state(small2)["routes"]}
    assert routes["small"]["version"] == 2 and routes["small"]["models"][0] == "small__v2__tensorrt_llm"
    assert routes[MODEL]["models"] == read_state(big)["routes"][0]["models"]
    repo = sorted(p.name for p in (run_dir(big) / "repo").iterdir())
    assert "builtin_tiny-llama__preprocessing" in repo and not any(n.startswith("small__e") for n in repo)
    for name, version in ((MODEL, "1"), ("small", "2")):
        status, body, headers = post(port, secrets["any"], {"model": name, "prompt": "Hi", "max_tokens": 2})
        assert status == 200 and headers["x-trtllm-kit-model-version"] == version, body
