"""Orders created by the shop (topic ``pedidos-criados``, keyed by ``customer_id``)."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, ClassVar

from pydantic import AwareDatetime, Field

from kafka_ingest.contracts.base import BIGINT_MAX, EventContract, short_text


class OrderCreatedV1(EventContract):
    """An order was placed. ``total`` is money: a Decimal with 2 places, never a float.

    ``total`` may arrive as a JSON string (``"19.90"``, exact) or a JSON number; more than
    two decimal places or more than 12 integer digits is a contract violation.
    ``timestamp`` is ISO-8601 with a UTC offset; a naive timestamp is rejected.
    """

    EVENT_TYPE: ClassVar[str] = "order_created"
    VERSION: ClassVar[int] = 1
    SINK_COLUMNS: ClassVar[tuple[tuple[str, str], ...]] = (
        ("event_id", "text"),
        ("order_id", "int8"),
        ("customer_id", "text"),
        ("total", "numeric"),
        ("timestamp", "timestamptz"),
    )

    version: int = Field(default=1, ge=1, le=1)
    order_id: int = Field(ge=1, le=BIGINT_MAX)
    customer_id: short_text(64)  # type: ignore[valid-type]
    total: Annotated[Decimal, Field(max_digits=14, decimal_places=2, ge=0)]
    timestamp: AwareDatetime
