"""Put on ``PYTHONPATH`` of an ``airflow dags test`` process by the fault tests: when
``KAFKA_INGEST_TEST_FAULT`` is set (JSON), a fault is injected at a precise step of a
chunk inside the DAG's own ingest task, once (Airflow's retry, in the same process, runs
clean once the test healed the network):

    {"step": "commit", "nth": 1, "url": "http://127.0.0.1:18474", "proxy": "postgres",
     "kind": "timeout", "streams": ["downstream"], "attributes": {"timeout": 0}}

``step`` is one of ``tests.support.fault_injection.STEPS``. Without the variable this file
does nothing.
"""

from __future__ import annotations

import json
import os
import sys
import time

_SPEC = os.environ.get("KAFKA_INGEST_TEST_FAULT")

if _SPEC:
    # the repository's root (tests/chaos/dag_faults/ -> ../../..), for tests.support
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))))
    from kafka_ingest_dev.faults import Toxiproxy
    from tests.support.fault_injection import Injector

    _spec = json.loads(_SPEC)

    def _inject() -> list[str]:
        proxy = Toxiproxy(_spec["url"])
        names = [proxy.add_toxic(_spec["proxy"], _spec["kind"], stream=stream,
                                 **_spec.get("attributes", {}))
                 for stream in _spec.get("streams", ["downstream"])]
        print(f"FAULT-INJECTED {_spec['kind']} on {_spec['proxy']} at {_spec['step']} "
              f"wall={time.time():.3f}", file=sys.stderr, flush=True)
        return names

    Injector(_spec["step"], _inject, nth=int(_spec.get("nth", 1))).install(setattr)
