"""``lora add|list|remove``: PEFT LoRA adapters kept in an artifact beside the base model."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import click

from trtllm_kit.commands.output import emit_json

# Each command imports the library inside its function, so that `trtllm-kit --help` and every command load
# only what they run (torch, transformers, tritonclient and matplotlib take seconds to import).

OUT = click.argument("out", type=click.Path(path_type=Path, file_okay=False))
FORCE = click.option("--force", is_flag=True, help="Take the adapter even when the base model its adapter_config.json "
                     "records (base_model_name_or_path) is not OUT's model by name.")


@click.group()
def lora() -> None:
    """LoRA adapters of an artifact: checked against the base, converted for its target, recorded in its manifest.

    \b
    Example:
      trtllm-kit build builtin:tiny-llama --target cpu --dtype float32 --out out/
      trtllm-kit lora add out/ support ./my-peft-adapter    # adapter_config.json + adapter_model.safetensors
      trtllm-kit lora add out/ other ./renamed-base-adapter --force   # its recorded base is this model, renamed
      trtllm-kit lora list out/
      trtllm-kit lora remove out/ support
      trtllm-kit lora load out/ billing ./billing-adapter   # on the running serve of out/ (not kept in out/)
      trtllm-kit lora unload out/ billing
    """


@lora.command("add")
@OUT
@click.argument("name")
@click.argument("adapter_dir", type=click.Path(path_type=Path))
@FORCE
def add(out: Path, name: str, adapter_dir: Path, force: bool) -> None:
    """Check the PEFT adapter ADAPTER_DIR against OUT's model, convert it and record it as NAME."""
    from trtllm_kit.lora.store import add_adapter

    record = add_adapter(out, name, adapter_dir, force=force)
    click.echo(f"added adapter {record.name!r} (rank {record.rank}, {', '.join(record.target_modules)}) to {out}.")


@lora.command("list")
@OUT
@click.option("--json", "as_json", is_flag=True, help="Print the records as JSON.")
def list_command(out: Path, as_json: bool) -> None:
    """List OUT's adapters: name, rank, alpha, target modules and source."""
    from trtllm_kit.lora.store import list_adapters

    records = list_adapters(out)
    if as_json:
        emit_json([asdict(r) for r in records])
        return
    for r in records:
        click.echo(f"{r.name}\trank={r.rank}\talpha={r.alpha:g}\t{','.join(r.target_modules)}\t{r.source}")


@lora.command("remove")
@OUT
@click.argument("name")
def remove(out: Path, name: str) -> None:
    """Remove the adapter NAME from OUT."""
    from trtllm_kit.lora.store import remove_adapter

    remove_adapter(out, name)
    click.echo(f"removed adapter {name!r} from {out}.")


URL = click.option("--url", help="The serve's OpenAI frontend, http://HOST:PORT (instead of OUT).")
API_KEY = click.option("--api-key", envvar="TRTLLM_KIT_API_KEY",
                       help="An admin key when the serve has gateway keys (env TRTLLM_KIT_API_KEY).")


def _split(served: tuple[str, ...], url: str | None, names: str) -> tuple[Path | None, list[str]]:
    """``[OUT] ARGS...``: OUT is given unless --url is."""
    wanted = len(names.split())
    if len(served) == wanted + (url is None):
        return (None if url is not None else Path(served[0])), list(served[-wanted:])
    raise click.UsageError(f"expected {'' if url is not None else 'OUT '}{names} (with --url, no OUT), got "
                           f"{len(served)} argument(s).")


@lora.command("load")
@click.argument("served", nargs=-1, required=True, metavar="[OUT] NAME DIR")
@URL
@API_KEY
@FORCE
def load(served: tuple[str, ...], url: str | None, api_key: str | None, force: bool) -> None:
    """Serve the PEFT adapter DIR as NAME on the running serve of OUT (or of --url, without OUT).

    The adapter is checked as lora add checks it; it is served until unloaded or the serve stops (OUT is not changed).
    """
    from trtllm_kit.serve.lora_admin import call_adapter_endpoint, frontend_url

    out, (name, adapter_dir) = _split(served, url, "NAME DIR")
    body = {"lora_name": name, "lora_path": str(Path(adapter_dir).absolute()), **({"force": True} if force else {})}
    click.echo(call_adapter_endpoint(frontend_url(out, url), "/v1/load_lora_adapter", body, api_key))


@lora.command("unload")
@click.argument("served", nargs=-1, required=True, metavar="[OUT] NAME")
@URL
@API_KEY
def unload(served: tuple[str, ...], url: str | None, api_key: str | None) -> None:
    """Stop serving the adapter NAME on the running serve of OUT (or of --url, without OUT)."""
    from trtllm_kit.serve.lora_admin import call_adapter_endpoint, frontend_url

    out, (name,) = _split(served, url, "NAME")
    click.echo(call_adapter_endpoint(frontend_url(out, url), "/v1/unload_lora_adapter", {"lora_name": name},
                                     api_key))
