"""The request context: the verified principal and the request, validated once.

:class:`Context` is what a proxy builds per request and ``check`` reads; it checks
ids, lists and counts against the contract's bounds (raising :class:`InvalidContext`
naming the field) and keeps the canonical values each counter is looked up by.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, Final

from enforcer.errors import InvalidContext
from schemas.billed_units import MAX_UNITS_PER_EVENT, valid_unit_name
from schemas.ids import CASE_INSENSITIVE_ATTRIBUTES, MAX_ID_LENGTH, canonical_id
from schemas.usage import MAX_TOKENS_PER_EVENT

MAX_GROUPS: Final = 256
MAX_TAGS: Final = 64
MAX_REQUEST_BYTES: Final = 1 << 40
#: distinct billed units a request may name in ``units``
MAX_UNIT_CAPS: Final = 32
#: completions one request may ask for (OpenAI's ``n`` is at most 128)
MAX_CANDIDATES: Final = 128


_FIELDS: Final = (
    "org_id",
    "secret_id",
    "project_id",
    "grant_id",
    "permission_id",
    "user_id",
    "groups",
    "session_id",
    "tags",
    "provider",
    "api",
    "model",
    "input_tokens",
    "request_bytes",
    "max_output_tokens",
    "candidates",
    "units",
)
_FIELD_NAMES: Final = frozenset(_FIELDS)


def _id(name: str, value: Any) -> tuple[str, ...]:
    """Validate one optional id/text field (not None); its canonical values.

    ``schemas.ids.canonical_id`` inlined (one call per field instead of three; the
    property test against ``applicable`` holds the two equal)."""
    if type(value) is not str:
        if value == "":
            return ()  # as schemas.budgets reads an absent attribute
        raise InvalidContext(name, "must be a string or null")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidContext(name, f"longer than {MAX_ID_LENGTH} characters")
    value = value.strip()
    if name in CASE_INSENSITIVE_ATTRIBUTES:
        value = value.lower()
    return (value,) if value else ()  # a blank id is no id: it names no counter


def _required(name: str, value: Any) -> None:
    if type(value) is not str or not value.strip():
        raise InvalidContext(name, "required, a non-empty string")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidContext(name, f"longer than {MAX_ID_LENGTH} characters")


def _present(value: str) -> tuple[str, ...]:
    """A blank id is no id (as schemas.budgets reads it): it names no counter."""
    return (value,) if value else ()


#: which of the always-present ids the contract lower-cases (schemas.ids.canonical_id)
_LOWER_ORG: Final = "org_id" in CASE_INSENSITIVE_ATTRIBUTES
_LOWER_SECRET: Final = "secret_id" in CASE_INSENSITIVE_ATTRIBUTES
_LOWER_GROUP: Final = "" in CASE_INSENSITIVE_ATTRIBUTES  # groups: canonical_id(g), no attribute


def _units(value: Any) -> dict[str, int]:
    """The request's unit caps: a map (or pairs) of unit name to a count."""
    pairs = value.items() if isinstance(value, Mapping) else value
    try:
        items = list(pairs)
    except TypeError:
        raise InvalidContext("units", "a map of unit name to count") from None
    if len(items) > MAX_UNIT_CAPS:
        raise InvalidContext("units", f"more than {MAX_UNIT_CAPS} units")
    out: dict[str, int] = {}
    for item in items:
        if not isinstance(item, tuple | list) or len(item) != 2:
            raise InvalidContext("units", "a map of unit name to count")
        name, count = item
        if not valid_unit_name(name):
            raise InvalidContext("units", f"{name!r} is not a unit name")
        if type(count) is not int or not 0 <= count <= MAX_UNITS_PER_EVENT:
            raise InvalidContext("units", f"{name}: an integer in 0..{MAX_UNITS_PER_EVENT}")
        if count:
            out[name] = count
    return out


def _check_count(name: str, value: Any, bound: int) -> None:
    if type(value) is not int or not 0 <= value <= bound:
        raise InvalidContext(name, f"an integer in 0..{bound} or null")


def _org_and_secret(org_id: Any, secret_id: Any) -> tuple[str, str]:
    """The canonical org (interned) and secret, required non-blank strings."""
    if type(org_id) is not str or len(org_id) > MAX_ID_LENGTH or not (org := org_id.strip()):
        _required("org_id", org_id)  # raises the precise error
        raise AssertionError  # unreachable: _required raised
    if type(secret_id) is not str or len(secret_id) > MAX_ID_LENGTH:
        _required("secret_id", secret_id)
    secret = secret_id.strip()
    if not secret:
        _required("secret_id", secret_id)
    if _LOWER_ORG:
        org = org.lower()
    if _LOWER_SECRET:
        secret = secret.lower()
    # the state holds orgs interned: lookups compare them by identity
    return sys.intern(org), secret


