"""``keys add|list|revoke``: the OpenAI gateway's API keys, stored as salted hashes in a key file."""

from __future__ import annotations

from pathlib import Path

import click

from trtllm_kit.commands.output import emit_json

# Each command imports the library inside its function, so that `trtllm-kit --help` and every command load
# only what they run (torch, transformers, tritonclient and matplotlib take seconds to import).

KEYS_OPTION = click.option("--keys", "keys_path", type=click.Path(path_type=Path, dir_okay=False), required=True,
                           help="The key file (created when missing; serve it with --api-keys FILE).")


@click.group()
def keys() -> None:
    """API keys for serve --api-keys FILE: each with an optional tenant, models, rate limits and a quota.

    \b
    Example:
      trtllm-kit keys add team-a --keys keys.json --models builtin:tiny-llama --rps 5 --tpm 20000
      trtllm-kit keys add team-b --keys keys.json --quota-tokens 1000000 --quota-period month
      trtllm-kit keys add ops --keys keys.json --admin    # may read the per-key metrics
      trtllm-kit keys list --keys keys.json
      trtllm-kit keys revoke team-a --keys keys.json   # then: kill -HUP <serve pid>
    """


@keys.command("add")
@click.argument("name")
@KEYS_OPTION
@click.option("--tenant", help="Who the key belongs to (a label on the usage counters).")
@click.option("--models", help="Comma-separated models the key may use (default: all).")
@click.option("--rps", type=click.FloatRange(min=0, min_open=True), help="Requests per second (a token bucket).")
@click.option("--tpm", type=click.IntRange(min=1), help="Prompt plus completion tokens per minute (a token bucket).")
@click.option("--quota-tokens", type=click.IntRange(min=1), help="Tokens per --quota-period.")
@click.option("--quota-period", type=click.Choice(["day", "month"]), help="The quota's UTC calendar period.")
@click.option("--admin", is_flag=True, help="The key may also read the per-key series of the frontend's /metrics.")
def add(name: str, keys_path: Path, tenant: str | None, models: str | None, rps: float | None, tpm: int | None,
        quota_tokens: int | None, quota_period: str | None, admin: bool) -> None:
    """Create the key NAME and print its secret once (only its salted SHA-256 is stored)."""
    from trtllm_kit.serve.gateway.keys import add_key

    listed = tuple(m.strip() for m in models.split(",") if m.strip()) if models else ()
    secret, _ = add_key(keys_path, name, tenant=tenant, models=listed, rps=rps, tpm=tpm, quota_tokens=quota_tokens,
                        quota_period=quota_period, admin=admin)
    click.echo(secret)
    click.echo(f"added key {name!r} to {keys_path}; this is the only time the key is shown.", err=True)


@keys.command("list")
@KEYS_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the records as JSON.")
def list_keys(keys_path: Path, as_json: bool) -> None:
    """List the keys' names, tenants, models, limits and state (never the keys)."""
    from trtllm_kit.serve.gateway.keys import read_keys

    records = [r.public() for r in read_keys(keys_path).records] if keys_path.exists() else []
    if as_json:
        emit_json(records)
        return
    for r in records:
        quota = f"{r['quota_tokens']}/{r['quota_period']}" if r["quota_tokens"] else "-"
        click.echo(f"{r['name']}\ttenant={r['tenant'] or '-'}\tmodels={','.join(r['models']) or '*'}\t"
                   f"rps={r['rps'] or '-'}\ttpm={r['tpm'] or '-'}\tquota={quota}\t"
                   f"{'admin' if r['admin'] else 'user'}\t{'revoked' if r['revoked'] else 'live'}")


@keys.command("revoke")
@click.argument("name")
@KEYS_OPTION
def revoke(name: str, keys_path: Path) -> None:
    """Revoke the key NAME (a running serve drops it on SIGHUP)."""
    from trtllm_kit.serve.gateway.keys import revoke_key

    revoke_key(keys_path, name)
    click.echo(f"revoked {name!r} in {keys_path}; send SIGHUP to a running serve to apply it.")
