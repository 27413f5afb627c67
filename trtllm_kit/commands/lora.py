"""``lora add|list|remove``: PEFT LoRA adapters kept in an artifact beside the base model."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import click

from trtllm_kit.commands.common import emit_json

# Each command imports the library inside its function, so that `trtllm-kit --help` and every command load
# only what they run (torch, transformers, tritonclient and matplotlib take seconds to import).

OUT = click.argument("out", type=click.Path(path_type=Path, file_okay=False))


@click.group()
def lora() -> None:
    """LoRA adapters of an artifact: checked against the base, converted for its target, recorded in its manifest.

    \b
    Example:
      trtllm-kit build builtin:tiny-llama --target cpu --dtype float32 --out out/
      trtllm-kit lora add out/ support ./my-peft-adapter    # adapter_config.json + adapter_model.safetensors
      trtllm-kit lora list out/
      trtllm-kit lora remove out/ support
    """


@lora.command("add")
@OUT
@click.argument("name")
@click.argument("adapter_dir", type=click.Path(path_type=Path))
def add(out: Path, name: str, adapter_dir: Path) -> None:
    """Check the PEFT adapter ADAPTER_DIR against OUT's model, convert it and record it as NAME."""
    from trtllm_kit.lora.store import add_adapter

    record = add_adapter(out, name, adapter_dir)
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
