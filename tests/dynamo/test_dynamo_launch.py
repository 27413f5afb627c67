"""``serve --dynamo``'s command lines, environment and refusals (no process started)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from trtllm_kit.enums import Router
from trtllm_kit.errors import KitUsageError
from trtllm_kit.serve.dynamo.launch import DynamoDirs, dynamo_env, frontend_argv, router_args, worker_argv
from trtllm_kit.serve.dynamo.run import check_dynamo
from trtllm_kit.serve.options import ServeOptions
from trtllm_kit.spec import ServeSettings


def test_environment_keeps_everything_on_loopback_and_under_the_run_dir(tmp_path: Path) -> None:
    dirs = DynamoDirs(tmp_path / "dynamo")
    env = dynamo_env(dirs, {"PATH": "/usr/bin", "HOME": "/root", "TRTLLM_KIT_API_KEY": "secret"})
    assert env["DYN_DISCOVERY_BACKEND"] == "file" and env["DYN_FILE_KV"] == str(tmp_path / "dynamo" / "discovery")
    assert env["HOME"] == str(tmp_path / "dynamo" / "home")  # the frontend's model-card cache
    for name in ("DYN_TCP_RPC_HOST", "DYN_EVENT_PLANE_HOST", "DYN_TCP_RESPONSE_STREAM_HOST", "DYN_SYSTEM_HOST"):
        assert env[name] == "127.0.0.1"
    assert "TRTLLM_KIT_API_KEY" not in env


def test_command_lines(tmp_path: Path) -> None:
    assert frontend_argv(8123, Router.ROUND_ROBIN, 0) == [
        sys.executable, "-m", "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", "8123",
        "--router-mode", "round-robin", "--migration-limit", "0"]
    assert frontend_argv(8123, Router.KV, 3)[7:] == [
        "--router-mode", "kv", "--router-kv-overlap-score-credit", "4", "--router-prefill-load-scale", "4",
        "--migration-limit", "3"]
    dirs = DynamoDirs(tmp_path / "dynamo")
    assert worker_argv(tmp_path / "out", dirs, "tiny", 1) == [
        sys.executable, "-m", "trtllm_kit.serve.dynamo.worker", str(tmp_path / "out"), "--card",
        str(tmp_path / "dynamo" / "card"), "--model-name", "tiny", "--endpoint", "trtllm-kit.worker.generate",
        "--ready-file", str(tmp_path / "dynamo" / "ready" / "worker-1"),
        "--requests", str(tmp_path / "dynamo" / "requests")]


@pytest.mark.parametrize(("argv", "credit", "scale"), [
    (frontend_argv(8123, Router.KV, 3)[3:], 4.0, 4.0),  # serve --dynamo: the CPU workers' prefill load scale
    (["--http-port", "8000", *router_args(Router.KV), "--migration-limit", "3"], 4.0, 1.0),  # deploy dynamo's credit
])
def test_kv_routing_weights_in_dynamos_parser(argv: list[str], credit: float, scale: float) -> None:
    frontend_args = pytest.importorskip("dynamo.frontend.frontend_args")
    parser = argparse.ArgumentParser()
    frontend_args.FrontendArgGroup().add_arguments(parser)
    with pytest.warns(FutureWarning):  # the flags move to --router-policy-config in Dynamo 1.7
        parsed, unknown = parser.parse_known_args(argv)
    config = frontend_args.FrontendConfig.from_cli_args(parsed)
    config.validate()
    assert unknown == [] and config.router_mode == "kv"
    assert (config.overlap_score_credit, config.prefill_load_scale) == (credit, scale)


def test_defaults_are_kv_routing_and_three_migrations() -> None:
    settings = ServeSettings()
    assert (settings.dynamo, settings.router, settings.migration_limit) == (False, Router.KV, 3)


@pytest.mark.parametrize("options, message", [
    (ServeOptions(Path("out"), ServeSettings(dynamo=True)), "--dynamo serves the OpenAI API in front of Dynamo's "
                                                           "frontend; add --openai-port PORT."),
    (ServeOptions(Path("out"), ServeSettings(dynamo=True, openai_port=9000), more=(Path("other"),)),
     "--dynamo serves one OUT, got 2; serve the others separately."),
    (ServeOptions(Path("out"), ServeSettings(dynamo=True, openai_port=9000), aliases=("chat=a:90,b:10",)),
     "--alias chat=a:90,b:10 splits requests over two or more served models, and --dynamo serves one; leave it "
     "out."),
    (ServeOptions(Path("out"), ServeSettings(dynamo=True, openai_port=9000, disagg=True)),
     "--disagg is not available with --dynamo yet; leave it out."),
    (ServeOptions(Path("out"), ServeSettings(dynamo=True, openai_port=9000, router=Router.PREFIX)),
     "--router prefix is not one of Dynamo's router modes; give --router kv, round-robin or random with --dynamo."),
])
def test_refusals(options: ServeOptions, message: str) -> None:
    with pytest.raises(KitUsageError) as caught:
        check_dynamo(options)
    assert str(caught.value) == message
