"""`spendbus enforcer serve` (the sidecar) and `spendbus check` (one decision from the shell)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from schemas.errors import SpendbusError
from spendbus.settings import load_settings
from spendbus.stack.local import bootstrap_or_fail

#: the one environment variable this command reads besides spendbus.settings'
TOKEN_ENV = "SPENDBUS_ENFORCER_TOKEN"
#: the sidecar's token file in SPENDBUS_HOME, made (random, 0600) on first start on
#: loopback when no token is given, as the worker's web.token is
DEFAULT_TOKEN_FILE = "enforcer.token"
#: bytes of randomness in a token made here (URL-safe base64: 43 characters)
TOKEN_BYTES = 32

log = logging.getLogger("spendbus.enforcer.serve")


def _config(**values: Any) -> Any:
    from enforcer import load_config

    settings = load_settings()
    return load_config(
        "spendbus enforcer",
        bootstrap=bootstrap_or_fail(settings),
        kafka_security=settings.kafka_security,
        topic_prefix=settings.topic_prefix,
        **values,
    )


@click.group()
def enforcer() -> None:
    """The budget enforcer: its HTTP sidecar for proxies in other languages."""


@enforcer.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Listen address.")
@click.option("--port", default=8787, show_default=True, type=int, help="Listen port (0: any).")
@click.option(
    "--unix",
    "unix",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Listen on this unix socket (made 0600) instead of --host/--port; its permissions "
    "fence it, so no token is made.",
)
@click.option(
    "--token-file",
    default=None,
    help=f"A file of bearer tokens accepted on /v1/*, one a line, each its own caller "
    f"(`-`: one from standard input); or ${TOKEN_ENV}. Default: <home>/{DEFAULT_TOKEN_FILE}, "
    "made on first start on loopback. Needed off loopback.",
)
@click.option(
    "--insecure-loopback",
    is_flag=True,
    help="No token: every local process may use /v1/* (loopback only; logged).",
)
@click.option(
    "--token",
    envvar=TOKEN_ENV,
    default=None,
    hidden=True,  # the variable's home; as an argument it is refused (ps shows argv)
)
@click.option("--fail-mode", type=click.Choice(["open", "closed"]), default=None)
@click.option("--grace", type=float, default=None, help="Seconds of verdict staleness allowed.")
@click.option("--refusal-style", type=click.Choice(["default", "native", "seed000"]), default=None)
@click.option("--hold-timeout", type=float, default=None, help="Seconds a hold may live.")
@click.option(
    "--default-max-output-tokens", type=int, default=None, help="Held when a request has none."
)
@click.option(
    "--replicas",
    type=int,
    default=None,
    help="Enforcers admitting against the same budgets; each holds <= 1/replicas of the headroom.",
)
@click.option(
    "--membership",
    is_flag=True,
    default=None,
    help="Count the replicas through the enforcers' Kafka consumer group (--replicas: a floor).",
)
@click.option(
    "--max-replicas",
    type=int,
    default=None,
    help="With --membership: assumed until the count is known and while newly joined.",
)
@click.option(
    "--membership-grace",
    type=float,
    default=None,
    help="With --membership: seconds the largest recent count is kept after a change.",
)
@click.option(
    "--unpriced-models",
    type=click.Choice(["refuse", "allow_free"]),
    default=None,
    help="Enforce USD budgets, a model without a price: refuse (default) or admit at $0.",
)
@click.option(
    "--max-in-flight-per-key",
    type=click.IntRange(min=1),
    default=None,
    help="Holds of one secret_id in flight at once; a check past it: 429 throttled.",
)
@click.option(
    "--max-sessions-per-key",
    type=click.IntRange(min=1),
    default=None,
    help="New session ids one secret_id may open per UTC day under a session budget "
    "(default 1000); past it: 429 too_many_sessions.",
)
@click.option(
    "--policy-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A Rego policy consulted on every check (allow | deny | approval).",
)
@click.option("--gateway-id", default=None, help="gateway_id of published refusal events.")
@click.option("--no-publish-refusals", is_flag=True, help="Do not publish refusal events.")
@click.option(
    "--spool-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where refusal events wait for the broker (default: <home>/enforcer-spool/<port>).",
)
@click.option("--log-level", default="INFO", show_default=True)
def serve(
    host: str,
    port: int,
    unix: Path | None,
    token_file: str | None,
    token: str | None,
    insecure_loopback: bool,
    fail_mode: str | None,
    grace: float | None,
    refusal_style: str | None,
    hold_timeout: float | None,
    default_max_output_tokens: int | None,
    replicas: int | None,
    membership: bool | None,
    max_replicas: int | None,
    membership_grace: float | None,
    unpriced_models: str | None,
    max_in_flight_per_key: int | None,
    max_sessions_per_key: int | None,
    policy_file: Path | None,
    gateway_id: str | None,
    no_publish_refusals: bool,
    spool_dir: Path | None,
    log_level: str,
) -> None:
    """Serve /v1/check, /v1/settle, /v1/usage, /healthz, /readyz and /metrics.

    /v1/* need a bearer token: --token-file, $SPENDBUS_ENFORCER_TOKEN, or on loopback
    <home>/enforcer.token, made on first start (0600); --unix PATH or --insecure-loopback
    serve without one."""
    from runtime.net import is_loopback
    from spendbus.secret_input import refuse_on_command_line

    refuse_on_command_line(
        "token", f"use --token-file FILE (or -, standard input) or set {TOKEN_ENV}"
    )
    tokens = _tokens_given(token_file, token)
    if insecure_loopback:
        _check_insecure_loopback(host, unix, has_token=bool(tokens))

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    made_file: Path | None = None
    if not tokens and not insecure_loopback and unix is None and is_loopback(host):
        made_file = default_token_file()
        tokens = ensure_token_file(made_file)
    try:
        config = _config(
            sidecar_host=host,
            sidecar_port=port,
            sidecar_unix=None if unix is None else str(unix.resolve()),
            sidecar_insecure_loopback=insecure_loopback or None,
            sidecar_token=tokens[0] if tokens else None,
            sidecar_tokens=tuple(tokens[1:]) or None,
            fail_mode=fail_mode,
            grace_s=grace,
            refusal_style=refusal_style,
            hold_timeout_s=hold_timeout,
            default_max_output_tokens=default_max_output_tokens,
            replicas=replicas,
            membership=membership,
            max_replicas=max_replicas,
            membership_grace_s=membership_grace,
            unpriced_models=unpriced_models,
            sidecar_max_in_flight_per_key=max_in_flight_per_key,
            max_sessions_per_key=max_sessions_per_key,
            policy_file=policy_file,
            gateway_id=gateway_id,
            publish_refusals=not no_publish_refusals,
        )
        job_secret = policy_job_key_secret(config)
    except SpendbusError as exc:
        raise click.ClickException(str(exc)) from None

    def started(sidecar: Any) -> None:
        where = f"unix:{unix.resolve()}" if unix is not None else f"http://{host}:{sidecar.port}"
        line: dict[str, Any] = {"listening": where}
        if made_file is not None:  # where the token is, never what it is
            line["token_file"] = str(made_file)
        elif token_file not in (None, "-"):
            line["token_file"] = str(Path(str(token_file)).resolve())
        click.echo(json.dumps(line), err=True)

    spool = spool_dir or (load_settings().home / "enforcer-spool" / str(port))
    try:  # the sidecar serves many small requests: uvloop's event loop cuts their cost
        import uvloop
    except ImportError:
        asyncio.run(serve_publishing_refusals(config, spool.resolve(), started, job_secret))
    else:
        uvloop.run(serve_publishing_refusals(config, spool.resolve(), started, job_secret))


def policy_job_key_secret(config: Any) -> bytes | None:
    """With a policy file: the policy checked now (a bad file is a clear error before
    anything starts) and the job-key secret its approvals need; else None."""
    if config.policy_file is None:
        return None
    from enforcer import Policy
    from spendbus.stack.key_secret import job_key_secret

    Policy(config.policy_file, config.policy_query)
    return job_key_secret(load_settings())


def _tokens_given(token_file: str | None, token: str | None) -> list[str]:
    """The bearer tokens from --token-file (``-``: standard input) or the environment's one
    token; none when neither is given."""
    from spendbus.secret_input import read_secret

    if token_file is not None:
        if token:
            raise click.UsageError(f"--token-file and {TOKEN_ENV} are both set: keep one")
        if token_file == "-":
            return [read_secret(token_file, "bearer token")]
        return read_tokens(Path(token_file))
    if token is not None:
        if not token.strip():
            raise click.UsageError(f"{TOKEN_ENV} is empty")
        return [token.strip()]
    return []


def _check_insecure_loopback(host: str, unix: Path | None, *, has_token: bool) -> None:
    """--insecure-loopback serves /v1/* without a token: only alone, and only on loopback."""
    from runtime.net import is_loopback

    if has_token:
        raise click.UsageError(
            f"--insecure-loopback and a token (--token-file or {TOKEN_ENV}): keep one"
        )
    if unix is not None:
        raise click.UsageError("--insecure-loopback is for --host; --unix needs no token")
    if not is_loopback(host):
        raise click.UsageError(
            f"--insecure-loopback: only on loopback (127.0.0.1, ::1, localhost), not {host}"
        )


def default_token_file() -> Path:
    """``$SPENDBUS_HOME/enforcer.token``: what the sidecar's clients read by default."""
    return (load_settings().home / DEFAULT_TOKEN_FILE).resolve()


def read_tokens(path: Path) -> list[str]:
    """The tokens of a token file: every non-blank line that is not a ``#`` comment."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise click.BadParameter(
            f"{path}: cannot read the bearer tokens ({exc.strerror})"
        ) from None
    tokens = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not tokens:
        raise click.BadParameter(f"{path}: no bearer token in it")
    return tokens


def ensure_token_file(path: Path) -> list[str]:
    """The tokens of ``path``, made first (one random token, mode 0600) when missing; a
    file others may read is refused (its token is not a secret any more)."""
    import secrets

    from runtime.private_files import secret_file_problem
    from spendbus.stack.secret_file import create_once

    if not path.exists() and create_once(path, secrets.token_urlsafe(TOKEN_BYTES)):
        log.info("made the sidecar's bearer token: %s (mode 0600; clients send its line)", path)
    else:
        problem = secret_file_problem(path, str(path))
        if problem is not None:  # exit status 2, as every other secret file others can read
            refused = click.ClickException(f"{problem}; or remove it to have a new one made")
            refused.exit_code = 2
            raise refused
        log.info("the sidecar's bearer token: %s", path)
    return read_tokens(path)


async def serve_publishing_refusals(
    config: Any,
    spool_dir: Path,
    on_started: Callable[[Any], None],
    job_key_secret: bytes | None = None,
) -> None:
    """The sidecar, its refusal events going through the ingest publisher (spooled in
    ``spool_dir``, sent with its retries: a refusal made while the broker is away arrives
    once it is back); the publisher starts first and stops last."""
    from enforcer import serve as run_sidecar
    from ingest.publisher import PublisherConfig, UsagePublisher
    from schemas.usage_sink import UsageSink

    if not config.publish_refusals:
        await run_sidecar(config, on_started=on_started, job_key_secret=job_key_secret)
        return
    publisher = UsagePublisher(
        PublisherConfig(
            bootstrap=config.bootstrap,
            kafka_security=config.kafka_security,
            topic_prefix=config.topic_prefix,
            spool_dir=spool_dir,
            client_id=f"{config.client_id}-refusals",
        )
    )
    await publisher.start()
    try:
        refusals: UsageSink = publisher  # mypy checks that the publisher fits the protocol
        await run_sidecar(
            config, refusals=refusals, on_started=on_started, job_key_secret=job_key_secret
        )
    finally:
        await publisher.stop()


@click.command("check")
@click.option("--org-id", required=True)
@click.option("--secret-id", required=True)
@click.option("--project-id")
@click.option("--grant-id")
@click.option("--permission-id")
@click.option("--user-id")
@click.option("--group", "groups", multiple=True, help="Repeat for each group.")
@click.option("--session-id")
@click.option("--tag", "tags", multiple=True, help="name=value; repeat for each tag.")
@click.option("--provider")
@click.option("--api")
@click.option("--model")
@click.option("--input-tokens", type=int, help="Estimated input tokens of the request.")
@click.option("--request-bytes", type=int, help="Request size, when no token estimate.")
@click.option("--max-output-tokens", type=int)
@click.option("--fail-mode", type=click.Choice(["open", "closed"]), default=None)
@click.option("--refusal-style", type=click.Choice(["default", "native", "seed000"]), default=None)
@click.option("--timeout", type=float, default=60.0, show_default=True, help="Seconds to load.")
def check(
    groups: tuple[str, ...],
    tags: tuple[str, ...],
    fail_mode: str | None,
    refusal_style: str | None,
    timeout: float,
    **fields: Any,
) -> None:
    """Print the decision for one request as JSON (exit 0 allowed, 2 refused, 1 error).

    Reads the topics like an enforcer, waits until caught up, then decides
    without holding anything (a check from the shell is not a request).
    """
    from enforcer import Context, Enforcer

    tag_map: dict[str, str] = {}
    for tag in tags:
        name, sep, value = tag.partition("=")
        if not sep:
            raise click.ClickException(f"--tag {tag!r}: expected name=value")
        tag_map[name] = value
    try:
        ctx = Context(
            groups=groups,
            tags=tag_map,
            **{k: v for k, v in fields.items() if v is not None},
        )
        config = _config(fail_mode=fail_mode, refusal_style=refusal_style)
    except SpendbusError as exc:  # InvalidContext too: exit 1, never the 2 of a refusal
        raise click.ClickException(str(exc)) from None

    async def decide() -> Any:
        async with Enforcer(config) as e:
            await e.wait_ready(timeout)
            return e.peek(ctx)

    try:
        decision = asyncio.run(decide())
    except SpendbusError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps(decision.to_json(), indent=2))
    click.get_current_context().exit(0 if decision.allowed else 2)
