"""Kafka Connect Datagen's quickstart schemas (``ksql.orders``, ``ksql.transactions``,
``ksql.pageviews``) as its producer registers them, their generator's ``arg.properties``
left out: the topics a new user tries first."""

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
