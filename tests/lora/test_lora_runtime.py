"""The CPU runtime with LoRA adapters equals PEFT: base and adapters of ranks 4 and 16 on different modules in one
batch decode greedily to PeftModel's tokens, and through evictions of a 2-adapter cache outputs stay exact."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.lora.adapters import make_adapter
from trtllm_kit.artifact import Artifact
from trtllm_kit.cli import run
from trtllm_kit.errors import KitUsageError
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.lora import (
    ADAPTER_FILE,
    AdapterWeights,
    LoraNotCachedError,
    from_rows,
    load_adapter,
    rank_parts,
    to_rows,
)
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.runtime.sequence import SamplingParams

torch.set_num_threads(1)
MAX_TOKENS = 8
ADAPTERS = {  # name: rank, alpha, PEFT target modules
    "qv4": (4, 8, ["q_proj", "v_proj"]),
    "mlp16": (16, 32, ["k_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    "all4": (4, 4, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    "down16": (16, 16, ["down_proj"]),
}
FUSED = {"qkv4": (4, 8, ["qkv_proj"]), "mlp16": (16, 32, ["o_proj", "gate_up_proj", "down_proj"])}  # Phi-3's names
FAMILIES = {"tiny-llama": ADAPTERS, "tiny-mistral": ADAPTERS, "tiny-qwen2": ADAPTERS, "tiny-phi3": FUSED}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory, family: str) -> tuple[Path, dict[str, Path]]:
    root = tmp_path_factory.mktemp("lora-runtime")
    out = root / "out"
    assert run(["build", f"builtin:{family}", "--target", "cpu", "--dtype", "float32", "--no-verify",
                "--out", str(out)]) == 0
    sources = {}
    for seed, (name, (rank, alpha, targets)) in enumerate(FAMILIES[family].items()):
        sources[name] = make_adapter(builtin_dir(family), root / name, rank=rank, targets=targets,
                                     alpha=alpha, seed=seed)
        assert run(["lora", "add", str(out), name, str(sources[name])]) == 0
    return out, sources


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, 1000, (n,), generator=g).tolist() for n in (5, 11, 17)]


@pytest.fixture(scope="module")
def references(artifact: tuple[Path, dict[str, Path]], prompts: list[list[int]],
               family: str) -> dict[str | None, list[list[int]]]:
    """Greedy tokens of the HF model (None) and of PeftModel with each adapter, for every prompt."""
    from peft import PeftModel

    base = AutoModelForCausalLM.from_pretrained(builtin_dir(family), torch_dtype=torch.float32).eval()
    models: dict[str | None, torch.nn.Module] = {None: base}
    for name, path in artifact[1].items():
        models[name] = PeftModel.from_pretrained(copy.deepcopy(base), path).eval()
    refs = {}
    for name, model in models.items():
        refs[name] = []
        for prompt in prompts:
            with torch.no_grad():
                out = model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=MAX_TOKENS,
                                     min_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=0)
            refs[name].append(out[0, len(prompt):].tolist())
    assert all(refs[name] != refs[None] for name in artifact[1])  # every adapter changes the output
    return refs


def _request(out: Path, name: str, task_id: int, with_weights: bool) -> AdapterWeights:
    record = Artifact.read(out).records.adapters[name]
    pairs = load_adapter(out / record.dir / ADAPTER_FILE, torch.float32, 1 << 30) if with_weights else None
    return AdapterWeights(task_id, pairs)


def test_base_and_adapters_in_one_batch_equal_peft(artifact, prompts, references) -> None:
    out, _ = artifact
    engine = Executor(CheckpointModel.load(out / "checkpoint"), EngineConfig(tokens_per_block=8, max_batch_size=16,
                                                                          lora_cache_max_adapters=4))
    names: list[str | None] = [None, *artifact[1]]
    batch = [(name, i) for i in range(len(prompts)) for name in names]
    loras = [_request(out, name, names.index(name), True) if name else None for name, _ in batch]
    got = engine.generate([prompts[i] for _, i in batch], [SamplingParams(max_tokens=MAX_TOKENS)] * len(batch),
                          loras)
    assert got == [references[name][i] for name, i in batch]


@pytest.mark.parametrize("family", ["tiny-llama"], indirect=True)  # the cache does not depend on the family
def test_eviction_keeps_outputs_exact_and_an_uncached_id_fails_alone(artifact, prompts, references) -> None:
    out, _ = artifact
    engine = Executor(CheckpointModel.load(out / "checkpoint"), EngineConfig(tokens_per_block=8,
                                                                          lora_cache_max_adapters=2))
    names = list(ADAPTERS)
    num_refused = 0
    for turn in range(2 * len(names)):
        name = names[turn % len(names)]
        task_id = names.index(name) + 1
        try:  # as the backend's clients do: the id alone, then the weights when the cache answers "not found"
            lora = _request(out, name, task_id, False)
            engine.lora_cache.resolve(lora)
        except LoraNotCachedError as exc:
            assert str(exc) == f"LoRA task {task_id} not found in cache. Please send LoRA weights with request."
            num_refused += 1
            lora = _request(out, name, task_id, True)
        prompt_index = turn % len(prompts)
        got = engine.generate([prompts[prompt_index], prompts[prompt_index]],
                              [SamplingParams(max_tokens=MAX_TOKENS)] * 2, [lora, None])
        assert got == [references[name][prompt_index], references[None][prompt_index]]
    assert num_refused == 2 * len(names) and engine.lora_cache.num_evictions == 2 * len(names) - 2
    with pytest.raises(LoraNotCachedError):
        engine.add_request(prompts[0], SamplingParams(max_tokens=2), lora=AdapterWeights(1))
    assert not engine.has_work()  # the refused request queued nothing


@pytest.mark.parametrize("family", ["tiny-llama"], indirect=True)
def test_backend_rows_round_trip_and_bad_rows_are_refused(artifact) -> None:
    out, _ = artifact
    record = Artifact.read(out).records.adapters["mlp16"]
    pairs = load_adapter(out / record.dir / ADAPTER_FILE, torch.float32, 1 << 30)
    config = CheckpointModel.load(out / "checkpoint").config
    weights, keys = to_rows(pairs)
    assert keys[:, 0].unique().tolist() == [2, 4, 5, 6, 7]  # k_proj, o_proj, gate_proj (5), down_proj, up_proj (7)
    back = from_rows(weights, keys, config, torch.float32)
    assert back.keys() == pairs.keys() and all(torch.equal(back[k][1], pairs[k][1]) for k in pairs)
    bad_id = keys.clone()
    bad_id[0, 0] = 0  # attn_qkv: Llama has separate q/k/v
    with pytest.raises(KitUsageError, match="lora module id 0 is not enabled for this model"):
        from_rows(weights, bad_id, config, torch.float32)
    with pytest.raises(KitUsageError, match="lora_weights has too few values"):
        from_rows(weights[:, :10], keys, config, torch.float32)


@pytest.mark.parametrize("tp", [2, 4])  # at 4, each of the 2 KV heads is duplicated on two ranks
@pytest.mark.parametrize("family", ["tiny-llama", "tiny-phi3"], indirect=True)  # separate and fused q/k/v, gate/up
def test_tensor_parallel_adapters_equal_peft(artifact, prompts, references, family: str, tp: int,
                                             tmp_path: Path) -> None:
    _, sources = artifact
    out = tmp_path / "out"
    assert run(["build", f"builtin:{family}", "--target", "cpu", "--dtype", "float32", "--no-verify", "--tp", str(tp),
                "--out", str(out)]) == 0
    for name, source in sources.items():
        assert run(["lora", "add", str(out), name, str(source)]) == 0
    model = CheckpointModel.load(out / "checkpoint")
    assert model.dims.tp_size == tp
    engine = Executor(model, EngineConfig(tokens_per_block=8, max_batch_size=16, lora_cache_max_adapters=4))
    names: list[str | None] = [None, *sources]
    batch = [(name, i) for i in range(len(prompts)) for name in names]
    loras = [_request(out, name, names.index(name), True) if name else None for name, _ in batch]
    got = engine.generate([prompts[i] for _, i in batch], [SamplingParams(max_tokens=MAX_TOKENS)] * len(batch),
                          loras)
    assert got == [references[name][i] for name, i in batch]


def test_rank_slices_are_upstreams() -> None:
    """Column-parallel B rows and row-parallel A columns per rank, checked on index tensors (tiny-llama: 4 heads of
    64, 2 KV heads, intermediate 512) at tp 4, where each KV head serves two ranks."""
    config = {"architecture": "LlamaForCausalLM", "hidden_size": 256, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 512, "num_hidden_layers": 1}
    parts = [rank_parts(config, 4, r) for r in range(4)]
    arange = torch.arange
    for r, p in enumerate(parts):
        assert torch.equal(p["attention.qkv"]["q_proj"].b_rows, arange(64 * r, 64 * (r + 1)))
        assert torch.equal(p["attention.qkv"]["k_proj"].b_rows, arange(64 * (r // 2), 64 * (r // 2 + 1)))
        assert (p["attention.qkv"]["v_proj"].start, p["attention.qkv"]["v_proj"].stop) == (128, 192)
        assert torch.equal(p["attention.dense"]["o_proj"].a_cols, arange(64 * r, 64 * (r + 1)))
        assert p["attention.dense"]["o_proj"].b_rows is None
        assert torch.equal(p["mlp.proj"]["down_proj"].a_cols, arange(128 * r, 128 * (r + 1)))
        assert torch.equal(p["mlp.fc"]["gate_up_proj"].b_rows,  # the rank's up rows, then its gate rows
                           torch.cat([arange(128 * r, 128 * (r + 1)), 512 + arange(128 * r, 128 * (r + 1))]))
    qkv = parts[3]["attention.qkv"]["qkv_proj"].b_rows
    assert torch.equal(qkv, torch.cat([arange(192, 256), 256 + arange(64, 128), 384 + arange(64, 128)]))
