"""One declaration per option: for every declared field, the flag, the TOML key and the dataclass agree; the
nested spec round-trips through JSON and TOML; old flat specs nest; the enums agree with their consumers."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import click
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trtllm_kit.artifact import EngineLimits
from trtllm_kit.cli import cli
from trtllm_kit.commands.build_flags import typed_values
from trtllm_kit.commands.serve import serve_options
from trtllm_kit.enums import (
    RUNTIME_SCHEDULER_POLICIES,
    STATIC_BATCHING,
    Choice,
    Dtype,
    KVCache,
    Quant,
    SchedulerPolicy,
    Stage,
    Target,
)
from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.model_repo.configs import repository_configs
from trtllm_kit.model_repo.options import resolve_options
from trtllm_kit.option import Declared, plain
from trtllm_kit.quant.algos import KV_ALGOS, VALID_COMBINATIONS
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.spec import TABLES, BuildSpec, all_declared, build_spec, load_table, load_toml, nest_flat_spec
from trtllm_kit.spec.repo_options import RepoOptions
from trtllm_kit.spec.speculative import NEEDS_DRAFT_DIR, TREE_MODES, Speculation

SPEC_DOC = Path(__file__).parents[1] / "docs" / "triton-repo.md"
FLAGGED = [d for d in all_declared() if d.option.flag]
COMMAND = {"build": "build", "quant": "build", "repo": "build", "serve": "serve", "speculative": "build", None: "build"}
CONTEXT = {"per_channel": ["--quant", "int8-sq"], "per_token": ["--quant", "int8-sq"],  # what a field needs
           "awq_group_size": ["--quant", "int4-awq"], "draft_model": ["--speculative", "draft-target"],
           "max_draft_len": ["--speculative", "ngram"], "draft_choices": ["--speculative", "medusa"]}
SAMPLES = {"gpu_device_ids": "0;1", "awq_group_size": 64,  # fields whose values have a syntax or a set
           "draft_choices": "[[0], [0, 0], [1]]"}


def sample(d: Declared) -> Any:
    """A valid value of the field other than its default."""
    if d.name in SAMPLES:
        return SAMPLES[d.name]
    if d.kind is bool:
        return not d.default if d.default is not None else True
    if issubclass(d.kind, Choice):
        return next(m for m in d.kind if m != d.default)
    if d.kind is int:
        return (d.default or 1) * 2
    if d.kind is float:
        return (d.default or 1.0) / 2
    if d.kind is dict:
        return {"gemm_plugin": "disable"}
    return Path("some/where") if d.kind is Path else "ensemble"


def argv(d: Declared, value: Any) -> list[str]:
    flag = d.option.flag
    assert flag
    if d.kind is bool:
        positive, _, negative = flag.partition("/")
        return [positive if value else negative]
    if d.kind is dict:
        return [arg for name, v in value.items() for arg in (flag, f"{name}={v}")]
    return [flag, str(plain(value))]


def parsed(command: str, args: list[str]) -> click.Context:
    return cli.commands[command].make_context(command, args)


def spec_of(command: str, args: list[str]) -> Any:
    """What a command line sets, read as the command does (nothing is built or served)."""
    if command == "serve":
        ctx = parsed("serve", ["out", *args])
        return serve_options(ctx, Path("out"), None, None)
    return build_spec({}, typed_values(parsed(command, ["builtin:tiny-llama", "--out", "out", *args])))


def field_of(command: str, result: Any, d: Declared) -> Any:
    if command == "serve":  # a serve carries its [serve] table as its settings
        return getattr(result.settings, d.name)
    return getattr(getattr(result, d.table), d.name) if d.table else getattr(result, d.name)


@pytest.mark.parametrize("d", FLAGGED, ids=[d.where for d in FLAGGED])
def test_each_flag_sets_its_field(d: Declared) -> None:
    command, value = COMMAND[d.table], sample(d)
    if d.table is not None:
        assert field_of(command, spec_of(command, CONTEXT.get(d.name, [])), d) == d.default
    assert field_of(command, spec_of(command, [*CONTEXT.get(d.name, []), *argv(d, value)]), d) == value


@pytest.mark.parametrize("d", [d for d in all_declared() if d.table in ("build", "quant", "repo")],
                         ids=lambda d: d.where)
def test_each_toml_key_sets_its_field(d: Declared, tmp_path: Path) -> None:
    value = sample(d)
    table = {d.name: plain(value), **({"quant": CONTEXT[d.name][1]} if d.name in CONTEXT else {})}
    config = tmp_path / "trtllm-kit.toml"
    config.write_text(toml_text({"model": "builtin:tiny-llama", "out": "out", d.table: table}))
    spec = build_spec(load_toml(config), {})
    assert getattr(getattr(spec, d.table), d.name) == value


@pytest.mark.parametrize("d", [d for d in all_declared() if d.table == "serve"], ids=lambda d: d.where)
def test_each_serve_key_sets_its_field(d: Declared, tmp_path: Path) -> None:
    value = sample(d)
    config = tmp_path / "trtllm-kit.toml"
    config.write_text(toml_text({"model": "builtin:tiny-llama", "out": "built", "serve": {d.name: plain(value)}}))
    from_file = serve_options(parsed("serve", ["--config", str(config)]), None, config, None)
    assert (from_file.out, field_of("serve", from_file, d)) == (Path("built"), value)


def test_serve_flags_override_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "trtllm-kit.toml"
    config.write_text('out = "built"\n[build]\ntp = 2\n[serve]\nhost = "0.0.0.0"\nhttp_port = 9000\n'
                      'openai_port = 9100\n')
    ctx = parsed("serve", ["other", "--config", str(config), "--http-port", "8000", "--api-key", "k"])
    options = serve_options(ctx, Path("other"), config, "k")
    assert (options.out, options.endpoints.host, options.endpoints.http_port, options.endpoints.grpc_port,
            options.settings.openai_port, options.api_key) == (Path("other"), "0.0.0.0", 8000, 8001, 9100, "k")
    config.write_text('[serve]\napi_key = "secret"\n')
    with pytest.raises(KitUsageError, match=r"unknown key api_key in \[serve\]; did you mean api_keys\?"):
        serve_options(parsed("serve", ["out", "--config", str(config)]), Path("out"), config, None)


@pytest.mark.parametrize("command", ["build", "plan", "serve"])
def test_help_defaults_are_the_dataclass_defaults(command: str) -> None:
    cmd = cli.commands[command]
    ctx = click.Context(cmd, info_name=command)
    params = {p.name: p for p in cmd.params}
    shown = [d for d in FLAGGED if isinstance(params.get(d.param), click.Option)]
    assert len(shown) >= 9
    for d in shown:
        param = params[d.param]
        if not d.option.multiple:  # a repeatable flag starts empty; its table default is {}
            assert param.default == plain(d.default), d.where
        record = param.get_help_record(ctx)
        assert record is not None and d.option.help in re.sub(r"\s+", " ", record[1])
        if d.default is not None and d.kind is not dict and not (d.kind is bool and "/" not in d.option.flag):
            default = plain(d.default)
            text = d.option.flag.split("/")[0].lstrip("-") if default is True else str(default)
            assert f"[default: {text}]" in record[1], (d.where, record)


def test_flags_are_the_same_for_build_plan_and_dry_run() -> None:
    names = {c: {p.name for p in cli.commands[c].params} for c in ("build", "plan")}
    assert names["build"] - names["plan"] == {"build__force", "build__archive", "dry_run"}
    # plan's own: the fused-layer graph, the disaggregation recommendation and the cold-start phases
    assert names["plan"] - names["build"] == {"graph", "disagg", "isl", "osl", "ttft_slo", "itl_slo", "phases_file",
                                              "cold_start", "load_gbps"}


# --- the nested form: JSON and TOML round trips, and the old flat form ---------------------------------------


def toml_text(values: dict[str, Any]) -> str:
    """A TOML document of plain values (None left out, as TOML has no null)."""
    def scalar(value: Any) -> str:
        return json.dumps(value) if isinstance(value, str | bool) else repr(value)

    top = [f"{k} = {scalar(v)}" for k, v in values.items() if not isinstance(v, dict) and v is not None]
    lines = [*top]
    for table, body in values.items():
        if isinstance(body, dict):
            lines.append(f"[{table}]")
            lines += [f"{k} = {scalar(v)}" for k, v in body.items() if not isinstance(v, dict) and v is not None]
            for k, v in body.items():
                if isinstance(v, dict):
                    lines += [f"[{table}.{k}]", *(f"{name} = {scalar(x)}" for name, x in v.items())]
    return "\n".join(lines) + "\n"


def field_strategy(d: Declared) -> st.SearchStrategy[Any]:
    if d.name == "tokens_per_block":
        return st.sampled_from([1, 2, 16, 32, 64, 128])
    if d.name in ("kv_cache_fraction", "smoothquant_alpha", "lora_cache_gpu_memory_fraction"):
        return st.floats(min_value=0.01, max_value=1.0)
    if d.name.endswith("_port"):
        return st.integers(min_value=1, max_value=65535)
    if d.name == "gpu_device_ids":  # groups of distinct GPU ids, as parse_gpu_device_ids checks
        group = st.lists(st.integers(min_value=0, max_value=15), min_size=1, max_size=4, unique=True)
        return st.lists(group.map(lambda ids: ",".join(map(str, ids))), min_size=1, max_size=3).map(";".join)
    if d.name in ("calib_samples", "calib_seq_len"):  # positive, as QuantConfig checks
        return st.integers(min_value=1, max_value=4096)
    if d.kind is bool:
        return st.booleans()
    if issubclass(d.kind, Choice):
        return st.sampled_from(list(d.kind))
    if d.kind is int:
        return st.integers(min_value=d.option.minimum if d.option.minimum is not None else -5, max_value=10**6)
    if d.kind is float:
        return st.floats(min_value=0.001, max_value=1e6)
    if d.kind is dict:
        return st.dictionaries(st.sampled_from(["gemm_plugin", "multiple_profiles"]),
                               st.sampled_from(["enable", "disable", "auto"]), max_size=2)
    text = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF, blacklist_characters='"\\\x7f'), min_size=1,
                   max_size=12)
    return text.map(Path) if d.kind is Path else text


@st.composite
def specs(draw: st.DrawFn) -> BuildSpec:
    tables = {}
    for name, cls in TABLES.items():
        values = {}
        for d in all_declared((name,)):
            if d.table != name:
                continue
            strategy = field_strategy(d)
            values[d.name] = draw(st.none() | strategy) if d.optional else draw(strategy)
        if name == "quant":
            values["quant"] = draw(st.sampled_from(list(Quant)))
            values["kv_cache"] = draw(st.sampled_from(VALID_COMBINATIONS[values["quant"]]))
            if values["quant"] != Quant.INT8_SQ:
                values["per_channel"] = values["per_token"] = False
            values["awq_group_size"] = draw(st.sampled_from([64, 128])) if values["quant"] == Quant.INT4_AWQ else 128
        if name == "speculative":
            values["draft_model"] = values["draft_model"] if values["mode"] in NEEDS_DRAFT_DIR else None
            draft_len = values["mode"] not in (None, Speculation.LOOKAHEAD)
            values["max_draft_len"] = values["max_draft_len"] if draft_len else None
            values["draft_logits"] = values["draft_logits"] and values["mode"] is Speculation.DRAFT_TARGET
            trees = [None, "[[0]]", "[[0], [0, 0], [1]]"] if values["mode"] in TREE_MODES else [None]
            values["draft_choices"] = draw(st.sampled_from(trees))
            values["max_draft_len"] = None if values["draft_choices"] else values["max_draft_len"]
        tables[name] = cls(**values)
    model = draw(st.text(st.characters(min_codepoint=33, max_codepoint=126, blacklist_characters='"\\'),
                         min_size=1, max_size=20))
    return BuildSpec(model, draw(field_strategy(all_declared(())[1])), **tables)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=specs())
def test_spec_round_trips_through_json_and_toml(spec: BuildSpec, tmp_path: Path) -> None:
    nested = spec.to_dict()
    assert sorted(nested) == ["build", "model", "out", "quant", "repo", "serve", "speculative"]
    assert json.loads(json.dumps(nested)) == nested  # plain values only: enums and paths are strings
    assert BuildSpec.from_dict(json.loads(json.dumps(nested))) == spec
    config = tmp_path / "spec.toml"
    config.write_text(toml_text(nested))
    assert BuildSpec.from_dict(load_toml(config)) == spec


@settings(max_examples=50, deadline=None)
@given(spec=specs())
def test_a_flat_schema_1_spec_nests_into_the_same_spec(spec: BuildSpec) -> None:
    nested = spec.to_dict()
    flat = {"model": nested["model"], "out": nested["out"],
            **{k: v for table in ("build", "quant", "repo") for k, v in nested[table].items()}}
    assert BuildSpec.from_dict(nest_flat_spec(flat)) == BuildSpec(spec.model, spec.out, spec.build, spec.quant,
                                                                  spec.repo)


def test_a_recorded_schema_1_spec_nests() -> None:
    flat = {"model": "builtin:tiny-llama", "out": "out", "tp": 2, "pp": 1, "dtype": "auto", "until": "repo",
            "target": "auto", "verify": None, "allow_pickle": False, "force": False, "quant": "fp8",
            "kv_cache": "fp8", "gpu": "L4", "tokens_per_block": 64, "build_flags": {"gemm_plugin": "auto"},
            "archive": None, "decoupled": False, "bls_instances": 2}
    nested = nest_flat_spec(flat)
    assert nested == {"model": "builtin:tiny-llama", "out": "out",
                      "build": {"tp": 2, "pp": 1, "dtype": "auto", "until": "repo", "target": "auto", "verify": None,
                                "allow_pickle": False, "force": False, "gpu": "L4", "tokens_per_block": 64,
                                "build_flags": {"gemm_plugin": "auto"}, "archive": None},
                      "quant": {"quant": "fp8", "kv_cache": "fp8"}, "repo": {"decoupled": False, "bls_instances": 2}}
    spec = BuildSpec.from_dict(nested)
    assert (spec.build.tp, spec.quant.kv_cache, spec.repo.bls_instances) == (2, KVCache.FP8, 2)
    with pytest.raises(KitError, match=r"^the old spec has a key 'tensor_parallel' that no table declares"):
        nest_flat_spec({**flat, "tensor_parallel": 2})


def test_from_dict_refuses_unknown_keys_with_the_nearest() -> None:
    with pytest.raises(KitUsageError, match=r"^unknown key 'tokens_per_blok' in \[build\]; did you mean "
                       r"tokens_per_block\?$"):
        BuildSpec.from_dict({"model": "m", "out": "o", "build": {"tokens_per_blok": 32}})
    with pytest.raises(KitUsageError, match=r"^unknown spec key 'tp'; it belongs in \[build\]\.$"):
        BuildSpec.from_dict({"model": "m", "out": "o", "tp": 2})


# --- reserved tables -------------------------------------------------------------------------------------------


def test_deploy_table_is_left_to_its_command(tmp_path: Path) -> None:
    config = tmp_path / "trtllm-kit.toml"
    config.write_text('model = "builtin:tiny-llama"\nout = "out"\n[build]\ntp = 2\n'
                      '[deploy]\nnamespace = "llm"\nreplicas = 2\n[deploy.resources]\ngpu = 1\n')
    assert load_toml(config) == {"model": "builtin:tiny-llama", "out": "out", "build": {"tp": 2}}
    assert load_table(config, "deploy") == {"namespace": "llm", "replicas": 2, "resources": {"gpu": 1}}
    assert load_table(config, "serve") == {}


# --- the enums agree with their consumers ------------------------------------------------------------------------


def test_scheduler_policies_agree_with_the_backend_spec_the_runtime_and_the_repository() -> None:
    if True:  # the C++ backend's accepted values, as docs/triton-repo.md records them
        row = next(line for line in SPEC_DOC.read_text().splitlines() if line.startswith("| `batch_scheduler_policy`"))
        named = re.findall(r"`(\w+)`", row.split("|")[2] + row.split("|")[3])
        assert tuple(dict.fromkeys(named)) == SchedulerPolicy.values()
    assert (*SchedulerPolicy.values(), STATIC_BATCHING) == RUNTIME_SCHEDULER_POLICIES
    for policy in RUNTIME_SCHEDULER_POLICIES:  # the CPU runtime runs every policy, static for benchmarks
        assert EngineConfig.from_parameters({"batch_scheduler_policy": policy}).batch_scheduler_policy == policy
    with pytest.raises(KitUsageError, match="use one of guaranteed_no_evict, max_utilization, static"):
        EngineConfig(batch_scheduler_policy="fifo")
    limits = EngineLimits("cpu", Path("ckpt"), 8, 2048, 1024, 1, 32, True, 1, 1, slot_model="tensorrt_llm_cpu.py")
    for policy in SchedulerPolicy:
        options = resolve_options(RepoOptions(batch_scheduler_policy=policy), limits)
        made = repository_configs(limits, options, Path("c"), Path("tokenizer"))
        written = made["tensorrt_llm"].parameters["batch_scheduler_policy"].string_value
        assert (written, type(written)) == (policy.value, str)
    with pytest.raises(KitUsageError, match=r"^batch_scheduler_policy 'static' is not one of guaranteed_no_evict, "
                       r"max_utilization\.$"):
        RepoOptions(batch_scheduler_policy=STATIC_BATCHING)
    assert EngineConfig().batch_scheduler_policy == RepoOptions().batch_scheduler_policy


def test_choice_flags_offer_exactly_the_enums() -> None:
    params = {p.name: p for p in cli.commands["build"].params}
    for name, enum in {"build__dtype": Dtype, "build__until": Stage, "build__target": Target, "quant__quant": Quant,
                       "quant__kv_cache": KVCache, "repo__batch_scheduler_policy": SchedulerPolicy}.items():
        assert tuple(params[name].type.choices) == enum.values()
    assert tuple(VALID_COMBINATIONS) == Quant.values() and tuple(KV_ALGOS) == KVCache.values()


def test_enum_members_read_as_plain_strings() -> None:
    assert (Dtype.BFLOAT16 == "bfloat16", f"{Target.CPU}", str(Quant.INT8_SQ)) == (True, "cpu", "int8-sq")
    assert json.dumps({"kv": KVCache.FP8}) == '{"kv": "fp8"}'
    assert Target.parse("target", "engine") is Target.ENGINE
    with pytest.raises(KitUsageError, match=r"^target 'gpu' is not one of auto, cpu, engine, llmapi\.$"):
        Target.parse("target", "gpu")


def test_the_target_choices_are_the_registered_targets() -> None:
    from trtllm_kit.targets import AUTO_ORDER, TARGETS

    assert sorted(Target.values()) == sorted(["auto", *TARGETS])
    assert set(AUTO_ORDER) <= set(TARGETS)
