"""One serve as a value: the settings it carries, and the command line ``serve --detach`` hands its child."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtllm_kit.enums import Server
from trtllm_kit.errors import KitUsageError
from trtllm_kit.serve.options import ServeOptions, parse_names
from trtllm_kit.spec import ServeSettings


def test_command_line_names_every_setting_that_differs_from_its_default(tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    settings = ServeSettings(http_port=9100, grpc_port=9101, metrics_port=9102, openai_port=9200, verify=True,
                             api_keys=keys, ready_timeout_s=120, server=Server.TRITON)
    options = ServeOptions(out=Path("out-a"), settings=settings, api_key="secret", more=(Path("out-b"),),
                           names=("b=out-b",), aliases=("chat=a:90,b:10",))
    assert options.command_line() == [
        "out-a", "--http-port", "9100", "--grpc-port", "9101", "--metrics-port", "9102", "--openai-port", "9200",
        "--api-keys", str(keys.absolute()), "--ready-timeout", "120.0", "--verify", "out-b", "--name", "b=out-b",
        "--alias", "chat=a:90,b:10"]
    assert "secret" not in options.command_line()  # the key goes through the environment, never argv


def test_endpoints_and_outs_follow_the_settings_and_names() -> None:
    options = ServeOptions(out=Path("a"), settings=ServeSettings(host="127.0.0.1", http_port=9300),
                           names=("b=b", "a2=a"))
    assert options.endpoints.url("http") == "127.0.0.1:9300"
    assert options.outs == [Path("a"), Path("b")]
    assert ServeOptions(out=Path("a"), settings=ServeSettings(server=Server.TRTLLM_SERVE)).command_line() == [
        "a", "--server", "trtllm-serve"]


@pytest.mark.parametrize("value", ["small", "=out", "small="])
def test_a_name_without_name_and_out_is_refused(value: str) -> None:
    with pytest.raises(KitUsageError, match="is not NAME=OUT"):
        parse_names((value,))
