"""Where a key the config must not hold comes from: an environment variable or a file.

Provider keys (`providers[].api_key`) and, for the fast lane, client keys
(`tenants[].keys[].secret`) are read this way (secrets.py reads them); the YAML names
only the variable or the file. Its own module because schema.py and admission.py both
use it, and schema.py imports admission.py.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class KeySource(BaseModel):
    """Exactly one of `env` (a variable's name) or `file` (relative to the YAML's folder)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    file: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> KeySource:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of 'env' or 'file'")
        return self
