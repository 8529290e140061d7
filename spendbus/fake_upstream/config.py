"""How the fake providers behave: :class:`FakeUpstreamConfig` (validated, immutable)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator


class FakeUpstreamConfig(BaseModel):
    """How the fake providers behave (validated when built, immutable)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=8790, ge=0, le=65535)
    #: Time to the first byte (headers and first chunk), in milliseconds.
    latency_ms: float = Field(default=0.0, ge=0)
    #: Time between two chunks of a stream (a non-streamed answer waits as
    #: long as its stream would have taken).
    chunk_latency_ms: float = Field(default=0.0, ge=0)
    error_rate: float = Field(default=0.0, ge=0, le=1)
    #: Statuses an error is drawn from (each in the provider's error format).
    error_statuses: tuple[int, ...] = (429, 500)
    cut_rate: float = Field(default=0.0, ge=0, le=1)
    stream_error_rate: float = Field(default=0.0, ge=0, le=1)
    cache_ratio: float = Field(default=0.0, ge=0, le=1)
    seed: int = 0
    output_tokens: tuple[int, int] = (16, 512)
    #: Gzip bodies for clients that accept it.
    gzip: bool = False
    #: Obey the x-fake-* request headers.
    honor_headers: bool = True
    #: The key the admin usage reports want (billing.py); None: they refuse every request.
    admin_key: SecretStr | None = None
    #: The provider's price list its bill is priced by (billing.py); None: the shipped one.
    price_file: Path | None = None

    @field_validator("price_file")
    @classmethod
    def _price_file(cls, value: Path | None) -> Path | None:
        """A price list that cannot be read fails here, not in a cost report's answer."""
        if value is not None:
            from schemas.errors import SpendbusError
            from schemas.pricing import load_price_file

            try:
                load_price_file(value)
            except SpendbusError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("error_statuses")
    @classmethod
    def _statuses(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value or any(not 400 <= s <= 599 for s in value):
            raise ValueError("error_statuses must be non-empty 4xx/5xx statuses")
        return value

    @model_validator(mode="after")
    def _output_range(self) -> FakeUpstreamConfig:
        lo, hi = self.output_tokens
        if not 0 <= lo <= hi:
            raise ValueError("output_tokens must be (low, high) with 0 <= low <= high")
        return self
