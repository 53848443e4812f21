"""``GET /v1/keys``: the public key that signs every published corpus.

The registry signs each job's corpus with its Ed25519 key (``jobs.core.signing``,
created beside the database on the first start); this route serves only the
public half, so ``kiln corpus verify`` can check a corpus's trailer.  The
body is the document ``jobs.core.signing.parse_keys`` reads back (also accepted by
``kiln corpus verify --public-key FILE``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends
from pydantic import Field
from starlette.concurrency import run_in_threadpool

from kiln_registry.api.context import RegistryContext
from kiln_registry.api.routes import get_ctx
from kiln_registry.api.routes.responses import error_responses
from kiln_registry.jobs.core import signing
from kiln_registry.wire.base import WireModel

router = APIRouter(prefix="/v1/keys", tags=["keys"])
Ctx = Annotated[RegistryContext, Depends(get_ctx)]
EXAMPLE_KEY: dict[str, Any] = {
    "key_id": "39f713d0a644253f04529421b9f51b9b08979d08295959c4f3990ee617f5139f",
    "algorithm": "ed25519",
    "public_key": "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c",
}


class SigningKey(WireModel):
    """One public key of the registry."""

    key_id: str = Field(
        pattern=r"^[0-9a-f]{64}$",
        description="Lowercase hex SHA-256 of the 32 raw public-key bytes; a corpus trailer's"
        " `key_id` names the key that signed it.",
    )
    algorithm: Literal["ed25519"] = Field(description="The signature algorithm (Ed25519).")
    public_key: str = Field(
        pattern=r"^[0-9a-f]{64}$",
        description="The 32 raw Ed25519 public-key bytes as lowercase hex.",
    )


class KeysResponse(WireModel):
    """The registry's corpus-signing keys (one today)."""

    keys: list[SigningKey] = Field(
        description="Keys that sign the registry's corpora.",
        json_schema_extra={"examples": [[EXAMPLE_KEY]]},
    )


def _public_keys(ctx: RegistryContext) -> KeysResponse:
    signer = signing.load_or_create_signer(signing.key_path(ctx.config.server.state_path))
    return KeysResponse.model_validate(signing.keys_document([signer.public]))


@router.get(
    "",
    operation_id="getSigningKeys",
    response_model=KeysResponse,
    responses=error_responses({}),
)
async def get_signing_keys(ctx: Ctx) -> KeysResponse:
    """The public key(s) that sign published corpora (`kiln corpus verify` checks them)."""
    return await run_in_threadpool(_public_keys, ctx)
