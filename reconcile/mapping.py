"""Which provider key each gateway credential is: the mapping file.

The gateway names its upstream credentials ``secrets.<secret_id>`` (gateway.yaml); usage
events carry that ``secret_id``. The provider's reports name the same credential by its
own key id (OpenAI ``api_key_id`` with its ``project_id``, Anthropic ``api_key_id`` with
its ``workspace_id``; Bedrock's CUR rows the AWS account id, ``line_item_usage_account_id``;
Gemini's billing export the Google Cloud project, ``project.id``, which is all a Gemini
credential is known by there). The mapping file joins them::

    credentials:
      sk-openai: {provider: openai, api_key_id: key_abc123, project_id: proj_x}
      sk-anthropic: {provider: anthropic, api_key_id: apikey_01Rj2N8S, workspace_id: wrkspc_01}
      sk-gemini: {provider: gemini, project_id: my-gemini-project}
      sk-shared:                # one gateway credential sent to several providers
        - {provider: openai, api_key_id: key_def456}
        - {provider: gemini, project_id: shared-project}

A credential names at most one key per provider. Two Gemini credentials of one project cannot be told apart in its export: mapping a
project twice is refused, like any key mapped twice.

A provider key that no gateway credential maps to, or a credential with no mapping, is a
named gap in the reconciliation, never silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from schemas.errors import ConfigError

from .provider_reports import IMPORT_PROVIDERS


@dataclass(frozen=True)
class CredentialMapping:
    """(secret_id, provider) -> the provider's key id, and back."""

    keys: dict[tuple[str, str], str]

    def secret_of(self, provider: str, api_key_id: str) -> str | None:
        for (secret_id, key_provider), key_id in self.keys.items():
            if (key_provider, key_id) == (provider, api_key_id):
                return secret_id
        return None

    def key_of(self, secret_id: str, provider: str) -> str | None:
        """The key id ``provider``'s reports name ``secret_id`` by (None: not mapped)."""
        return self.keys.get((secret_id, provider))


def mapping_from_data(data: Any, source: str) -> CredentialMapping:
    """The mapping of a parsed file; ConfigError naming the entry for anything else."""
    if not isinstance(data, dict) or not isinstance(data.get("credentials"), dict):
        raise ConfigError(f"{source}: expected 'credentials:' mapping each secret_id to its key")
    unknown = set(data) - {"credentials"}
    if unknown:
        raise ConfigError(f"{source}: unknown field(s) {sorted(unknown)}")
    keys: dict[tuple[str, str], str] = {}
    seen: dict[tuple[str, str], str] = {}
    for secret_id, entries in data["credentials"].items():
        where = f"{source}: credentials.{secret_id}"
        if isinstance(entries, list) and entries:
            listed = [(f"{where}[{n}]", entry) for n, entry in enumerate(entries)]
        else:
            listed = [(where, entries)]
        for at, entry in listed:
            provider, key_id = _entry(entry, at)
            if (str(secret_id), provider) in keys:
                raise ConfigError(f"{at}: a second {provider} key for {secret_id}")
            if (provider, key_id) in seen:
                raise ConfigError(
                    f"{at}: {provider} key {key_id} is already mapped to {seen[(provider, key_id)]}"
                )
            seen[(provider, key_id)] = str(secret_id)
            keys[(str(secret_id), provider)] = key_id
    return CredentialMapping(keys)


def _entry(entry: Any, where: str) -> tuple[str, str]:
    """One key of a credential: (provider, key id); ConfigError naming ``where`` else."""
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: expected {{provider: ..., api_key_id: ...}} or a list of them")
    extra = set(entry) - {"provider", "api_key_id", "project_id", "workspace_id"}
    if extra:
        raise ConfigError(f"{where}: unknown field(s) {sorted(extra)}")
    provider, key_id = entry.get("provider"), entry.get("api_key_id")
    if provider not in IMPORT_PROVIDERS:
        raise ConfigError(f"{where}: provider must be one of {', '.join(IMPORT_PROVIDERS)}")
    if provider == "gemini":  # its export names the project, no key
        if key_id is not None:
            raise ConfigError(
                f"{where}: a gemini credential is mapped by project_id (its billing "
                "export names no API key)"
            )
        key_id = entry.get("project_id")
        if not isinstance(key_id, str) or not key_id:
            raise ConfigError(f"{where}: project_id is required (the export's project.id)")
    if not isinstance(key_id, str) or not key_id:
        raise ConfigError(f"{where}: api_key_id is required (the id the provider's reports use)")
    return str(provider), key_id


def load_mapping(path: Path) -> CredentialMapping:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the credential mapping ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not YAML ({exc})") from None
    return mapping_from_data(data, str(path))
