"""The OpenAPI document of /v1 is valid OpenAPI 3.1 and documents every route served."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from approvald.bot.api import schemas
from approvald.bot.api.routes import Routes
from approvald.runtime.engine import Engine
from openapi_spec_validator import validate


def test_the_document_is_valid_openapi_3_1() -> None:
    doc = schemas.openapi()
    validate(doc)  # resolves every $ref too
    assert doc["openapi"] == "3.1.0"
    assert set(doc["components"]["schemas"]) >= {"CreateRequest", "ReportResult",
                                                 "RequestDocument", "ErrorBody", "Packet"}


def test_every_route_is_documented(make_engine: Any) -> None:
    engine: Engine = make_engine()
    app = web.Application()
    Routes(engine).add_to(app)
    served = {(r.method.lower(), r.resource.canonical) for r in app.router.routes()
              if r.resource is not None and r.method != "*"}
    paths = schemas.openapi()["paths"]
    documented = {(m, p) for p, ops in paths.items() for m in ops}
    assert served == documented

