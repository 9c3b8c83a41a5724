"""Kafka Connect Datagen's quickstart schemas (``ksql.orders``, ``ksql.transactions``,
``ksql.pageviews``) as its producer registers them, their generator's ``arg.properties``
left out: the topics a new user tries first; and a schema no reader can parse
(:func:`nested_past_parser_depth`)."""

from typing import Any

ORDERS: dict[str, Any] = {"type": "record", "name": "orders", "namespace": "ksql", "fields": [
    {"name": "ordertime", "type": "long"}, {"name": "orderid", "type": "int"},
    {"name": "itemid", "type": "string"}, {"name": "orderunits", "type": "double"},
    {"name": "address", "type": {"type": "record", "name": "address", "fields": [
        {"name": "city", "type": "string"}, {"name": "state", "type": "string"},
        {"name": "zipcode", "type": "long"}]}}]}
TRANSACTIONS: dict[str, Any] = {
    "type": "record", "name": "transactions", "namespace": "ksql", "fields": [
        {"name": "transaction_id", "type": "long"}, {"name": "card_id", "type": "long"},
        {"name": "user_id", "type": "string"}, {"name": "purchase_id", "type": "long"},
        {"name": "store_id", "type": "int"}]}
PAGEVIEWS: dict[str, Any] = {
    "type": "record", "name": "pageviews", "namespace": "ksql", "fields": [
        {"name": "viewtime", "type": "long"}, {"name": "userid", "type": "string"},
        {"name": "pageid", "type": "string"}]}


def nested_past_parser_depth(depth: int = 1200) -> str:
    """The text of an Avro record nested ``depth`` records deep: past what Python's JSON
    parser reads (its recursion limit), as a registry may still hold it."""
    opening = "".join(f'{{"type": "record", "name": "L{k}", "fields": [{{"name": "r", "type": '
                      for k in range(depth, 0, -1))
    innermost = '{"type": "record", "name": "L0", "fields": [{"name": "x", "type": "int"}]}'
    return opening + innermost + "}]}" * depth