def _groups(groups: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The groups as given (a tuple) and their canonical values, each once, in order."""
    if type(groups) is not tuple:
        if type(groups) is not list:
            raise InvalidContext("groups", "must be a list of strings")
        groups = tuple(groups)
    group: tuple[str, ...] = ()
    if groups:
        if len(groups) > MAX_GROUPS:
            raise InvalidContext("groups", f"more than {MAX_GROUPS} groups")
        for g in groups:
            if type(g) is not str or len(g) > MAX_ID_LENGTH:
                raise InvalidContext("groups", f"each group a string of <= {MAX_ID_LENGTH}")
        if len(groups) == 1:
            one = groups[0].strip().lower() if _LOWER_GROUP else groups[0].strip()
            if one:
                group = (one,)
        else:
            group = tuple(dict.fromkeys(c for g in groups if (c := canonical_id(g))))
    return groups, group


def _tags(tags: Any, canon: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """The tags (a copy), each one's canonical value put into ``canon`` as ``tag:<name>``."""
    if not isinstance(tags, Mapping):
        raise InvalidContext("tags", "must be a map of string to string")
    if len(tags) > MAX_TAGS:
        raise InvalidContext("tags", f"more than {MAX_TAGS} tags")
    copied = dict(tags)
    for name, value in copied.items():
        if type(name) is not str or type(value) is not str:
            raise InvalidContext("tags", "must be a map of string to string")
        if len(name) > MAX_ID_LENGTH or len(value) > MAX_ID_LENGTH:
            raise InvalidContext("tags", f"keys and values of <= {MAX_ID_LENGTH} characters")
        canon[f"tag:{name}"] = _present(canonical_id(value))
    return copied


def _check_sizes(
    input_tokens: Any, request_bytes: Any, max_output_tokens: Any, candidates: Any
) -> None:
    """The request's token, byte and candidate counts are null or in the contract's range."""
    if input_tokens is not None and (
        type(input_tokens) is not int or not 0 <= input_tokens <= MAX_TOKENS_PER_EVENT
    ):
        _check_count("input_tokens", input_tokens, MAX_TOKENS_PER_EVENT)
    if request_bytes is not None:
        _check_count("request_bytes", request_bytes, MAX_REQUEST_BYTES)
    if max_output_tokens is not None and (
        type(max_output_tokens) is not int or not 0 <= max_output_tokens <= MAX_TOKENS_PER_EVENT
    ):
        _check_count("max_output_tokens", max_output_tokens, MAX_TOKENS_PER_EVENT)
    if candidates is not None and (
        type(candidates) is not int or not 1 <= candidates <= MAX_CANDIDATES
    ):
        raise InvalidContext("candidates", f"must be an integer in [1, {MAX_CANDIDATES}]")


class Context:
    """The verified principal and the request, as the proxy knows them.

    Built once per request and validated here: ids longer than the contract
    allows (the usage event would be dead-lettered, so the request would never
    be charged), wrong types, blank required ids and oversized lists raise
    :class:`InvalidContext`. Values are kept as given; which counters they
    reach is decided by the contract's canonical ids (``schemas.ids``).
    Read-only by contract (a plain slotted class: built once per request, it
    must be cheap).
    """

    __slots__ = (*_FIELDS, "canon", "group", "org", "secret", "session", "user")

    org_id: str
    secret_id: str
    project_id: str | None
    grant_id: str | None
    permission_id: str | None
    user_id: str | None
    groups: tuple[str, ...]
    session_id: str | None
    tags: Mapping[str, str]
    provider: str | None
    api: str | None
    model: str | None
    #: estimated input tokens of the request (preferred over request_bytes)
    input_tokens: int | None
    #: size of the request body, used for the input estimate when input_tokens is absent
    request_bytes: int | None
    max_output_tokens: int | None
    #: completions the request generates (OpenAI ``n``, Gemini ``candidateCount``), each
    #: up to the max output: the worst case counts every one; None for one
    candidates: int | None
    #: billed units beyond tokens the request can be charged at most, known before it is
    #: sent (a server tool's max_uses...): the worst case adds their price; None for none
    units: dict[str, int] | None
    #: derived: canonical values per attribute (``tag:<name>`` included), the canonical org
    canon: dict[str, tuple[str, ...]]
    org: str
    #: derived: the canonical secret, user and session ("" for none) and groups, as check()
    #: reads them (typed attributes: no dict lookups, fewer cache lines per check)
    secret: str
    user: str
    session: str
    group: tuple[str, ...]

    def __init__(
        self,
        *,
        # Any: each value comes from a request and is validated below; compiled (mypyc),
        # a declared type would be enforced first, with a TypeError naming no field
        # (and True would pass as an int)
        org_id: Any,
        secret_id: Any,
        project_id: Any = None,
        grant_id: Any = None,
        permission_id: Any = None,
        user_id: Any = None,
        groups: Any = (),
        session_id: Any = None,
        tags: Any = None,
        provider: Any = None,
        api: Any = None,
        model: Any = None,
        input_tokens: Any = None,
        request_bytes: Any = None,
        max_output_tokens: Any = None,
        candidates: Any = None,
        units: Any = None,
    ) -> None:
        # built once per request: one dict literal (sized once), no call for an absent
        # optional id, the contract's canonical_id inlined (the property test against
        # ``applicable`` holds the two equal)
        org, secret = _org_and_secret(org_id, secret_id)
        groups, group = _groups(groups)
        users = () if user_id is None else _id("user_id", user_id)
        sessions = () if session_id is None else _id("session_id", session_id)
        canon: dict[str, tuple[str, ...]] = {
            "org_id": (org,),
            "secret_id": (secret,),
            "project_id": () if project_id is None else _id("project_id", project_id),
            "grant_id": () if grant_id is None else _id("grant_id", grant_id),
            "permission_id": () if permission_id is None else _id("permission_id", permission_id),
            "user_id": users,
            "session_id": sessions,
            "provider": () if provider is None else _id("provider", provider),
            "api": () if api is None else _id("api", api),
            "model": () if model is None else _id("model", model),
            "group": group,
        }
        tags = {} if tags is None else _tags(tags, canon)
        _check_sizes(input_tokens, request_bytes, max_output_tokens, candidates)
        self.org_id = org_id
        self.secret_id = secret_id
        self.project_id = project_id
        self.grant_id = grant_id
        self.permission_id = permission_id
        self.user_id = user_id
        self.groups = groups
        self.session_id = session_id
        self.tags = tags
        self.provider = provider
        self.api = api
        self.model = model
        self.input_tokens = input_tokens
        self.request_bytes = request_bytes
        self.max_output_tokens = max_output_tokens
        self.candidates = candidates
        self.units = _units(units) if units else None
        self.canon = canon
        self.org = org
        self.secret = secret
        self.user = users[0] if users else ""
        self.session = sessions[0] if sessions else ""
        self.group = group

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.to_json().items())
        return f"Context({shown})"

    @classmethod
    def from_mapping(cls, data: Any) -> Context:
        """A context from JSON-like data (the sidecar, the CLI); unknown keys are refused."""
        if type(data) is not dict and not isinstance(data, Mapping):
            raise InvalidContext("<ctx>", "must be a JSON object")
        if not _FIELD_NAMES.issuperset(data):
            for name in data:
                if name not in _FIELD_NAMES:
                    raise InvalidContext(str(name), "not a context field")
        if "org_id" not in data or "secret_id" not in data:
            name = "secret_id" if "org_id" in data else "org_id"
            raise InvalidContext(name, "required, a non-empty string")
        # each field by name, not cls(**data): compiled, this is a direct call of __init__
        # (parsing 15 keyword arguments cost as much as building the context)
        fields: dict[str, Any] = data if type(data) is dict else dict(data)
        return Context(
            org_id=fields["org_id"],
            secret_id=fields["secret_id"],
            project_id=fields.get("project_id"),
            grant_id=fields.get("grant_id"),
            permission_id=fields.get("permission_id"),
            user_id=fields.get("user_id"),
            groups=fields.get("groups", ()),
            session_id=fields.get("session_id"),
            tags=fields.get("tags"),
            provider=fields.get("provider"),
            api=fields.get("api"),
            model=fields.get("model"),
            input_tokens=fields.get("input_tokens"),
            request_bytes=fields.get("request_bytes"),
            max_output_tokens=fields.get("max_output_tokens"),
            candidates=fields.get("candidates"),
            units=fields.get("units"),
        )

    # Mapping-like access for schemas.budgets (Budget.counter_keys / applicable)
    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self, name, default) if name in _FIELD_NAMES else default

    def values(self, attribute: str) -> tuple[str, ...]:
        """Canonical values of ``attribute`` (as schemas.budgets reads them)."""
        return self.canon.get(attribute, ())

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in _FIELDS:
            value = getattr(self, name)
            if value is None or (name in ("groups", "tags") and not value):
                continue
            out[name] = list(value) if name == "groups" else value
        return out
