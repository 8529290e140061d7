"""The source of a generated function: its lines, fresh local names and constants, compiled
once (the Avro body writer and reader are generated from their schema)."""

from __future__ import annotations

from typing import Any


class GeneratedSource:
    """Lines of the generated function, with fresh local names."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.constants: dict[str, Any] = {}
        self._names = 0

    def name(self, prefix: str) -> str:
        self._names += 1
        return f"{prefix}{self._names}"

    def constant(self, value: Any) -> str:
        name = self.name("_k")
        self.constants[name] = value
        return name

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)

    def define(self, function: str, label: str, namespace: dict[str, Any]) -> Any:
        """Compile the lines (named ``label`` in tracebacks) with ``namespace`` and the
        constants as globals; the function named ``function`` they define."""
        namespace = {**namespace, **self.constants}
        exec(compile("\n".join(self.lines), label, "exec"), namespace)
        return namespace[function]
