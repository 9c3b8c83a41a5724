"""The monitor's alerting in Airflow: each pipeline's notifiers (webhooks, Airflow notifier
classes) told of its breaches, then the task failed without retry so Airflow's own
failure alerting fires too.

No side effects at import time (the plugin manager imports every file here).
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseNotifier
from airflow.sdk.exceptions import AirflowFailException

from kafka_ingest.config import NotifierClass
from kafka_ingest.ops.monitor import Breach, post_webhook, redact_url

log = logging.getLogger(__name__)



def _build_notifier(ref: NotifierClass) -> Any:
    """Import ``ref``'s class by its dotted path and build it with its kwargs."""
    module, _, name = ref.class_path.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    notifier = cls(**ref.kwargs)
    if not callable(getattr(notifier, "notify", None)):
        raise TypeError(f"{ref.class_path} is not a notifier (it has no notify(context))")
    return notifier


def notify_breaches(pipeline: Any, breaches: Sequence[Breach],
                    context: Mapping[str, Any]) -> list[str]:
    """Tell every notifier of ``pipeline.alerts.notifiers`` about ``breaches``; return the
    notifiers that failed (each is logged; none stops the others or hides the breach).

    A webhook URL gets one POST per breach, JSON ``{pipeline, rule, message, figures}``
    with a 10 s time-out. An Airflow notifier class is built with its kwargs and called
    once with the task's context plus ``pipeline``, ``breaches`` (their dicts) and
    ``message`` (one line per breach): a ``BaseNotifier`` through its ``__call__``, which
    renders its templated fields first (``{{ message }}`` works), anything else through
    ``notify(context)``. Webhook URLs are logged without their path (it may hold a secret).
    """
    if not breaches:
        return []
    extra = {"pipeline": pipeline.name, "breaches": [b.to_dict() for b in breaches],
             "message": "\n".join(b.message for b in breaches)}
    failed = []
    for ref in pipeline.alerts.notifiers:
        target = redact_url(ref) if isinstance(ref, str) else ref.class_path
        try:
            if isinstance(ref, str):
                for breach in breaches:
                    post_webhook(ref, breach)
            else:
                notifier = _build_notifier(ref)
                call = notifier if isinstance(notifier, BaseNotifier) else notifier.notify
                call({**context, **extra})
        except Exception as exc:  # any notifier's failure is logged; the breach still fails
            log.error("%s: notifier %s failed: %s: %s", pipeline.name, target,
                      type(exc).__name__, exc)
            failed.append(target)
        else:
            log.info("%s: notifier %s told of %d breach(es)", pipeline.name, target,
                     len(breaches))
    return failed


def alert_on_breaches(pipeline: Any, breaches: Sequence[Breach],
                      context: Mapping[str, Any]) -> None:
    """:func:`alert_on_checks` of one pipeline."""
    alert_on_checks([(pipeline, breaches)], context)


def alert_on_checks(found: Sequence[tuple[Any, Sequence[Breach]]],
                    context: Mapping[str, Any], *, unknown: Sequence[str] = ()) -> None:
    """On any breach: call each breaching pipeline's notifiers, then fail the task without
    retry (the next scheduled check judges again) with a message naming each pipeline,
    rule and figures, and each pipeline whose lag was ``unknown`` (a missing topic), so
    Airflow's own failure alerting fires too."""
    lines, failed = [], []
    for pipeline, breaches in found:
        failed += notify_breaches(pipeline, breaches, context)
        lines += [f"{b.message} (figures: {json.dumps(b.figures, default=str)})"
                  for b in breaches]
    if not lines and not unknown:
        return
    note = f"; notifiers that failed: {', '.join(failed)}" if failed else ""
    text = f"{len(lines)} alert rule(s) breached: " + " | ".join(lines) if lines else ""
    if unknown:
        text += ("; " if text else "") + "lag not known: " + " | ".join(unknown)
    raise AirflowFailException(text + note)
